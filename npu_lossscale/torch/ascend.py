"""Hooks into torch-npu (Ascend's PyTorch adapter), used only on an Ascend host with a device.

torch-npu is optional and never installed where CANN is absent: there, importing it breaks even
`import torch`. So nothing here imports it at module load; `torch_npu()` looks it up with
importlib.util.find_spec, imports it only when CANN is present, and answers None on any trouble.
Off an Ascend host every function here is a no-op path, which is also why this module is
deliberately small: it cannot be tested here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import torch

from npu_lossscale.modes import OverflowMode

# Where CANN says it is installed (set by its set_env.sh), and its default location.
_CANN_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
_CANN_DEFAULT_DIR = "/usr/local/Ascend"


def _cann_present() -> bool:
    return any(os.environ.get(v) for v in _CANN_ENV_VARS) or os.path.isdir(_CANN_DEFAULT_DIR)


@functools.cache
def torch_npu() -> ModuleType | None:
    """The torch_npu module when this is an Ascend host with a usable device, else None."""
    if importlib.util.find_spec("torch_npu") is None or not _cann_present():
        return None
    try:
        module = importlib.import_module("torch_npu")
        if not torch.npu.is_available():  # torch.npu exists once torch_npu is imported
            return None
    except Exception:  # a broken install or runtime means "no device", not a crash
        return None
    return module


def device_overflow_mode() -> OverflowMode | None:
    """The mode the NPU runs in, as torch-npu reports it; None off an Ascend host."""
    module = torch_npu()
    if module is None:
        return None
    try:
        inf_nan = module.npu.utils.is_support_inf_nan()
    except Exception:
        return None
    return OverflowMode.INF_NAN if inf_nan else OverflowMode.SATURATION


def clear_float_status(device: torch.device) -> None:
    """Reset the chip's overflow register before a backward pass (saturation mode only)."""
    torch_npu().npu_clear_float_status(torch.zeros(8, device=device))


def float_status(device: torch.device) -> torch.Tensor:
    """1.0 if anything overflowed since the last clear, else 0.0, left on the device (no sync)."""
    status = torch_npu().npu_get_float_status(torch.zeros(8, device=device))
    return (status[0] != 0).float()
