"""The TF1-graph front-end: drop-in for the Ascend TensorFlow adapter's loss-scale classes.

Works in tf.compat.v1 graphs (sess.run, MonitoredTrainingSession) and, through
get_scaled_loss / get_unscaled_gradients, in eager and tf.function custom loops. Scripts import
these names from the package root (`from npu_lossscale import NPULossScaleOptimizer`), which loads
this module only when one of them is first used.
"""

from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf.hooks import LossScaleLoggingHook
from npu_lossscale.tf.kernels import register_ops
from npu_lossscale.tf.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)
from npu_lossscale.tf.optimizer import NPULossScaleOptimizer

__all__ = [
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "LossScaleLoggingHook",
    "LossScaleManager",
    "NPULossScaleOptimizer",
    "OverflowMode",
    "register_ops",
]
