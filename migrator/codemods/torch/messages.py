"""The longer texts the PyTorch port reports, apart from the analysis that decides when.

Plain templates (`str.format` fields), so the analysis reads as decisions and this file as what a
user is told.
"""

from __future__ import annotations

TRANSFER_NOTE = (
    "only the scaler was ported: device strings ('cuda', .cuda(), .to('cuda')) and autocast stay "
    "as written; on Ascend, torch-npu maps them to the NPU when the entry script starts with "
    "`import torch_npu` and `from torch_npu.contrib import transfer_to_npu`"
)

# Another library's wrapper of torch's own GradScaler (timm's NativeScaler): on Ascend it is
# torch-npu's scaler only where transfer_to_npu maps it, never this port's.
WRAPPED_SCALER = (
    "`{code}` ({what}) is left as it is: it builds torch's own GradScaler inside {library}, "
    "which the port does not reach, so this loop gets neither {ported}'s overflow modes nor its "
    "all-reduced overflow decision; build the loop's scaler from {ported} (the wrapper only "
    "calls scale, unscale_ before clipping, step and update), or port the library's file too"
)

# Another library's own loss scaling (apex).
FOREIGN_SCALING = (
    "`{code}` ({what}) is left as it is: its overflow check looks for inf/NaN only, so on an "
    "Ascend NPU in saturation mode, where an overflow is clamped to the fp16 maximum (65504), an "
    "overflowed step is applied; move the loop to torch.amp autocast with {ported} (both "
    "overflow modes), or run in INF/NAN mode"
)
