"""Which Keras this process runs, decided once, without importing the Keras it does not run.

TensorFlow 2.6-2.15 ships Keras 2 as ``tf.keras``; 2.16 and later ship Keras 3, unless
``TF_USE_LEGACY_KERAS`` is set (TensorFlow reads it when ``tf.keras`` is first touched) and the
``tf_keras`` package is installed, which then *is* ``tf.keras``. A Keras 2 process must never
import ``keras.src`` (Keras 3's internals): on TF 2.6.5 there is no such package, and on TF 2.21
importing it next to tf_keras mixes two Keras in one model.
"""

from __future__ import annotations

import os
from typing import Any

_LEGACY_VALUES = ("true", "True", "1")  # the spellings TensorFlow itself accepts


class KerasVersionError(ImportError):
    """The Keras front-end cannot run on this TensorFlow/Keras combination."""


def _tf_version() -> tuple[int, int]:
    import tensorflow as tf

    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def legacy_keras_requested() -> bool:
    """Whether ``TF_USE_LEGACY_KERAS`` asks TensorFlow for tf_keras as ``tf.keras``."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in _LEGACY_VALUES


def keras_generation() -> int:
    """2 or 3: the Keras whose optimizers this process's scripts build."""
    version = _tf_version()
    if version < (2, 0):
        raise KerasVersionError(
            f"npu_lossscale.keras needs TensorFlow 2.x; this is TensorFlow "
            f"{version[0]}.{version[1]}, whose Keras has no LossScaleOptimizer. On TF 1.15 use "
            "the TF1 graph front-end (from npu_lossscale import NPULossScaleOptimizer, "
            "ExponentialUpdateLossScaleManager); for Keras 2 install TensorFlow 2.6.5 "
            "(pip install tensorflow-cpu==2.6.5 'protobuf<3.21' on Python 3.7-3.9)"
        )
    if version < (2, 16) or legacy_keras_requested():
        return 2
    return 3


def keras2() -> Any:
    """The Keras 2 namespace this process uses: ``tf.keras`` up to TF 2.15, else tf_keras."""
    version = _tf_version()
    if version < (2, 16):
        import tensorflow as tf

        return tf.keras
    try:
        import tf_keras
    except ImportError as error:
        raise KerasVersionError(
            f"Keras 2 on TensorFlow {version[0]}.{version[1]} is the tf_keras package, which is "
            f"not installed: pip install 'tf_keras~={version[0]}.{version[1]}.0' (then "
            "TF_USE_LEGACY_KERAS=1 makes it tf.keras). For Keras 3 leave TF_USE_LEGACY_KERAS "
            "unset and use keras.optimizers"
        ) from error
    return tf_keras
