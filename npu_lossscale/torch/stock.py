"""What stock torch.amp.GradScaler's callers rely on beyond its public methods, for `GradScaler`.

Libraries call stock's private methods (FSDP's sharded scaler, accelerate's checks, torch's own
tests), which read stock's private attributes, scripts write them (a capped `_scale`, a replaced
`_per_optimizer_states`), and torch's fused optimizers and third-party ones take part in stock's
protocol for optimizers that unscale in their own step (`_step_supports_amp_scaling`).
`GradScaler` keeps its state on the host as a RuleState; here are stock's names as views of it (a
mixin placed before stock's class, so that stock's own __init__ sets them through it) and the
protocol's step.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from npu_lossscale.rule import to_float32


class StockPrivateState:
    """Stock's _init_scale, _init_growth_tracker and _growth_tracker, coherent with the host's
    RuleState (``self._state``) in both directions; writes to _scale and
    _per_optimizer_states taken as stock takes them."""

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

    @property
    def _per_optimizer_states(self) -> dict[int, dict[str, Any]]:
        return self._optimizer_states

    @_per_optimizer_states.setter
    def _per_optimizer_states(self, states: dict[int, dict[str, Any]]) -> None:
        """Stock's per-optimizer state is all that stock keeps of an update, so a caller that
        replaces it starts the update afresh (composer's trainer does, to drop an attempt that
        ran out of memory). The update's decision is replaced with it: one still reading the
        dropped states would miss the retry's overflow and apply its step. Stock's __init__
        sets the states before the scaler's own state exists; its `__init__` then begins the
        update itself."""
        self._optimizer_states = states
        if "_previous" in self.__dict__:
            self._new_decision()

    def _take_written_scale(self) -> None:
        """Take a scale the script wrote into stock's `_scale` as the current one.

        Stock scales, unscales and updates from that tensor, so scripts write it: insightface's
        MaxClipGradScaler caps the scale with `self._scale.fill_(max_scale)`, others assign a new
        tensor. Here the scale lives on the host, and a write it never saw would multiply the
        loss by one scale and divide the gradients by another. A write is seen on the host, by
        the tensor's version counter (or its identity); only then is the value read back."""
        scale = self._scale
        if scale is None or (
            self._stored is not None
            and scale is self._stored[0]
            and scale._version == self._stored[1]
        ):
            return
        value = float(scale.detach().reshape(()).item())
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(
                f"a loss scale written into _scale must be finite and >= 0; got {value!r}"
            )
        if self._inv_scale is None or self._inv_scale.device != scale.device:
            self._inv_scale = torch.empty((), dtype=torch.float32, device=scale.device)
        self._state = dataclasses.replace(self._state, scale=to_float32(value))
        self._store_scale()


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
