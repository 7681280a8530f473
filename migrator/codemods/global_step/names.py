"""Name questions the global-step move asks, answered through libcst's scope metadata.

A script may spell TensorFlow `tf`, `tf1` or `tensorflow.compat.v1`, and import optimizers under
any alias; comparing text would miss those and match look-alikes, so every question here goes
through the qualified names libcst resolves for the expression.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameSource

from migrator import registry

QualifiedNames = Callable[[cst.CSTNode], "set[QualifiedName]"]

_TF_PREFIXES = ("tensorflow.compat.v1.", "tensorflow.compat.v2.", "tensorflow.")

# Optimizers that apply the inner optimizer only when the gradients are finite; the move is only
# needed (and only correct) where one of these decides whether a step happens.
_LOSS_SCALE_SUFFIXES = (
    f"mixed_precision.{registry.LOSS_SCALE_OPTIMIZER}",
    f"mixed_precision.experimental.{registry.LOSS_SCALE_OPTIMIZER}",
    registry.TF_MIXED_PRECISION_OPTIMIZER,
    registry.TF_GRAPH_REWRITE,
)
_NPU_LOSS_SCALE = registry.NPU_OPTIMIZER
_WRAPPER_SUFFIXES = ("DistributedOptimizer", "SyncReplicasOptimizer", "CrossShardOptimizer")


def tf_tail(names: set[QualifiedName]) -> str | None:
    """`tf.math.is_finite` -> "math.is_finite" when the expression is a TensorFlow name (also
    where a try/except imports it as `tensorflow.compat.v1` or `tensorflow`)."""
    tails = {_tail(qn) for qn in names}
    return tails.pop() if len(tails) == 1 else None  # one name, or imports of one API


def _tail(qn: QualifiedName) -> str | None:
    if qn.source is not QualifiedNameSource.IMPORT:
        return None
    for prefix in _TF_PREFIXES:
        if qn.name.startswith(prefix):
            return qn.name[len(prefix) :]
    return None


def is_tf_function(names: set[QualifiedName], *leaves: str) -> bool:
    """True when the expression is `tf.<...>.<leaf>` for one of the given leaf names."""
    tail = tf_tail(names)
    return tail is not None and tail.rsplit(".", 1)[-1] in leaves


def is_loss_scale_optimizer(names: set[QualifiedName]) -> bool:
    for qn in names:
        if qn.name.rsplit(".", 1)[-1] == _NPU_LOSS_SCALE:
            return True
        if qn.source is QualifiedNameSource.IMPORT and qn.name.endswith(_LOSS_SCALE_SUFFIXES):
            return True
    return False


def is_optimizer_wrapper(names: set[QualifiedName]) -> bool:
    """Optimizers that wrap another one passed first and forward `global_step` to it."""
    return is_loss_scale_optimizer(names) or any(
        qn.name.endswith(_WRAPPER_SUFFIXES) for qn in names
    )


def is_builtin_optimizer(names: set[QualifiedName]) -> bool:
    """`tf.train.XOptimizer` (and compat.v1 spellings, and the same classes imported from where
    they are defined, `tensorflow.python.training.adam`): these advance global_step themselves.

    Keras optimizers are deliberately excluded: their apply_gradients has no global_step.
    """
    tail = tf_tail(names)
    return (
        tail is not None
        and tail.startswith(("train.", "python.training."))
        and tail.endswith("Optimizer")
    )


def single_name(names: set[QualifiedName]) -> QualifiedName | None:
    return next(iter(names)) if len(names) == 1 else None
