"""The PyTorch front-end: loss scaling for torch.amp scripts, with the NPU's overflow modes.

`GradScaler` stands in for `torch.amp.GradScaler` (and torch.cuda.amp's, and torch-npu's), with
both overflow modes, the Ascend adapter's rule (from_manager) and a decision every rank shares.
Importing this package never imports TensorFlow, nor torch-npu (looked up only on an Ascend host).
"""

from npu_lossscale.modes import OverflowMode
from npu_lossscale.torch.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
)
from npu_lossscale.torch.scaler import GradScaler

__all__ = [
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "GradScaler",
    "OverflowMode",
]
