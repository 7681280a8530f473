"""The found-inf checks of the PyTorch front-end, one per overflow mode, on torch's fused ops.

Both modes decide exactly what the TF front-ends decide:

- INF_NAN (IEEE hardware; Atlas A2/A3 by default): any inf or NaN in a gradient.
- SATURATION (first-generation Atlas training chips): an overflowing result is clamped to
  +-65504 instead of becoming inf, so an inf check misses it. Off the chip, an element whose
  *scaled* magnitude reaches 65504 counts as overflowed, and so does inf/NaN. On an Ascend host
  the chip's float status decides instead.

Dense CPU gradients go through our own fused op (npu_lossscale.torch.kernels, built with g++ on
first use) in both modes: one read per element, tested against the mode's limit while still
scaled, multiplied and written back. Torch has no op for the saturation check, and none of its
own gives it in one pass on the CPU (`torch._foreach_norm(grads, inf)`,
`torch.linalg.vector_norm(g, inf)` and `torch.aminmax` are 6 to 60 times slower than `amax` plus
`amin`; a cheaper bound, the sum of squares, almost never clears still-scaled gradients); for
INF_NAN it has the kernel stock `torch.amp.GradScaler` uses,
`torch._amp_foreach_non_finite_check_and_unscale_`, which the op matches where memory traffic
bounds both (a large model's step) and beats twofold on gradients already in cache.
Where the op is not built, or for other gradients (on another device, from a sparse gradient,
float64), INF_NAN runs that kernel of torch's, and saturation the pure-torch path, which reads
them three times: the extremes of each still-scaled gradient (`amax`/`amin`, which propagate NaN)
are compared with 65504, then `torch._foreach_mul_` unscales. All paths give the same decision
and bitwise the same unscaled gradients (a NaN stays NaN; its payload is unspecified, as in
torch's own kernels).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch

from npu_lossscale.modes import FP16_SATURATION_VALUE, OverflowMode, resolve_overflow_mode
from npu_lossscale.torch import ascend, kernels

logger = logging.getLogger("npu_lossscale")

# device -> (dtype, whether the tensors are a sparse gradient's values) -> gradients
GradGroups = dict[torch.device, dict[tuple[torch.dtype, bool], list[torch.Tensor]]]


class PerDevice:
    """A scalar tensor served on every device that asks, copied once per device; unlike stock's
    replicator, its own device gets the tensor itself (no copy on single-device models)."""

    def __init__(self, master: torch.Tensor) -> None:
        self.tensors = {master.device: master}

    def get(self, device: torch.device) -> torch.Tensor:
        tensor = self.tensors.get(device)
        if tensor is None:
            tensor = self.tensors[device] = next(iter(self.tensors.values())).to(
                device, non_blocking=True, copy=True
            )
        return tensor


def resolve_mode(requested: OverflowMode | str) -> OverflowMode:
    """AUTO asks torch-npu first where it has a device (its own mode setting is what the chip
    does), then falls back to the shared resolution (runtime, INF_NAN_MODE_ENABLE, INF_NAN)."""
    mode = OverflowMode.parse(requested)
    if mode is OverflowMode.AUTO:
        from_device = ascend.device_overflow_mode()
        if from_device is not None:
            logger.info(
                "npu_lossscale: overflow mode %s (decided by torch-npu's device setting)",
                from_device.value,
            )
            return from_device
    return resolve_overflow_mode(mode)


def gradient_groups(
    params: Iterable[torch.Tensor],
    *,
    allow_fp16: bool,
    coalesce_sparse: bool,
    in_place: bool = True,
) -> GradGroups:
    """The gradients to check, split by device and dtype as the fused kernels need them, and
    the values of sparse gradients apart from dense ones.

    A sparse gradient is checked through its values. Duplicate indices add up when the optimizer
    applies it, so where those sums matter (fp16, where they may overflow; saturation mode, where
    they may pass 65504) it is coalesced first, replacing ``.grad`` as stock torch does, or into
    a copy when ``in_place`` is False.
    """
    groups: GradGroups = defaultdict(lambda: defaultdict(list))
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if not allow_fp16 and grad.dtype == torch.float16:
            raise ValueError("Attempting to unscale FP16 gradients.")
        sparse = grad.is_sparse
        if sparse:
            if coalesce_sparse or grad.dtype == torch.float16:
                grad = grad.coalesce()
                if in_place:
                    param.grad = grad
            grad = grad._values()
        groups[grad.device][grad.dtype, sparse].append(grad)
    return groups


def optimizer_params(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    return (p for group in optimizer.param_groups for p in group["params"])


def _beyond(grads: list[torch.Tensor], threshold: float) -> torch.Tensor | None:
    """Bool scalar: some element is NaN or has magnitude >= threshold (inf: non-finite)."""
    extremes = [e for g in grads if g.numel() for e in (g.amax(), g.amin())]
    if not extremes:
        return None
    return torch.logical_not(torch.stack(extremes).abs() < threshold).any()


class FusedOp:
    """The fused CPU op as one scaler calls it: looked up on the first CPU gradients it gets, then
    kept. The lookup reads ``NPU_LOSSSCALE_FUSED`` from the environment, which right after the
    backward pass has flushed the caches costs more than the op itself; a scaler is built on one
    side of that switch and stays there. A pickled scaler looks it up again."""

    def __init__(self) -> None:
        self._resolved = False
        self._op: torch._ops.OpOverload | None = None

    def __call__(
        self, grads: list[torch.Tensor], found: torch.Tensor, inv: torch.Tensor, saturation: bool
    ) -> bool:
        """Check and unscale ``grads`` in one pass; False, nothing done, where the op is not
        built or does not take them (another dtype, not one dense block, a tensor subclass such
        as FSDP2's DTensor, which would route the op to its own dispatch and refuse it)."""
        if any(type(grad) is not torch.Tensor for grad in grads):
            return False
        if not self._resolved:
            self._op = kernels.fused_op(saturation=saturation)
            self._resolved = True
        return self._op is not None and self._op(grads, found, inv, saturation)

    def __getstate__(self) -> dict[str, object]:
        return {"_resolved": False, "_op": None}


def check_and_unscale_(
    groups: GradGroups,
    mode: OverflowMode,
    found_inf: Callable[[torch.device], torch.Tensor],
    inv_scale: Callable[[torch.device], torch.Tensor],
    chip_status: Callable[[torch.device], torch.Tensor] | None = None,
    fused: FusedOp | None = None,
) -> None:
    """Make ``found_inf(device)`` nonzero where the device's gradients overflowed (it is never
    reset here) and multiply them by ``inv_scale(device)`` in place. ``chip_status`` (saturation
    mode on an Ascend host) replaces the element check by the device's float status; ``fused``
    takes dense CPU gradients where it can."""
    saturation = mode is OverflowMode.SATURATION
    for device, per_kind in groups.items():
        found, inv = found_inf(device), inv_scale(device)
        if chip_status is not None:
            found.add_(chip_status(device))
        for (_, sparse), grads in per_kind.items():
            if chip_status is not None:
                torch._foreach_mul_(grads, inv)
                continue
            cpu_dense = device.type == "cpu" and not sparse
            if not (fused is not None and cpu_dense and fused(grads, found, inv, saturation)):
                _unfused_(grads, found, inv, saturation)


def _unfused_(
    grads: list[torch.Tensor], found: torch.Tensor, inv: torch.Tensor, saturation: bool
) -> None:
    """Torch's own inf/NaN kernel, or (saturation) the extremes compared with 65504 and then a
    multiply: for gradients the fused op does not take, and where it is not built."""
    if not saturation:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        return
    beyond = _beyond(grads, FP16_SATURATION_VALUE)
    if beyond is not None:
        found.add_(beyond)
    torch._foreach_mul_(grads, inv)


def check_only(groups: GradGroups, mode: OverflowMode, device: torch.device) -> torch.Tensor:
    """Float 0/1 on ``device``: whether still-scaled gradients overflowed, touching none of them.

    Reads only (no in-place multiply by one, as stock's check does), so gradients that are still
    being accumulated, or that take part in a double backward, are left exactly as they were.
    """
    threshold = math.inf if mode is OverflowMode.INF_NAN else FP16_SATURATION_VALUE
    lists = [grads for per_kind in groups.values() for grads in per_kind.values()]
    found = (_beyond(grads, threshold) for grads in lists)
    flags = [beyond.to(device) for beyond in found if beyond is not None]
    if not flags:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(flags).any().float()
