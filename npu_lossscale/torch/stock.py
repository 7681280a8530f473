"""What stock torch.amp.GradScaler's callers rely on beyond its public methods, for `GradScaler`.

Libraries call stock's private methods (FSDP's sharded scaler, accelerate's checks, torch's own
tests), which read stock's private attributes, and torch's fused optimizers and third-party ones
take part in stock's protocol for optimizers that unscale in their own step
(`_step_supports_amp_scaling`). `GradScaler` keeps its state on the host as a RuleState; here
are stock's names as views of it (a mixin placed before stock's class, so that stock's own
__init__ sets them through it) and the protocol's step.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from npu_lossscale.rule import to_float32


class StockPrivateState:
    """Stock's _init_scale, _init_growth_tracker and _growth_tracker, coherent with the host's
    RuleState (``self._state``) in both directions."""

    @property
    def _init_scale(self) -> float:
        return self._state.scale

    @_init_scale.setter
    def _init_scale(self, value: float) -> None:
        self._state = dataclasses.replace(self._state, scale=to_float32(float(value)))

    @property
    def _init_growth_tracker(self) -> int:
        return self._state.good

    @_init_growth_tracker.setter
    def _init_growth_tracker(self, value: int) -> None:
        self._state = dataclasses.replace(self._state, good=int(value))

    @property
    def _growth_tracker(self) -> torch.Tensor | None:
        """Stock's device copy of the clean-step count: None before the first scale(), as in
        stock, then made from the host's count when asked (the rule itself never needs it)."""
        if self._scale is None:
            return None
        return torch.full((), self._state.good, dtype=torch.int32, device=self._scale.device)

    @_growth_tracker.setter
    def _growth_tracker(self, value: torch.Tensor | None) -> None:
        if value is not None:
            self._init_growth_tracker = int(value.item())


def step_unscaling_itself(
    scaler: Any,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Stock's protocol for optimizers that unscale in their own step (torch's fused ones,
    third-party ones: `_step_supports_amp_scaling`): a step that takes `grad_scaler` gets this
    scaler (with stock's FutureWarning), any other finds `optimizer.grad_scale` (the scale,
    unless `unscale_` ran) and `optimizer.found_inf` set for the call. The decision is still
    this scaler's (its mode, one per part, agreed over the ranks): the gradients are checked
    where they are, still scaled, and an overflowed step is not called at all."""
    takes_scaler = "grad_scaler" in inspect.signature(optimizer.step).parameters
    if takes_scaler:
        warnings.warn(
            "GradScaler is going to stop passing itself as a keyword argument to the passed "
            "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
            "`found_inf: Tensor` to the passed optimizer and let the optimizer use them "
            "directly.",
            FutureWarning,
            stacklevel=3,
        )
    unscaled = state["stage"] is OptState.UNSCALED
    if not unscaled:
        found = scaler._check_inf_per_device(optimizer)
        if scaler._uninvertible:  # see unscale_
            for flag in found.values():
                flag.fill_(1.0)
    if scaler._decision.must_skip(optimizer):
        return None
    if takes_scaler:
        return optimizer.step(*args, **{**kwargs, "grad_scaler": scaler})
    scale = scaler._require_scale("step")
    flags = [t.to(scale.device, non_blocking=True) for t in state["found_inf_per_device"].values()]
    optimizer.grad_scale = (
        getattr(optimizer, "grad_scale", None)
        if unscaled
        else scale * getattr(optimizer, "grad_scale", 1)
    )
    optimizer.found_inf = flags[0] if len(flags) == 1 else torch.stack(flags).sum()
    try:
        return optimizer.step(*args, **kwargs)
    finally:
        del optimizer.grad_scale
        del optimizer.found_inf
