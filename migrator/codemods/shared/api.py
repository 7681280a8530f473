"""Which TensorFlow loss-scale names exist and what each one becomes on the NPU.

Names are compared after resolving them by scope (libcst's scope analysis), so an alias,
a `from ... import`, `tensorflow.compat.v1` or a function-local import all land on one canonical
spelling here; nothing in the migrator matches the text `tf.`. The spellings themselves are
migrator.registry's, which the earlier stages' triggers are derived from.
"""

from __future__ import annotations

import enum

from migrator import registry

LIBRARY = "npu_lossscale"
FIXED = registry.TF_FIXED_MANAGER
DYNAMIC = registry.TF_DYNAMIC_MANAGER
OPTIMIZER = registry.NPU_OPTIMIZER
# The Keras front-end's class. Targets are named by their import path relative to the package
# (`keras.LossScaleOptimizer`), so that it never collides with a root class of the same name.
KERAS_MODULE = LIBRARY + ".keras"
KERAS_OPTIMIZER = "keras.LossScaleOptimizer"

CONTRIB = registry.TF_CONTRIB
_CONTRIB_MODULES = registry.TF_CONTRIB_MODULES
# TensorFlow's own (non-contrib) homes of the v1 loss-scale API, after dropping `compat.v1`.
_CORE_MODULES = registry.TF_CORE_MODULES
_KERAS_MODULES = registry.KERAS_MODULES
_VENDOR_PREFIXES = registry.VENDOR_PREFIXES


class Kind(enum.Enum):
    """What a resolved name is, which decides the rule that handles it."""

    CONTRIB_FIXED = "contrib-fixed"
    CONTRIB_DYNAMIC = "contrib-dynamic"
    CONTRIB_OPTIMIZER = "contrib-optimizer"
    TF_DYNAMIC = "tf-dynamic"
    TF_FIXED = "tf-fixed"
    TF_OPTIMIZER = "tf-optimizer"
    GRAPH_REWRITE = "graph-rewrite"
    UNPORTED = "unported"
    CONTRIB_MODULE = "contrib-module"
    PORTED_DYNAMIC = "ported-dynamic"
    KERAS_OPTIMIZER = "keras-optimizer"
    KERAS_EXPERIMENTAL = "keras-experimental"


# Homes of Keras's LossScaleOptimizer -> the order of its positional parameters after the inner
# optimizer: tf_keras (Keras 2) takes `dynamic` second, Keras 3 `initial_scale`; `tf.keras` and
# `keras` were either, depending on the installed version ("either": decided per call).
KERAS_2_ORDER = ("dynamic", "initial_scale", "dynamic_growth_steps")
KERAS_3_ORDER = ("initial_scale", "dynamic_growth_steps")
_KERAS_HOMES: dict[str, tuple[str, ...] | None] = {
    **dict.fromkeys(registry.KERAS_EITHER_HOMES),
    **dict.fromkeys(registry.KERAS_2_HOMES, KERAS_2_ORDER),
    **dict.fromkeys(registry.KERAS_3_HOMES, KERAS_3_ORDER),
}
# TF 2.1-2.3's `LossScaleOptimizer(optimizer, loss_scale)`.
_KERAS_EXPERIMENTAL_HOMES = registry.KERAS_EXPERIMENTAL_HOMES


# The hops to one of TensorFlow's API versions: `import tensorflow.compat.v2 as tf` is how the
# TF 2.0-2.3 official models (BERT, ResNet) spell TensorFlow, and its names are TensorFlow's own.
_VERSION_HOPS = ("tensorflow.compat.v1", "tensorflow.compat.v2", "tensorflow._api.v1")


def canonical(qualified: str) -> str:
    """Drop the `compat.v1` (or `compat.v2`) hop so every spelling of one API compares equal;
    also a repeated one (`tf.compat.v1.train.X` where `tf` is `tensorflow.compat.v1`, which
    runs)."""
    for hop in _VERSION_HOPS:
        if qualified.startswith(hop + "."):
            return canonical("tensorflow." + qualified[len(hop) + 1 :])
    if qualified in _VERSION_HOPS[:2]:
        return "tensorflow"
    return qualified


def _split(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


def classify(name: str) -> Kind | None:
    """The kind of a canonical qualified name, or None when it is nothing the migrator handles."""
    if name == CONTRIB or name == "tensorflow.contrib.mixed_precision.python":
        return Kind.CONTRIB_MODULE
    module, leaf = _split(name)
    if module in _CONTRIB_MODULES:
        return {
            FIXED: Kind.CONTRIB_FIXED,
            DYNAMIC: Kind.CONTRIB_DYNAMIC,
            registry.LOSS_SCALE_OPTIMIZER: Kind.CONTRIB_OPTIMIZER,
        }.get(leaf, Kind.UNPORTED)
    if module in _CORE_MODULES:
        kind = {
            registry.TF_DYNAMIC_LOSS_SCALE_CLASS: Kind.TF_DYNAMIC,
            registry.TF_FIXED_LOSS_SCALE_CLASS: Kind.TF_FIXED,
            registry.TF_MIXED_PRECISION_OPTIMIZER: Kind.TF_OPTIMIZER,
            registry.TF_GRAPH_REWRITE: Kind.GRAPH_REWRITE,
        }.get(leaf)
        if kind is not None:
            return kind
    if leaf == registry.LOSS_SCALE_OPTIMIZER and module in _KERAS_HOMES:
        return Kind.KERAS_OPTIMIZER
    if leaf == registry.LOSS_SCALE_OPTIMIZER and module in _KERAS_EXPERIMENTAL_HOMES:
        return Kind.KERAS_EXPERIMENTAL
    if module in _CORE_MODULES + _KERAS_MODULES and "LossScale" in leaf:
        return Kind.UNPORTED
    if name.startswith(CONTRIB + "."):
        return Kind.UNPORTED
    if leaf == DYNAMIC and (module == LIBRARY or module.startswith(_VENDOR_PREFIXES)):
        return Kind.PORTED_DYNAMIC
    return None


# Other libraries' TensorFlow loss-scale optimizers, which the port leaves as they are: each
# checks for inf/NaN only (SparseOperationKit's subclasses TF 1.15's experimental Keras class).
# Module prefix -> what the warning calls it.
_FOREIGN_LOSS_SCALE = {
    "sparse_operation_kit.": "HugeCTR SparseOperationKit's",
}


def foreign_loss_scale(name: str) -> str | None:
    """What another library's look-alike LossScaleOptimizer is, or None: a canonical name whose
    class is a LossScaleOptimizer from a library the port does not rewrite."""
    if not name.rpartition(".")[2].endswith("LossScaleOptimizer"):
        return None
    return next((what for p, what in _FOREIGN_LOSS_SCALE.items() if name.startswith(p)), None)


# How the note on a ported graph rewrite begins (the TF1 and the Keras port each go on in their
# own words); a file left as it is (on npu_bridge) drops the note by it.
PORTED_REWRITE_NOTE = "review by hand: only the loss scaling was ported"

# Where Keras sets its global dtype policy. Under "mixed_float16", model.compile() wraps a plain
# optimizer in Keras's own LossScaleOptimizer (any LossScaleOptimizer subclass is left alone).
_POLICY_HOMES = registry.POLICY_MIXED_PRECISION_HOMES + registry.POLICY_CONFIG_HOMES
_POLICY_SETTERS = registry.POLICY_SETTERS
_POLICY_CLASSES = registry.POLICY_CLASSES


def _policy_home(module: str) -> bool:
    """Keras's own homes, also reached through a project that re-exports keras
    (`from keras_cv.backend import keras`: `keras_cv.backend.keras.mixed_precision`)."""
    return module in _POLICY_HOMES or any(
        module.endswith("." + home) for home in _POLICY_HOMES if home.startswith("keras.")
    )


def is_policy_setter(name: str) -> bool:
    module, leaf = _split(name)
    return _policy_home(module) and leaf in _POLICY_SETTERS


def is_policy_class(name: str) -> bool:
    module, leaf = _split(name)
    keras_root = module == "keras" or module.endswith(".keras")
    return (_policy_home(module) or keras_root) and leaf in _POLICY_CLASSES


def keras_order(name: str) -> tuple[str, ...] | None:
    """The positional parameters after the inner optimizer for a Keras LossScaleOptimizer name;
    None where the installed Keras decides (`tf.keras`, `keras`)."""
    return _KERAS_HOMES.get(_split(name)[0])


def is_keras_mixed_precision(name: str) -> bool:
    """A Keras mixed-precision module or its LossScaleOptimizer: imports the Keras port may drop
    once nothing uses them."""
    if classify(name) in (Kind.KERAS_OPTIMIZER, Kind.KERAS_EXPERIMENTAL):
        return True
    return name in _KERAS_EXPERIMENTAL_HOMES or (
        name in _KERAS_HOMES and name.endswith("mixed_precision")
    )


def target_module(target: str) -> str:
    """The module a port target is imported from (`npu_lossscale` or `npu_lossscale.keras`)."""
    package, _, _ = target.rpartition(".")
    return f"{LIBRARY}.{package}" if package else LIBRARY


def target_class(target: str) -> str:
    return target.rpartition(".")[2]


def is_contrib_module(name: str) -> bool:
    """True for an import of the contrib mixed-precision package or anything inside it."""
    return name == CONTRIB or name.startswith(CONTRIB + ".")


def is_vendor_module(name: str) -> bool:
    """The vendor adapter (`npu_bridge`): a file importing it was ported already."""
    return name == "npu_bridge" or name.startswith("npu_bridge.")


# Where Keras optimizers live: tf.optimizers is Keras in TF 2, tf_keras is Keras 2 standalone,
# TensorFlow Addons' LAMB/AdamW are Keras optimizers too.
_KERAS_OPTIMIZER_PREFIXES = (
    "tensorflow.keras.",
    "tensorflow.optimizers.",
    "tensorflow.python.keras.",
    "keras.",
    "tf_keras.",
    "tensorflow_addons.",
    "horovod.tensorflow.keras.",
    "horovod.keras.",
)
# Where tf.compat.v1 optimizers live (canonical spelling, `compat.v1` dropped).
_V1_OPTIMIZER_PREFIXES = (
    "tensorflow.train.",
    "tensorflow.contrib.opt.",
    "tensorflow.python.training.",
)


def optimizer_flavour(name: str) -> str | None:
    """'keras' or 'v1' for a canonical optimizer constructor or base class name, else None."""
    if name.startswith(_KERAS_OPTIMIZER_PREFIXES):
        return "keras"
    if name.startswith(_V1_OPTIMIZER_PREFIXES) and name.endswith("Optimizer"):
        return "v1"
    return None


# Keras optimizers of the Keras 2 generation, which Keras 3 (and npu_lossscale.keras) cannot wrap.
_KERAS_2_OPTIMIZER_PREFIXES = (
    "tf_keras.",
    "tensorflow.python.keras.",
    "tensorflow_addons.",
    "tensorflow.keras.optimizers.legacy.",
    "tensorflow.keras.optimizers.experimental.",
    "tensorflow.optimizers.legacy.",
    "tensorflow.optimizers.experimental.",
    "keras.optimizers.legacy.",
    "keras.optimizers.experimental.",
)


def is_keras_2_optimizer(name: str) -> bool:
    """A tf_keras / `optimizers.legacy` / TensorFlow Addons optimizer constructor or base."""
    return name.startswith(_KERAS_2_OPTIMIZER_PREFIXES)


def wraps_optimizer(name: str) -> bool:
    """Calls whose result is their first argument, wrapped: the flavour is that argument's."""
    wrappers = (
        Kind.TF_OPTIMIZER,
        Kind.GRAPH_REWRITE,
        Kind.CONTRIB_OPTIMIZER,
        Kind.KERAS_OPTIMIZER,
        Kind.KERAS_EXPERIMENTAL,
    )
    return classify(name) in wrappers or (
        is_horovod_module(name) and name.endswith(".DistributedOptimizer")
    )


def keeps_optimizer_kind(name: str) -> bool:
    """A call that takes an optimizer first and returns one of the same kind: the wrappers above,
    and TF's and Horovod's other `...Optimizer` wrappers of a v1 optimizer whose own kind is
    unknown here (tf.tpu.CrossShardOptimizer)."""
    module, _, leaf = name.rpartition(".")
    return wraps_optimizer(name) or (
        leaf.endswith("Optimizer") and module.startswith(("tensorflow.", "horovod."))
    )


# Symbols only TF 1's API has (canonical: `compat.v1` dropped): a file naming one runs the graph
# world, whose optimizers are tf.compat.v1 ones.
_TF1_SIGNALS = frozenset(
    f"tensorflow.{leaf}"
    for leaf in (
        "Session",
        "InteractiveSession",
        "placeholder",
        "get_variable",
        "variable_scope",
        "global_variables_initializer",
        "ConfigProto",
        "flags",
        "app",
        "logging",
        "layers",
        "estimator",
        "train.Scaffold",
        "train.MonitoredTrainingSession",
        "train.get_global_step",
        "train.get_or_create_global_step",
    )
)


def is_tf1_signal(name: str) -> bool:
    """A TF 1-only symbol, tf.contrib, or a tf.compat.v1 optimizer."""
    module = ".".join(name.split(".")[:2])
    return (
        name in _TF1_SIGNALS
        or module in _TF1_SIGNALS
        or name.startswith("tensorflow.contrib")
        or optimizer_flavour(name) == "v1"
    )


def mentions_keras(name: str) -> bool:
    return name.startswith(_KERAS_OPTIMIZER_PREFIXES) or name in ("keras", "tensorflow.keras")


def is_horovod_module(name: str) -> bool:
    return name == "horovod" or name.startswith("horovod.")


def is_distribute_strategy(name: str) -> bool:
    """A tf.distribute (or contrib.distribute) strategy: the script trains on several workers."""
    module, leaf = _split(name)
    return leaf.endswith("Strategy") and (
        module.startswith(("tensorflow.distribute", "tensorflow.contrib.distribute"))
    )


# TensorFlow's own defaults for DynamicLossScale(initial_loss_scale, increment_period, multiplier).
TF_DYNAMIC_DEFAULTS = {
    "initial_loss_scale": "2 ** 15",
    "increment_period": "2000",
    "multiplier": "2",
}
