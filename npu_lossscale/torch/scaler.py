"""`GradScaler`: torch.amp's GradScaler with the NPU's overflow modes, rule and agreement.

Stock `torch.amp.GradScaler` has the right shape (scale / unscale_ / step / update, per-optimizer
stages, a fused check-and-unscale kernel, one host sync per step), so this class subclasses it and
replaces what differs on an Ascend NPU: what counts as an overflow (both modes, as in the TF
front-ends: overflow.py); who decides (every rank together whenever several take part:
distributed.py); which optimizers a decision covers (the optimizers one backward pass wrote, not
one at a time: decision.py); how the scale moves (the Ascend adapter's rule, npu_lossscale.rule,
with a floor, where stock torch lets the scale fall to 0). What stock's callers rely on beyond its
public methods (its private state, the protocol of optimizers that unscale themselves) is in
stock.py, the state dict's checks in checkpoint.py.

The rule runs on the host as `DynamicRule.step` itself. The decision has to reach the host anyway
(step() branches on it: stock's one `.item()`), so the rule costs no further synchronisation, is
the reference rule to the last float32 bit by construction, and replaces stock's update kernel by
one `fill_` on the steps where the scale changes. `torch._amp_update_scale_` could not have served:
it has no hysteresis, floor, ceiling or stuck-run guard.
"""

from __future__ import annotations

import dataclasses
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
    check_optional_bool,
    check_scale,
    to_float32,
)
from npu_lossscale.torch import ascend, checkpoint, distributed, overflow, stock
from npu_lossscale.torch.decision import UpdateDecision
from npu_lossscale.torch.managers import (
    SCALER_NAMES,
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    scaler_arguments,
)


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


class GradScaler(stock.StockPrivateState, torch.amp.GradScaler):
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
            dynamic=self.dynamic,
            names=SCALER_NAMES,
            lowest=0.0,
        )
        self.is_distributed = check_optional_bool("is_distributed", is_distributed)
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
        self._stored: tuple[torch.Tensor, int] | None = None  # see _take_written_scale
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
        scale, settings = scaler_arguments(manager)
        if is_distributed is None:
            is_distributed = manager.is_distributed
        return cls(
            device, scale, is_distributed=is_distributed, process_group=process_group, **settings
        )

    # -- readable state ----------------------------------------------------------------------

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled), from the host: no device sync, unlike stock."""
        if not self._enabled:
            return 1.0
        self._take_written_scale()
        return self._state.scale

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

    # -- the training loop -------------------------------------------------------------------

    def scale(self, outputs: Any) -> Any:
        """Multiply the loss (or losses) by the scale, as stock does. A call after a step of
        this update starts a new part of it (see `step`). In saturation mode on the chip, a
        part's first call also clears the float status, so that the status read at the step
        covers exactly that part's forward and backward passes."""
        self._take_written_scale()
        if self._decision.new_part():
            self._status_cleared = False
        if self._chip_status and self._enabled and not self._status_cleared:
            ascend.clear_float_status(torch.device(self._device))
            self._status_cleared = True
        return super().scale(outputs)

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
            self._stored = (self._scale, self._scale._version)

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise AssertionError(
                f"Attempted {funcname} but _scale is None.  This may indicate your script did "
                "not use scaler.scale(loss or outputs) earlier in the iteration."
            )
        self._take_written_scale()
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
        inverse = overflow.PerDevice(inv_scale.reshape(()) if inv_scale.dim() else inv_scale)
        found = overflow.PerDevice(found_inf)
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

        One decision per backward pass, where stock torch decides per optimizer (and may apply
        one optimizer and skip another, leaving a model half-updated): the first step after a
        backward decides for the optimizers it wrote, all or nothing (decision.py says how it
        knows them); a loss scaled after a step starts a new pass, decided on its own gradients
        as stock decides each optimizer (a GAN's D and G). The scale backs off once when any
        overflowed. `per_optimizer=True` gives stock's decisions. Optimizers whose own `step`
        supports amp scaling (torch's fused ones) get stock's protocol (stock.py).
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
            retval = stock.step_unscaling_itself(self, optimizer, state, args, kwargs)
        else:
            if state["stage"] is OptState.READY:
                self.unscale_(optimizer)
            retval = None
            if not self._decision.must_skip(optimizer):
                retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        self._decision.stepped(optimizer)
        return retval

    # What the decision (decision.py) is handed: how flags are read in this mode, device, rank.

    def _agree(self, flags: Sequence[torch.Tensor]) -> bool:
        """Combine ``flags``, sum them over the ranks when several take part, and read the
        result: the one host sync of a step, as in stock."""
        scale = self._require_scale("step")
        flags = [flag.to(scale.device, non_blocking=True) for flag in flags]
        if not flags:
            flag = torch.zeros((), dtype=torch.float32, device=scale.device)
        elif len(flags) == 1:
            flag = flags[0]
        else:
            flag = torch.stack(flags).sum()
        if distributed.should_reduce(self.is_distributed, self.process_group):
            flag = distributed.agree(flag.clone(), self.process_group)
        return bool(flag.item())

    def _precheck(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """Whether ``optimizer``'s still-scaled gradients overflowed, touching none of them;
        None on the chip, whose float status already covers every gradient since scale()."""
        if self._chip_status:
            return None
        scale = self._require_scale("step")
        with torch.no_grad():
            groups = overflow.gradient_groups(
                overflow.optimizer_params(optimizer),
                allow_fp16=True,
                coalesce_sparse=self.overflow_mode is OverflowMode.SATURATION,
                in_place=False,
            )
            return overflow.check_only(groups, self.overflow_mode, scale.device)

    def _read_alone(self, found: dict[torch.device, torch.Tensor]) -> bool | None:
        """One optimizer's flag read directly: one device, no float status, one rank."""
        if len(found) != 1 or self._chip_status:
            return None
        if distributed.should_reduce(self.is_distributed, self.process_group):
            return None
        (flag,) = found.values()
        return bool(flag.item())

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Move the scale by the rule once for this update (or set it to ``new_scale``), count a
        skipped update, and raise RuntimeError when the stuck-run guard trips."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            self._set_scale(new_scale)
            overflowed = self._decision.so_far()
            skipped = self._state.skipped + overflowed
            self._finish_update(dataclasses.replace(self._state, skipped=skipped), overflowed)
            return
        overflowed = self._decision.outcome()
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
        self._previous = self._decision.parts()
        self._begin_update()

    def _begin_update(self) -> None:
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _new_decision(self) -> None:
        """The decision of an update over the current per-optimizer states (stock.py)."""
        self._decision = UpdateDecision(
            self._per_optimizer_states,
            self._previous,
            self.per_optimizer,
            self._agree,
            self._precheck,
            self._read_alone,
        )
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
        ``names``) and take it with ``scale``, keeping stock's attributes in step with it. A
        growth factor of 1 is taken here, as stock's setter and state dict take it."""
        init, self._rule = DynamicRule.validated(
            scale,
            names={**SCALER_NAMES, **(names or {}), "init_loss_scale": scale_name},
            lowest=0.0,
            growth_may_stop=True,
            **{**dataclasses.asdict(self._rule), **changes},
        )
        self._state = dataclasses.replace(self._state, scale=to_float32(init))
        self._growth_factor = self._rule.incr_ratio
        self._backoff_factor = self._rule.decr_ratio
        self._growth_interval = self._rule.incr_every_n_steps
        self._store_scale()

    def get_growth_factor(self) -> float:
        return self._rule.incr_ratio

    def set_growth_factor(self, new_factor: float) -> None:
        self._take_written_scale()
        self._rebuild(self._state.scale, incr_ratio=new_factor)

    def get_backoff_factor(self) -> float:
        return self._rule.decr_ratio

    def set_backoff_factor(self, new_factor: float) -> None:
        self._take_written_scale()
        self._rebuild(self._state.scale, decr_ratio=new_factor)

    def get_growth_interval(self) -> int:
        return self._rule.incr_every_n_steps

    def set_growth_interval(self, new_interval: int) -> None:
        self._take_written_scale()
        self._rebuild(self._state.scale, incr_every_n_steps=new_interval)

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Stock's five entries, torch-npu's "dynamic", and the rest of the Ascend rule's
        settings and counters, so a checkpoint resumes the rule exactly."""
        if not self._enabled:
            return {}
        self._take_written_scale()
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
        checkpoint.require_scaler_state(state_dict)
        counts = {
            field: checkpoint.count(state_dict, key, getattr(self._state, field))
            for key, field in checkpoint.COUNTS.items()
        }
        dynamic = self.dynamic
        if "dynamic" in state_dict:
            dynamic = check_bool("state_dict['dynamic']", state_dict["dynamic"])
        changes = {
            name: state_dict[key] for key, name in checkpoint.SETTINGS.items() if key in state_dict
        }
        floor = changes.get("min_loss_scale", self._rule.min_loss_scale)
        scale = checkpoint.scale_to_resume(state_dict["scale"], floor)
        names = {name: f"state_dict[{key!r}]" for key, name in checkpoint.SETTINGS.items()}
        self._rebuild(scale, "state_dict['scale']", names, **changes)
        self.dynamic = dynamic
        self._state = RuleState(self._state.scale, **counts)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Older pickles lack what was added since (_fused, per_optimizer, _uninvertible, which
        # the next scale() sets). A scaler is pickled between updates, so the per-update
        # bookkeeping starts afresh, in this version's shape whatever the pickle's.
        defaults = {
            "_fused": overflow.FusedOp(),
            "per_optimizer": False,
            "_uninvertible": False,
            "_stored": None,
        }
        self.__dict__.update({**defaults, **state})
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
        state.update(_scale=None, _inv_scale=None, _stored=None, _previous=[], _decision=None)
        return state
