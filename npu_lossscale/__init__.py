"""Loss scaling for Ascend NPUs, drop-in for the Ascend TensorFlow adapter's classes of that name.

One import line is all a ported script changes; everything else reads as in the vendor's guide.
"""

from npu_lossscale.hooks import LossScaleLoggingHook
from npu_lossscale.kernels import register_ops
from npu_lossscale.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)
from npu_lossscale.modes import OverflowMode
from npu_lossscale.optimizer import NPULossScaleOptimizer

__all__ = [
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "LossScaleLoggingHook",
    "LossScaleManager",
    "NPULossScaleOptimizer",
    "OverflowMode",
    "register_ops",
]
__version__ = "0.1.0"
