"""`GradScaler`: torch.amp's GradScaler with the NPU's overflow modes, rule and agreement.

Stock `torch.amp.GradScaler` has the right shape (scale / unscale_ / step / update, per-optimizer
stages, a fused check-and-unscale kernel, one host sync per step), so this class subclasses it and
replaces what differs on an Ascend NPU:

- what counts as an overflow: both modes, as in the TF front-ends (overflow.py);
- who decides: every rank together whenever several take part (distributed.py);
- which optimizers a decision covers: one decision per update, not one per optimizer;
- how the scale moves: the Ascend adapter's rule (npu_lossscale.rule) with a floor, where stock
  torch lets the scale fall to 0.

The rule runs on the host as `DynamicRule.step` itself. The decision has to reach the host anyway
(step() branches on it: stock's one `.item()`), so the rule costs no further synchronisation, is
the reference rule to the last float32 bit by construction, and replaces stock's update kernel by
one `fill_` on the steps where the scale changes. `torch._amp_update_scale_` could not have served:
it has no hysteresis, floor, ceiling or stuck-run guard.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import warnings
import weakref
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import OptState, _refresh_per_optimizer_state

from npu_lossscale.modes import OverflowMode
from npu_lossscale.rule import (
    DynamicRule,
    RuleState,
    check_bool,
    check_fixed_extras,
    check_scale,
    to_float32,
)
from npu_lossscale.torch import ascend, distributed, overflow
from npu_lossscale.torch.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    check_is_distributed,
)

# torch's words for the rule's arguments, so that an error names what the user wrote.
_NAMES = {
    "init_loss_scale": "init_scale",
    "incr_every_n_steps": "growth_interval",
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
}


# state-dict key -> the rule's own name for it
_SETTINGS = {
    "growth_interval": "incr_every_n_steps",
    "growth_factor": "incr_ratio",
    "backoff_factor": "decr_ratio",
    "decr_every_n_nan_or_inf": "decr_every_n_nan_or_inf",
    "min_loss_scale": "min_loss_scale",
    "max_loss_scale": "max_loss_scale",
    "max_skipped_steps_at_floor": "max_skipped_steps_at_floor",
}
# state-dict key -> the RuleState counter it holds
_COUNTS = {
    "_growth_tracker": "good",
    "_bad_steps": "bad",
    "_skipped_steps": "skipped",
    "_skips_at_floor": "skips_at_floor",
}


def _require_scaler_state(state_dict: Any) -> None:
    """A scaler's state dict has a "scale" (stock raises KeyError: 'scale' without one). Say what
    was passed instead where it is recognisable: a whole checkpoint holding the scaler's state
    under some key, or an optimizer's state dict."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict; got {type(state_dict).__name__}")
    if "scale" in state_dict:
        return
    keys = sorted(map(str, state_dict))
    inner = [k for k, v in state_dict.items() if isinstance(v, dict) and "scale" in v]
    if inner:
        what = (
            f"a whole checkpoint (keys {keys}); the scaler's state is under {inner[0]!r}: "
            f"load_state_dict(checkpoint[{inner[0]!r}])"
        )
    elif {"state", "param_groups"} <= set(state_dict):
        what = "an optimizer's state dict; pass the one scaler.state_dict() returned"
    else:
        what = f"a dict with the keys {keys}, not a GradScaler's state dict"
    raise KeyError(f"GradScaler.load_state_dict: no 'scale' entry: this is {what}")


def _count(state_dict: dict[str, Any], key: str, current: int) -> int:
    """A counter entry (stock's _growth_tracker, the rule's others): a non-negative integer,
    as an int, an integral float or a one-element tensor; ``current`` where absent."""
    value = state_dict.get(key, current)
    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    integral = isinstance(number, numbers.Integral) or (
        isinstance(number, float) and number.is_integer()
    )
    if isinstance(number, bool) or not integral or number < 0:
        raise ValueError(f"state_dict[{key!r}] must be a non-negative integer; got {value!r}")
    return int(number)


def _resolve_device(device: object) -> str:
    """ "auto": npu where torch-npu has a device, else cuda where available, else cpu."""
    if isinstance(device, torch.device):
        return device.type
    if not isinstance(device, str):
        hint = ""
        if isinstance(device, numbers.Real):
            hint = (
                " (torch-npu's and torch.cuda.amp's GradScaler take init_scale first; "
                "here it is a keyword: GradScaler(init_scale=...))"
            )
        raise ValueError(
            f"device must be a device type such as 'cpu' or 'auto'; got {device!r}{hint}"
        )
    if device == "npu":  # a device type only torch-npu registers, so torch cannot check it
        return device
    if device != "auto":
        try:
            return torch.device(device).type
        except RuntimeError:
            raise ValueError(
                "device must be a device type such as 'cpu', 'cuda', 'npu' or 'auto'; "
                f"got {device!r}"
            ) from None
    if ascend.torch_npu() is not None:
        return "npu"
    return "cuda" if torch.cuda.is_available() else "cpu"


class _PerDevice:
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


class GradScaler(torch.amp.GradScaler):
    """Dynamic (or fixed) loss scaling for PyTorch with the NPU's overflow modes.

    Drop-in for `torch.amp.GradScaler` (and `torch.cuda.amp`'s) and for torch-npu's
    `torch_npu.npu.amp.GradScaler` (`dynamic=`; its state dicts load). Defaults are torch's rule:
    back off by `backoff_factor` on every overflow, grow by `growth_factor` after
    `growth_interval` clean steps, with a floor of `min_loss_scale`, 1 by default (stock torch
    lets the scale reach 0 after enough overflows, and then every gradient is 0). A script whose
    gradients overflow even unscaled (a sum-reduced loss in float16) needs a scale below 1, as
    stock gives it: `min_loss_scale` may be below 1 (0: no floor, stock's behaviour), and
    `init_scale` below 1 with a floor no higher. `decr_every_n_nan_or_inf` gives the Ascend
    adapter's hysteresis and `from_manager` its whole rule.

    `overflow_mode`: "inf_nan" skips a step with any inf/NaN gradient; "saturation" also one with
    an element whose scaled magnitude reaches 65504 (off the chip) or the chip's float status (on
    an Ascend host); "auto" asks torch-npu where it has a device, then INF_NAN_MODE_ENABLE, else
    inf_nan. The result is `self.overflow_mode`, and it is logged.

    `is_distributed`: None sums the overflow flag over `process_group` whenever torch.distributed
    is initialised with more than one rank, in both modes; True requires an initialised group (the
    first `scale()` says so if there is none); False never reduces. Every rank then skips or
    applies together and the scales stay equal.

    `dynamic=False` keeps `init_scale` and still skips (and counts) overflowed steps, as
    torch-npu's fixed scale and the adapter's FixedLossScaleManager do.

    `per_optimizer`: False (the default) takes one decision for the optimizers one backward pass
    wrote, so a model is never half-updated (see `step`); True decides each optimizer on its
    own gradients, as stock torch does. The scale backs off once per update either way.

    An overflowed step changes nothing: `optimizer.step()` does not run, so parameters and the
    optimizer's state (moments, step counts) stay bitwise as they were; `skipped_steps` counts it,
    `last_step_applied` says whether the last update's step was applied in full.
    """

    def __init__(
        self,
        device: str = "auto",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        dynamic: bool = True,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool | None = None,
        process_group: Any = None,
        decr_every_n_nan_or_inf: int = 1,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        max_skipped_steps_at_floor: int | None = None,
        per_optimizer: bool = False,
    ) -> None:
        device = _resolve_device(device)
        # Flags and scales as stock takes them from configs: in a one-element tensor, and None
        # for "off" (an unset option), which stock reads as false.
        if isinstance(enabled, torch.Tensor) and enabled.numel() == 1:
            enabled = enabled.item()
        enabled = False if enabled is None else check_bool("enabled", enabled)
        if isinstance(init_scale, torch.Tensor) and init_scale.numel() == 1:
            init_scale = init_scale.item()
        self.dynamic = check_bool("dynamic", dynamic)
        check_fixed_extras(self.dynamic, max_skipped_steps_at_floor)
        if enabled and device == "cuda" and not torch.cuda.is_available():
            # Stock disables itself here with a warning about torch.cuda.amp; a ported script
            # that kept "cuda" would lose loss scaling and overflow skipping without knowing why.
            warnings.warn(
                "npu_lossscale.torch.GradScaler(device='cuda'): CUDA is not available, so this "
                "scaler is disabled (no loss scaling, no overflow skipping); on Ascend pass "
                "device='npu' or leave the default device='auto'",
                stacklevel=2,
            )
        init, self._rule = DynamicRule.validated(
            init_scale,
            growth_interval,
            decr_every_n_nan_or_inf,
            growth_factor,
            backoff_factor,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            max_skipped_steps_at_floor=max_skipped_steps_at_floor,
            names=_NAMES,
            lowest=0.0,
        )
        self.is_distributed = check_is_distributed(is_distributed)
        self.process_group = process_group
        self.overflow_mode = overflow.resolve_mode(overflow_mode)
        self.per_optimizer = check_bool("per_optimizer", per_optimizer)
        # Before stock's __init__, which sets _init_scale and _init_growth_tracker: properties
        # over this state (see "stock's private state" below).
        self._state = RuleState(to_float32(init))
        super().__init__(
            device,
            init,
            self._rule.incr_ratio,
            self._rule.decr_ratio,
            self._rule.incr_every_n_steps,
            enabled,
        )
        self._scale: torch.Tensor | None = None
        self._inv_scale: torch.Tensor | None = None
        self._uninvertible = False  # whether 1/scale is inf in float32 (see unscale_)
        self._store_scale()
        # Saturation mode on the chip: the device's float status replaces the element check.
        self._chip_status = (
            device == "npu"
            and self.overflow_mode is OverflowMode.SATURATION
            and ascend.torch_npu() is not None
        )
        self._fused = overflow.FusedOp()
        self._last_step_applied: bool | None = None
        # the optimizers stepped in the previous update, part by part (see step)
        self._previous: list[list[weakref.ref]] = []
        self._begin_update()

    @classmethod
    def from_manager(
        cls,
        manager: FixedLossScaleManager | ExponentialUpdateLossScaleManager,
        *,
        device: str = "auto",
        is_distributed: bool | None = None,
        process_group: Any = None,
    ) -> GradScaler:
        """The scaler a ported script gets: the manager's current scale, its rule step for step
        and its overflow mode. `is_distributed` is the manager's unless given here; the manager
        itself is not driven afterwards, so the flag is reduced once, by the scaler."""
        if not isinstance(manager, (FixedLossScaleManager, ExponentialUpdateLossScaleManager)):
            hint = ""
            if type(manager).__module__.startswith("npu_lossscale."):
                hint = " (the TensorFlow managers live in npu_lossscale; use npu_lossscale.torch's)"
            raise ValueError(
                "manager must be an npu_lossscale.torch FixedLossScaleManager or "
                f"ExponentialUpdateLossScaleManager; got {manager!r}{hint}"
            )
        if is_distributed is None:
            is_distributed = manager.is_distributed
        common = dict(
            overflow_mode=manager.overflow_mode,
            is_distributed=is_distributed,
            process_group=process_group,
        )
        if isinstance(manager, ExponentialUpdateLossScaleManager):
            rule = manager.rule
            return cls(
                device,
                manager._state.scale,
                rule.incr_ratio,
                rule.decr_ratio,
                rule.incr_every_n_steps,
                decr_every_n_nan_or_inf=rule.decr_every_n_nan_or_inf,
                min_loss_scale=rule.min_loss_scale,
                max_loss_scale=rule.max_loss_scale,
                max_skipped_steps_at_floor=rule.max_skipped_steps_at_floor,
                **common,
            )
        if not manager.enable_overflow_check:
            raise ValueError(
                "manager: a FixedLossScaleManager with enable_overflow_check=False never "
                "skips a step, which a GradScaler always does on overflow; multiply the loss "
                "and divide the gradients by the constant yourself instead"
            )
        return cls(device, manager._state.scale, dynamic=False, **common)

    # -- readable state ----------------------------------------------------------------------

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled), from the host: no device sync, unlike stock."""
        return self._state.scale if self._enabled else 1.0

    @property
    def skipped_steps(self) -> int:
        """Updates whose step was skipped (in whole or, see `step`, in part) for overflow."""
        return self._state.skipped

    @property
    def last_step_applied(self) -> bool | None:
        """Whether the last `update()`'s step was applied to every optimizer; None before one."""
        return self._last_step_applied

    def _get_growth_tracker(self) -> int:
        return self._state.good if self._enabled else 0

    # -- stock's private state -------------------------------------------------------------------
    # Libraries call stock's private methods (FSDP's sharded scaler, accelerate's checks, torch's
    # fused optimizers through _check_inf_per_device), which read these attributes. The state is
    # the host's RuleState; these views keep stock's names coherent with it in both directions.

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

    # -- the training loop -------------------------------------------------------------------

    def scale(self, outputs: Any) -> Any:
        """Multiply the loss (or losses) by the scale, as stock does. A call after a step of
        this update starts a new part of it (see `step`). In saturation mode on the chip, a
        part's first call also clears the float status, so that the status read at the step
        covers exactly that part's forward and backward passes."""
        if self._stepped[-1]:
            self._new_segment()
        if self._chip_status and self._enabled and not self._status_cleared:
            ascend.clear_float_status(torch.device(self._device))
            self._status_cleared = True
        return super().scale(outputs)

    def _new_segment(self) -> None:
        """A loss scaled after a step of this update starts a new backward pass: what it writes
        is judged apart from what was decided before (a GAN's G after D's step), as stock
        judges every optimizer on its own gradients."""
        self._earlier = bool(self._earlier) or bool(self._overflowed)
        self._overflowed = None
        self._stepped.append([])
        self._status_cleared = False

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        # Called by stock scale() on the first scale(): where is_distributed=True is checked.
        if self.is_distributed:
            distributed.require_group()
        self._scale = torch.full((), self._state.scale, dtype=torch.float32, device=dev)
        self._inv_scale = torch.empty_like(self._scale)
        self._store_scale()

    def _store_scale(self) -> None:
        """Write the host's scale and its reciprocal (1/scale in float64 rounded to float32, as
        stock computes it: inf for a scale of 0 or too small for float32's range) to the device
        tensors, which scale() and unscale_ read."""
        scale = self._state.scale
        inverse = to_float32(1.0 / scale) if scale else math.inf
        self._uninvertible = math.isinf(inverse)
        if self._scale is not None:
            self._scale.fill_(scale)
            self._inv_scale.fill_(inverse)

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise AssertionError(
                f"Attempted {funcname} but _scale is None.  This may indicate your script did "
                "not use scaler.scale(loss or outputs) earlier in the iteration."
            )
        return self._scale

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale and record whether they overflowed, as
        stock does (no host sync), in this scaler's overflow mode: call it before clipping."""
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # At a scale whose reciprocal is inf (0, or below float32's range: stock's scale gets
        # there after ~165 overflows in a row) unscaling writes NaN (0 * inf) into gradients the
        # check has passed; stock then applies them. Such a step counts as overflowed.
        found = 1.0 if self._uninvertible else 0.0
        found_inf = torch.full((), found, dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(
            optimizer, self._inv_scale, found_inf, False
        )
        state["stage"] = OptState.UNSCALED

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        # torch's own tests (and some libraries) pass a one-element 1-D inv_scale, which
        # torch's kernel takes and _foreach_mul_ does not.
        inverse = _PerDevice(inv_scale.reshape(()) if inv_scale.dim() else inv_scale)
        found = _PerDevice(found_inf)
        with torch.no_grad():
            groups = overflow.gradient_groups(
                overflow.optimizer_params(optimizer),
                allow_fp16=allow_fp16,
                coalesce_sparse=self.overflow_mode is OverflowMode.SATURATION,
            )
            overflow.check_and_unscale_(
                groups,
                self.overflow_mode,
                found.get,
                inverse.get,
                ascend.float_status if self._chip_status else None,
                self._fused,
            )
        return found.tensors

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless `unscale_` did), then run `optimizer.step(*args, **kwargs)` unless
        this update overflowed.

        One decision per backward pass, where stock torch decides per optimizer (with two
        optimizers it may apply one and skip the other, leaving a model half-updated). An update
        falls into parts: a loss scaled after a step starts a new one, as a GAN's G loss does
        after D's step. A part's first `step()` decides, over its own optimizer, every optimizer
        already `unscale_`d in this update, and the optimizers that shared this one's part in
        the previous update (their gradients are read, not touched); if any overflowed, every
        optimizer of the part skips. That is all or nothing for the common loops: one backward,
        then a step per optimizer (dense and sparse optimizers, per-part optimizers), from the
        second update on, and from the first where each optimizer is `unscale_`d before the
        first step. An optimizer the decision did not cover (new to the scaler) is checked at
        its own step and, having overflowed, skipped, as is every later one of its part. Parts
        are judged apart, each on its own gradients, as stock judges each optimizer: D's
        overflow does not skip G's clean step, nor do G's stale gradients, which a GAN loop only
        zeroes after D's next step, skip D's. The update counts as skipped, and the scale backs
        off once, when any part overflowed. With `per_optimizer=True` each optimizer is decided
        on its own gradients, as stock decides. Optimizers whose own `step` supports amp
        scaling (torch's fused ones) get stock's protocol and unscale in their step.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            retval = self._step_unscaling_itself(optimizer, state, args, kwargs)
        else:
            if state["stage"] is OptState.READY:
                self.unscale_(optimizer)
            retval = None
            if not self._overflow_so_far(optimizer):
                retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        self._stepped[-1].append(weakref.ref(optimizer))
        return retval

    def _step_unscaling_itself(
        self,
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
            found = self._check_inf_per_device(optimizer)
            if self._uninvertible:  # see unscale_
                for flag in found.values():
                    flag.fill_(1.0)
        if self._overflow_so_far(optimizer):
            return None
        if takes_scaler:
            return optimizer.step(*args, **{**kwargs, "grad_scaler": self})
        scale = self._require_scale("step")
        flags = [
            t.to(scale.device, non_blocking=True) for t in state["found_inf_per_device"].values()
        ]
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

    def _overflow_so_far(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this update has overflowed, as far as ``optimizer``'s step must know."""
        if self.per_optimizer:  # stock's decisions: each optimizer on its own gradients
            mine = self._alone_overflowed(optimizer)
            if mine is None:
                mine = self._agreed_overflow([id(optimizer)])
            self._overflowed = bool(self._overflowed) or mine
            return mine
        if self._overflowed is None:
            self._overflowed = self._alone_overflowed(optimizer)
            if self._overflowed is None:
                keys, extra = self._unjudged(), self._prechecks(optimizer)
                self._overflowed = self._agreed_overflow(keys, extra)
        elif not self._overflowed and id(optimizer) not in self._judged:
            self._overflowed = self._agreed_overflow([id(optimizer)])
        return self._overflowed

    def _alone_overflowed(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """The decision of the usual loop -- one optimizer, stepped alone in this update and the
        last, on one device, one rank -- read straight from its flag; None for any other loop.

        The general path decides the same there, but runs right after the unscale kernel has
        streamed every gradient through the caches, where each Python call it makes costs
        microseconds: together, more than stock torch's whole step.
        """
        states, previous = self._per_optimizer_states, self._previous
        if len(states) != 1 or len(previous) > 1 or len(self._stepped) > 1:
            return None
        if previous and (len(previous[0]) > 1 or previous[0][0]() is not optimizer):
            return None
        found = states[id(optimizer)]["found_inf_per_device"]
        if len(found) != 1 or self._chip_status:
            return None
        if distributed.should_reduce(self.is_distributed, self.process_group):
            return None
        self._judged.add(id(optimizer))
        (flag,) = found.values()
        return bool(flag.item())

    def _unjudged(self) -> list[int]:
        return [
            key
            for key, state in self._per_optimizer_states.items()
            if state["stage"] is not OptState.READY and key not in self._judged
        ]

    def _prechecks(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """Read-only checks of the optimizers that shared ``optimizer``'s part of the previous
        update, not yet unscaled in this one: where a loop steps the same optimizers after one
        backward every update. A loop that steps optimizers after separate backward passes (a
        GAN's D, then G, in one update or in two) leaves stale gradients in the others, which
        are not this part's to judge. On the chip the float status already covers every
        gradient since scale()."""
        if self._chip_status:
            return []
        part = next((p for p in self._previous if any(r() is optimizer for r in p)), [])
        if len(part) < 2:
            return []
        scale = self._require_scale("step")
        flags = []
        for ref in part:
            other = ref()
            if other is None:
                continue
            state = self._per_optimizer_states.get(id(other))
            if state is not None and state["stage"] is not OptState.READY:
                continue
            with torch.no_grad():
                groups = overflow.gradient_groups(
                    overflow.optimizer_params(other),
                    allow_fp16=True,
                    coalesce_sparse=self.overflow_mode is OverflowMode.SATURATION,
                    in_place=False,
                )
                flags.append(overflow.check_only(groups, self.overflow_mode, scale.device))
        return flags

    def _agreed_overflow(self, keys: list[int], extra: Sequence[torch.Tensor] = ()) -> bool:
        """Combine the recorded flags of ``keys`` (and ``extra``), sum them over the ranks when
        several take part, and read the result: the one host sync of a step, as in stock."""
        scale = self._require_scale("step")
        flags = [
            flag.to(scale.device, non_blocking=True)
            for key in keys
            for flag in self._per_optimizer_states[key]["found_inf_per_device"].values()
        ]
        flags.extend(extra)
        self._judged.update(keys)
        if not flags:
            flag = torch.zeros((), dtype=torch.float32, device=scale.device)
        elif len(flags) == 1:
            flag = flags[0]
        else:
            flag = torch.stack(flags).sum()
        if distributed.should_reduce(self.is_distributed, self.process_group):
            flag = distributed.agree(flag.clone(), self.process_group)
        return bool(flag.item())

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Move the scale by the rule once for this update (or set it to ``new_scale``), count a
        skipped update, and raise RuntimeError when the stuck-run guard trips."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            self._set_scale(new_scale)
            overflowed = bool(self._earlier) or bool(self._overflowed)
            skipped = self._state.skipped + overflowed
            self._finish_update(dataclasses.replace(self._state, skipped=skipped), overflowed)
            return
        overflowed = self._overflowed
        if self._earlier is not None:  # an earlier part of this update was decided
            overflowed = self._earlier or bool(overflowed)
        # Optimizers unscale_d but not stepped count too, as in stock; the judged ones are a
        # subset of those with a state, so when the counts match there is nothing left to read.
        unjudged = []
        if not overflowed and len(self._judged) < len(self._per_optimizer_states):
            unjudged = self._unjudged()
        if overflowed is None and not unjudged:
            raise AssertionError("No inf checks were recorded prior to update.")
        if unjudged:
            overflowed = self._agreed_overflow(unjudged)
        if self.dynamic:
            state = self._rule.step(self._state, not overflowed)
        else:
            state = dataclasses.replace(self._state, skipped=self._state.skipped + overflowed)
        self._finish_update(state, overflowed)
        if self.dynamic and self._rule.is_stuck(state):
            raise RuntimeError(self._rule.stuck_message(self.overflow_mode.value))

    def _finish_update(self, state: RuleState, overflowed: bool) -> None:
        changed = state.scale != self._state.scale
        self._state = state
        if changed:
            was_uninvertible = self._uninvertible
            self._store_scale()
            if self._uninvertible and not was_uninvertible:
                warnings.warn(
                    f"npu_lossscale: the loss scale has fallen to {state.scale!r}, whose "
                    "reciprocal is inf in float32, so every step is skipped from now on (stock "
                    "torch would write NaN into the weights); set min_loss_scale above it and "
                    "max_skipped_steps_at_floor to stop such a run",
                    stacklevel=3,
                )
        self._last_step_applied = not overflowed
        self._previous = [part for part in self._stepped if part]
        self._begin_update()

    def _begin_update(self) -> None:
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._overflowed: bool | None = None  # None: not decided yet in this part
        self._earlier: bool | None = None  # whether an earlier part overflowed; None: no part
        self._judged: set[int] = set()  # optimizers whose flags a decision has read
        self._stepped: list[list[weakref.ref]] = [[]]  # the optimizers stepped, part by part
        self._status_cleared = False

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        value = new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale
        value = check_scale("new_scale", value, 0.0)
        if value < self._rule.min_loss_scale:
            raise ValueError(
                f"new_scale ({value!r}) must not be below min_loss_scale "
                f"({self._rule.min_loss_scale!r})"
            )
        self._state = dataclasses.replace(self._state, scale=to_float32(value))
        self._store_scale()

    # -- settings ------------------------------------------------------------------------------

    def _rebuild(
        self,
        scale: float,
        scale_name: str = "init_scale",
        names: dict[str, str] | None = None,
        **changes: Any,
    ) -> None:
        """Validate the rule with ``changes`` applied (errors name torch's arguments, or
        ``names``) and take it with ``scale``, keeping stock's attributes in step with it."""
        settings = dataclasses.asdict(self._rule)
        settings.update(changes)
        init, self._rule = DynamicRule.validated(
            scale,
            settings.pop("incr_every_n_steps"),
            settings.pop("decr_every_n_nan_or_inf"),
            settings.pop("incr_ratio"),
            settings.pop("decr_ratio"),
            names={**_NAMES, **(names or {}), "init_loss_scale": scale_name},
            lowest=0.0,
            **settings,
        )
        self._state = dataclasses.replace(self._state, scale=to_float32(init))
        self._growth_factor = self._rule.incr_ratio
        self._backoff_factor = self._rule.decr_ratio
        self._growth_interval = self._rule.incr_every_n_steps
        self._store_scale()

    def get_growth_factor(self) -> float:
        return self._rule.incr_ratio

    def set_growth_factor(self, new_factor: float) -> None:
        self._rebuild(self._state.scale, incr_ratio=new_factor)

    def get_backoff_factor(self) -> float:
        return self._rule.decr_ratio

    def set_backoff_factor(self, new_factor: float) -> None:
        self._rebuild(self._state.scale, decr_ratio=new_factor)

    def get_growth_interval(self) -> int:
        return self._rule.incr_every_n_steps

    def set_growth_interval(self, new_interval: int) -> None:
        self._rebuild(self._state.scale, incr_every_n_steps=new_interval)

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Stock's five entries, torch-npu's "dynamic", and the rest of the Ascend rule's
        settings and counters, so a checkpoint resumes the rule exactly."""
        if not self._enabled:
            return {}
        return {
            "scale": self._state.scale,
            "growth_factor": self._rule.incr_ratio,
            "backoff_factor": self._rule.decr_ratio,
            "growth_interval": self._rule.incr_every_n_steps,
            "_growth_tracker": self._state.good,
            "dynamic": self.dynamic,
            "decr_every_n_nan_or_inf": self._rule.decr_every_n_nan_or_inf,
            "min_loss_scale": self._rule.min_loss_scale,
            "max_loss_scale": self._rule.max_loss_scale,
            "max_skipped_steps_at_floor": self._rule.max_skipped_steps_at_floor,
            "_bad_steps": self._state.bad,
            "_skipped_steps": self._state.skipped,
            "_skips_at_floor": self._state.skips_at_floor,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load our own state dict, stock torch's or torch-npu's (other entries than "scale" that
        a dict lacks keep their current values). A scale below min_loss_scale (stock's reaches 0
        after enough overflows) is raised to the floor with a warning, so such a run can resume.
        Anything else (a whole checkpoint, an optimizer's state dict, a malformed entry) is
        refused with an error that names the entry, and nothing is loaded."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        _require_scaler_state(state_dict)
        counts = {
            field: _count(state_dict, key, getattr(self._state, field))
            for key, field in _COUNTS.items()
        }
        dynamic = self.dynamic
        if "dynamic" in state_dict:
            dynamic = check_bool("state_dict['dynamic']", state_dict["dynamic"])
        changes = {name: state_dict[key] for key, name in _SETTINGS.items() if key in state_dict}
        scale = state_dict["scale"]
        if isinstance(scale, torch.Tensor) and scale.numel() == 1:
            scale = scale.item()
        floor = changes.get("min_loss_scale", self._rule.min_loss_scale)
        numeric = isinstance(scale, numbers.Real) and isinstance(floor, numbers.Real)
        if numeric and 0 <= scale < floor:
            warnings.warn(
                f"npu_lossscale: the loaded scale {scale!r} is below min_loss_scale ({floor!r}), "
                "as stock torch's scale becomes after many overflows; training resumes from "
                f"the floor, {floor!r}",
                stacklevel=2,
            )
            scale = floor
        names = {name: f"state_dict[{key!r}]" for key, name in _SETTINGS.items()}
        self._rebuild(scale, "state_dict['scale']", names, **changes)
        self.dynamic = dynamic
        self._state = RuleState(self._state.scale, **counts)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Scalers pickled before the fused op was looked up per scaler have no _fused. A scaler
        # is pickled between updates, so the per-update bookkeeping starts afresh, in this
        # version's shape whatever the pickle's.
        self.__dict__.update({"_fused": overflow.FusedOp(), **state})
        self._previous = []
        self._begin_update()

    def __getstate__(self) -> dict[str, Any]:
        if self._enabled and len(self._per_optimizer_states) != 0:
            raise AssertionError(
                "A GradScaler instance may only be pickled at the beginning "
                "of an iteration, or at the end after scaler.update()."
            )
        state = self.__dict__.copy()
        # The scale tensor is rebuilt by the next scale(); optimizers are not the scaler's to keep.
        state.update(_scale=None, _inv_scale=None, _previous=[], _stepped=[[]])
        return state
