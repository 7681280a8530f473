"""Is the inner optimizer one the running Keras can train?  One error at construction if not.

A process runs one Keras (``select``): Keras 2 (TF 2.6-2.15's ``tf.keras``, tf_keras) or
Keras 3. An optimizer of the other one fails deep inside the first step otherwise (an
AttributeError on a method the other Keras does not have), so each class recognises the other
Keras's optimizers -- only through modules the script has already imported, never importing a
Keras itself -- and says what was found and what to change.
"""

from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf

from npu_lossscale.keras.select import keras_generation, legacy_keras_requested


def _describe(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__name__}"


def is_keras3_optimizer(value: object) -> bool:
    """A Keras 3 optimizer, judged by the keras package already imported (if it is Keras 3)."""
    keras = sys.modules.get("keras")
    version = str(getattr(keras, "__version__", ""))
    if keras is None or not version.startswith("3"):
        return False
    return isinstance(value, keras.optimizers.Optimizer)


def is_keras2_optimizer(value: object) -> bool:
    """A Keras 2 optimizer (tf_keras's classic or newer ones, or Keras 2.x's), judged by the
    Keras 2 modules already imported."""
    for name in ("tf_keras", "keras"):
        module = sys.modules.get(name)
        version = str(getattr(module, "__version__", ""))
        if module is None or not version.startswith("2"):
            continue
        optimizers = module.optimizers
        kinds = [optimizers.Optimizer]
        legacy = getattr(optimizers, "legacy", None)
        if legacy is not None:
            kinds.append(legacy.Optimizer)
        if isinstance(value, tuple(kinds)):
            return True
    return False


def _tf1_hint(value: object) -> str:
    if isinstance(value, tf.compat.v1.train.Optimizer):
        return (
            " It is a tf.compat.v1 optimizer: wrap it in npu_lossscale.NPULossScaleOptimizer "
            "(the TF1 graph front-end), or build a Keras optimizer."
        )
    return ""


def check_keras2_inner(inner_optimizer: object, keras: Any) -> None:
    """TypeError (Keras 2's own type for it) unless ``inner_optimizer`` is a Keras 2 optimizer."""
    legacy = getattr(keras.optimizers, "legacy", None)
    kinds = (keras.optimizers.Optimizer,) + ((legacy.Optimizer,) if legacy is not None else ())
    if isinstance(inner_optimizer, kinds):
        return
    bundled = type(inner_optimizer).__module__.startswith("tensorflow.python.keras.")
    if bundled:
        raise TypeError(
            '"inner_optimizer" must be an instance of `tf.keras.optimizers.Optimizer`, but got: '
            f'{inner_optimizer}. Please make sure "inner_optimizer" is not an instance of '
            "`tensorflow.python.keras.optimizers`, which is the legacy keras code bundled with "
            "TensorFlow: build it with the tf.keras public API (tf.keras.optimizers.SGD)."
        )
    if is_keras3_optimizer(inner_optimizer):
        version = ".".join(tf.__version__.split(".")[:2])
        if legacy_keras_requested():
            found = "npu_lossscale.keras.LossScaleOptimizer resolved to its Keras 2 class here "
            found += "(TF_USE_LEGACY_KERAS is set)"
        elif keras_generation() == 2:
            found = "npu_lossscale.keras.LossScaleOptimizer resolved to its Keras 2 class here "
            found += f"(TensorFlow {version}'s tf.keras is Keras 2)"
        else:  # the Keras 2 class named directly, in a Keras 3 process
            found = (
                "npu_lossscale.keras.keras2.LossScaleOptimizer (Keras 2's class) was named here, "
                f"but TensorFlow {version}'s tf.keras is Keras 3 (TF_USE_LEGACY_KERAS is not set)"
            )
        raise TypeError(
            f"{found}, and inner_optimizer is a Keras 3 optimizer "
            f"({_describe(inner_optimizer)}). Build the optimizer with Keras 2 (tf.keras with "
            "TF_USE_LEGACY_KERAS=1 set before TensorFlow is imported, or tf_keras), or run Keras "
            "3: unset TF_USE_LEGACY_KERAS before TensorFlow is imported (TF 2.16+), or import "
            "npu_lossscale.keras.optimizer.LossScaleOptimizer for Keras 3 explicitly."
        )
    kinds_named = "`tf.keras.optimizers.Optimizer`"
    if legacy is not None:
        kinds_named += " or `tf.keras.optimizers.experimental.Optimizer`"
    raise TypeError(
        f'"inner_optimizer" must be an instance of {kinds_named}, but got: {inner_optimizer}. '
        f"(Keras {keras.__version__}){_tf1_hint(inner_optimizer)}"
    )


def keras3_inner_error(inner_optimizer: object) -> str:
    """Why a Keras 3 loss-scale optimizer cannot take ``inner_optimizer``: the message."""
    if is_keras2_optimizer(inner_optimizer):
        return (
            "npu_lossscale.keras.LossScaleOptimizer resolved to its Keras 3 class here, but "
            f"inner_optimizer is a Keras 2 optimizer ({_describe(inner_optimizer)}). For Keras 2 "
            "(tf_keras) set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported, so that "
            "npu_lossscale.keras picks its Keras 2 class, or import "
            "npu_lossscale.keras.keras2.LossScaleOptimizer explicitly; for Keras 3 build the "
            "optimizer with keras.optimizers."
        )
    return (
        "inner_optimizer must be a keras.optimizers.Optimizer (Keras 3); got "
        f"{inner_optimizer!r}.{_tf1_hint(inner_optimizer)}"
    )


EXTRA_DEFAULTS = {
    "dynamic": True,
    "overflow_mode": "auto",
    "is_distributed": None,
    "decr_every_n_nan_or_inf": 1,
    "decr_ratio": 0.5,
    "incr_ratio": 2.0,
    "min_loss_scale": 1.0,
    "max_loss_scale": None,
    "max_skipped_steps_at_floor": None,
}
"""Our keyword-only extras and their defaults (shared by both Keras classes)."""


def extras_config(values: dict) -> dict:
    """The extras that differ from their defaults: a config written with the defaults is the
    stock class's own config, so stock Keras (and tools that rebuild the stock class from it,
    such as tf_keras's convert_to_legacy_optimizer) can read it."""
    return {k: v for k, v in values.items() if k in EXTRA_DEFAULTS and EXTRA_DEFAULTS[k] != v}


ARGUMENT_NAMES = {"init_loss_scale": "initial_scale", "incr_every_n_steps": "dynamic_growth_steps"}
"""Both Keras classes' spellings of the rule's arguments: errors name what the user wrote, and
``from_manager`` passes a manager's rule under them (npu_lossscale.rule.manager_keywords)."""
