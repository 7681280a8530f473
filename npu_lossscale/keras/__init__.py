"""The Keras front-end: loss scaling for TF 2.x Keras scripts (model.fit and custom loops).

`LossScaleOptimizer` is the class for the Keras this process runs: Keras 2's signature and
behaviour on TF 2.6-2.15's ``tf.keras`` and on ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``), in
``npu_lossscale.keras.keras2``; Keras 3's on TF 2.16+, in ``npu_lossscale.keras.optimizer``.
Both have the NPU's overflow modes, the Ascend adapter's update rule and a cross-replica
decision under tf.distribute. The name is resolved on first use, so a Keras 2 process never
imports Keras 3 (and the reverse).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LossScaleOptimizer"]


def __getattr__(name: str) -> Any:
    if name == "LossScaleOptimizer":
        from npu_lossscale.keras.select import keras_generation

        module = "keras2" if keras_generation() == 2 else "optimizer"
        value = importlib.import_module(f"npu_lossscale.keras.{module}").LossScaleOptimizer
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'npu_lossscale.keras' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
