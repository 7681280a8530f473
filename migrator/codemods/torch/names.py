"""Which PyTorch gradient scalers exist, by qualified name, and what each one becomes on the NPU.

Names are compared after libcst's scope analysis resolved them through the file's imports, so
`torch.cuda.amp.GradScaler`, `amp.GradScaler` under `from torch.cuda import amp` and `Scaler`
under `from torch.cuda.amp import GradScaler as Scaler` all arrive here as one spelling; nothing
in the port matches the text `torch.`. The spellings are migrator.registry's.
"""

from __future__ import annotations

import enum

from migrator import registry

LIBRARY = "npu_lossscale.torch"
CLASS = registry.TORCH_SCALER
PORTED = f"{LIBRARY}.{CLASS}"
# The base class of the ported class and of every torch scaler (isinstance tests use it).
BASE = "torch.amp.GradScaler"
# The local name of the ported class where the file's own `GradScaler` must stay torch's.
FALLBACK = "NPUGradScaler"


class Kind(enum.Enum):
    """What a resolved name is, which decides how its uses are handled."""

    CUDA = "cuda"  # torch.cuda.amp.GradScaler: no device parameter, the device is CUDA
    CPU = "cpu"  # torch.cpu.amp.GradScaler: the same signature, on the CPU
    AMP = "amp"  # torch.amp.GradScaler: the device is the first parameter
    NPU = "npu"  # torch-npu's own scaler: the script runs on Ascend already
    SHARDED = "sharded"  # FSDP's and fairscale's scalers: no counterpart, left and reported


# torch.amp.GradScaler's parameters, which npu_lossscale.torch.GradScaler takes in the same order.
AMP_PARAMS = (
    "device",
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "enabled",
)
# torch.cuda.amp.GradScaler / torch.cpu.amp.GradScaler: the same without the device.
DEVICE_FREE_PARAMS = AMP_PARAMS[1:]

_SCALERS = {m: Kind(k) for m, k in registry.TORCH_SCALER_HOMES.items()}
# Scalers the port leaves, each with what it is (every use is reported).
_SHARDED = registry.TORCH_SHARDED_SCALERS
# Modules whose import the port may drop once every use of it was rewritten (`import torch`
# goes too where the port rewrote every read of `torch`: npu_lossscale.torch imports it).
AMP_MODULES = frozenset(m for m, k in _SCALERS.items() if k is not Kind.NPU and m != "torch")
# Modules whose `import *` binds a scaler class the tool cannot see.
STAR_MODULES = AMP_MODULES | {"torch"}


def classify(name: str) -> Kind | None:
    """The kind of a scaler class's qualified name, or None when it is not one."""
    if name in _SHARDED:
        return Kind.SHARDED
    module, _, leaf = name.rpartition(".")
    if leaf == CLASS:
        return _SCALERS.get(module)
    if name.startswith("torch_npu.") and leaf.endswith(CLASS):
        return Kind.NPU  # torch-npu's sharded and other scalers
    return None


# Other libraries' loss scaling for torch, which the port leaves: each checks inf/NaN only.
_FOREIGN = registry.TORCH_FOREIGN_LOSS_SCALING
# Foreign loss scaling set up by a call that takes the optimizers: given none, it scales nothing.
INITIALISERS = frozenset({"apex.amp.initialize"})


def foreign(name: str) -> str | None:
    """What another library's loss scaling is (apex's), or None."""
    return _FOREIGN.get(name)


def wrapped(name: str) -> str | None:
    """What another library's wrapper around torch's own GradScaler is (timm's), or None."""
    return registry.TORCH_WRAPPED_SCALERS.get(name)


def left_what(name: str) -> str:
    """What a scaler the port leaves is, for its warning."""
    return _SHARDED.get(name, "a sharded scaler")


def scaler_prefix(name: str) -> str | None:
    """The scaler class a longer name hangs off (`torch.cuda.amp.GradScaler.scale`), if any."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:end])
        if classify(head) is not None:
            return head
    return None


def is_removable_binding(name: str) -> bool:
    """An import binding the port may drop when all its uses were ported: a scaler class it
    replaces, or an amp module only used to reach one."""
    return name in AMP_MODULES or classify(name) in (Kind.CUDA, Kind.CPU, Kind.AMP)


def is_transfer_to_npu(name: str) -> bool:
    """torch-npu's `transfer_to_npu`, which maps 'cuda' devices and autocast to the NPU."""
    return name.startswith("torch_npu.contrib") and "transfer_to_npu" in name


def is_torch_module(name: str) -> bool:
    top = name.split(".")[0]
    return top in ("torch", "torch_npu", "fairscale", "apex", "timm")
