"""`--add-loss-scale`: give loss scaling to a script that trains without it.

The vendor's guide tells users whose GPU script has no loss scaling to wrap their optimizer in
`NPULossScaleOptimizer(opt, manager)` by hand. This codemod does that wrapping in the spelling of
the pre-TF2 contrib API (`LossScaleOptimizer`, `ExponentialUpdateLossScaleManager`,
`FixedLossScaleManager`, imported from `tensorflow.contrib.mixed_precision`), and the ordinary
port then runs over the result exactly as over a script that had scaled its loss on the GPU: one
place decides `is_distributed`, rewrites the imports, and moves the global step. So a script
with and without its own loss scaling come out of the tool the same way.

Only what provably is a tf.compat.v1 optimizer is wrapped (a Keras optimizer in that class raises
ValueError at start-up); gradients from `tf.gradients(loss, vars)` that feed the wrapped
optimizer's `apply_gradients` are taken from its `compute_gradients` instead, or the loss would
never be scaled. Everything else is reported, never guessed.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrator.codemods.add_loss_scale.finder import walk
from migrator.codemods.add_loss_scale.planner import MANUAL, RULE, UNSCALED, Planner
from migrator.codemods.add_loss_scale.rewrite import Rewriter, with_import
from migrator.findings import Finding
from migrator.selection.prefilter import LOSS_SCALE_TRIGGERS, might_need_loss_scale_added

__all__ = ["MANUAL", "RULE", "UNSCALED", "add_loss_scale"]


def add_loss_scale(
    module: cst.Module, source: bytes, path: str, choice: str
) -> tuple[cst.Module, list[Finding]]:
    """Wrap the file's tf.compat.v1 optimizers; the module unchanged when there is nothing to do.

    A file that mentions any loss-scale API already scales its loss (or is ported already): the
    ordinary port handles it, and wrapping again would scale twice. Only code counts: a name
    in a comment, a docstring or a string (a commented-out `tf.keras` line, a
    `params['mixed_precision']` key) decides nothing; the byte gate before only over-selects.
    """
    if not might_need_loss_scale_added(source):
        return module, []
    spelled = _code_names(module)
    if any(t.decode() in name for t in LOSS_SCALE_TRIGGERS for name in spelled):
        return module, []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    planner = Planner(wrapper, path, choice, keras=any("keras" in name for name in spelled))
    wrapper.visit(planner.finder)
    if not planner.wraps:
        return module, planner.findings
    rewritten = wrapper.module.visit(Rewriter(planner))
    return with_import(rewritten, planner.manager_class), planner.findings


def _code_names(module: cst.Module) -> set[str]:
    """Every identifier the code spells: names, attributes, keywords, imported names."""
    return {node.value for node in walk(module) if isinstance(node, cst.Name)}
