"""The Keras front-end: loss scaling for Keras 3 / TF 2.x scripts (model.fit and custom loops).

`LossScaleOptimizer` stands in for `keras.mixed_precision.LossScaleOptimizer` (and accepts the
tf_keras 2 spellings scripts were written with), with the NPU's overflow modes, the Ascend
adapter's update rule and a cross-replica decision under tf.distribute.
"""

from npu_lossscale.keras.optimizer import LossScaleOptimizer

__all__ = ["LossScaleOptimizer"]
