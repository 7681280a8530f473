"""The one collective of the PyTorch front-end: summing the overflow flag over the ranks.

Stock torch never reduces the flag (under DDP the averaged gradients carry an inf to every rank,
but a saturated finite value, or gradients that are not averaged at all, as in model or pipeline
parallelism, stay on one rank), and torch-npu reduces it only in saturation mode. A rank that
decides alone skips while the others apply, and the replicas drift apart for good. So whenever
more than one rank takes part, every rank sums the 0/1 flag before it decides.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def require_group() -> None:
    """is_distributed=True promises a reduction: refuse to train without a group to reduce over."""
    if not _initialised():
        raise RuntimeError(
            "npu_lossscale.torch.GradScaler(is_distributed=True) needs an initialised "
            "torch.distributed process group and there is none: call "
            "torch.distributed.init_process_group(...) before the first scaler.scale(loss), or "
            "leave is_distributed=None to reduce exactly when one is initialised with several "
            "ranks."
        )


def should_reduce(is_distributed: bool | None, process_group: Any = None) -> bool:
    """None: reduce when torch.distributed is initialised with more than one rank in the group.
    True: always (an initialised group is required); False: never."""
    if is_distributed is False:
        return False
    if is_distributed:
        require_group()
        return True
    return _initialised() and dist.get_world_size(process_group) > 1


def agree(flag: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Sum the float overflow flag over the group, in place: > 0 means some rank overflowed.

    A rank that died or hung makes the collective fail (after the group's timeout at worst); the
    error then says which collective it was, since the user never called it by name.
    """
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=process_group)
    except Exception as error:
        raise RuntimeError(
            "npu_lossscale.torch: summing the overflow flag over the ranks failed, so this "
            f"step cannot be decided; another rank has probably died or hung ({error})"
        ) from error
    return flag
