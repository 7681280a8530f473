"""The ports as one step each: analyse the original tree, then rewrite it."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.visiting import visit_wrapper
from migrator.codemods.tf1.analysis import LossScaleAnalyzer
from migrator.codemods.tf1.rewrite import PlanRewriter
from migrator.codemods.torch.analysis import TorchScalerAnalyzer
from migrator.codemods.torch.rewrite import TorchRewriter
from migrator.findings import Finding
from migrator.selection.keras_helpers import KerasHelper
from migrator.selection.scaler_helpers import ScalerHelper

# The metadata the port resolves on the wrapper it is given.
LOSS_SCALE_METADATA = LossScaleAnalyzer.get_inherited_dependencies()
TORCH_METADATA = TorchScalerAnalyzer.get_inherited_dependencies()


def port_loss_scale(
    wrapper: MetadataWrapper,
    path: str,
    distributed: str,
    reexports: frozenset[tuple[str, str]] = frozenset(),
    keras_helpers: frozenset[KerasHelper] = frozenset(),
    loss_scale_modules: frozenset[str] = frozenset(),
    strategy_importer: str | None = None,
    horovod_importer: Callable[[], str | None] | None = None,
) -> tuple[cst.Module, list[Finding]]:
    """Rewrite the loss-scale APIs of one file; returns the new tree and what was done or left.

    `strategy_importer`: a file of the run that builds a tf.distribute strategy and imports this
    one (migrator.selection.strategy_importers); `horovod_importer`: where a file of the run this
    one imports calls hvd.init() (migrator.selection.horovod_importers)."""
    analyzer = LossScaleAnalyzer(
        path,
        distributed,
        reexports,
        keras_helpers,
        loss_scale_modules,
        strategy_importer,
        horovod_importer,
    )
    visit_wrapper(wrapper, analyzer)
    file = analyzer.file
    if not file.edits:
        return wrapper.module, file.findings
    parents = wrapper.resolve(ParentProvider)
    rewriter = PlanRewriter(file.edits, analyzer.imports, analyzer.names, parents)
    return wrapper.module.visit(rewriter), file.findings


def port_torch(
    wrapper: MetadataWrapper,
    path: str,
    reexports: frozenset[tuple[str, str]] = frozenset(),
    scaler_attrs: frozenset[str] = frozenset(),
    scaler_helpers: frozenset[ScalerHelper] = frozenset(),
) -> tuple[cst.Module, list[Finding]]:
    """Rewrite torch's GradScaler uses in one file; returns the new tree and the findings."""
    analyzer = TorchScalerAnalyzer(path, reexports, scaler_attrs, scaler_helpers)
    visit_wrapper(wrapper, analyzer)
    if not analyzer.plan:
        return wrapper.module, analyzer.findings
    parents = wrapper.resolve(ParentProvider)
    return wrapper.module.visit(TorchRewriter(analyzer.plan, parents)), analyzer.findings
