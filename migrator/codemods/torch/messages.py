"""The longer texts the PyTorch port reports, apart from the analysis that decides when.

Templates (`str.format` fields, and one function choosing between two), so the analysis reads
as decisions and this file as what a user is told.
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

# A name a try/except or if/else import binds to more than one scaler: the tool cannot tell which
# runs. Where one is torch-npu's, the file already picks it on Ascend (mmcv's hooks).
AMBIGUOUS_SCALER = (
    "`{code}` is bound to more than one thing here ({bindings}; a try/except import?), so the "
    "tool cannot tell which scaler it is; port it to {ported} by hand"
)
AMBIGUOUS_WITH_NPU = (
    "`{code}` is bound to more than one scaler here ({bindings}), one of them torch-npu's "
    "(`{npu}`), which the file presumably picks on Ascend, so it is left as it is; {ported} can "
    "replace them (same methods, plus overflow modes and the all-reduced overflow decision) if "
    "you port it by hand"
)


def ambiguous(what: str, bound: list[str], npu: list[str], ported: str) -> str:
    """Why a name bound to several things is left: each binding named, and torch-npu's said to
    be the one Ascend runs where it is among them."""
    bindings = ", ".join(f"`{name}`" for name in bound)
    if npu:
        return AMBIGUOUS_WITH_NPU.format(code=what, bindings=bindings, npu=npu[0], ported=ported)
    return AMBIGUOUS_SCALER.format(code=what, bindings=bindings, ported=ported)
