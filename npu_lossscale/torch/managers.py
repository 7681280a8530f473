"""The Ascend adapter's loss-scale managers, for PyTorch scripts (no TensorFlow needed).

Same names, positional signatures and rule as the TF managers (npu_lossscale.tf.managers), so a
script ported from TF1 and its PyTorch sibling read alike. A manager is what
`GradScaler.from_manager` reads to get the adapter's rule step for step; a script may also drive
one by hand (`loss * manager()`, then `manager.update_loss_scale(finite)`), as the vendor FAQ's
loops do, and then gets the same all-reduced decision the scaler takes. The state is plain Python:
the decision reaches the host anyway (a script branches on it), so the rule runs as
`DynamicRule.step` itself.
"""

from __future__ import annotations

import dataclasses

import torch

from npu_lossscale.modes import OverflowMode
from npu_lossscale.rule import (
    DynamicRule,
    RuleState,
    check_bool,
    check_optional_bool,
    check_scale,
    manager_keywords,
    to_float32,
)
from npu_lossscale.torch import distributed, overflow

SCALER_NAMES = {
    "init_loss_scale": "init_scale",
    "incr_every_n_steps": "growth_interval",
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
}
"""GradScaler's words for the rule's arguments: its errors name what the user wrote, and
scaler_arguments passes a manager's rule under them (npu_lossscale.rule.manager_keywords)."""


class LossScaleManager:
    """Common base: a scale to multiply the loss by and a once-per-step update."""

    enable_overflow_check: bool

    def __init__(self, scale: float, overflow_mode: OverflowMode | str, is_distributed: object):
        self.is_distributed = check_optional_bool("is_distributed", is_distributed)
        self.overflow_mode = overflow.resolve_mode(overflow_mode)
        self._state = RuleState(to_float32(scale))

    def get_loss_scale(self) -> torch.Tensor:
        """The current scale as a float32 scalar tensor (on the CPU; it multiplies a loss on any
        device)."""
        return torch.tensor(self._state.scale, dtype=torch.float32)

    def __call__(self) -> torch.Tensor:
        """The current scale, as TensorFlow's LossScale objects give it when called."""
        return self.get_loss_scale()

    @property
    def skipped_steps(self) -> int:
        """Steps reported as overflowed, i.e. not applied."""
        return self._state.skipped

    def update_loss_scale(self, finite_grads: bool | torch.Tensor) -> None:
        """Record one step whose gradients were finite or not; with several ranks (is_distributed
        None and an initialised group, or True) the flag is summed over them first, so every
        rank moves its scale the same way."""
        if isinstance(finite_grads, torch.Tensor):
            if finite_grads.dtype != torch.bool or finite_grads.numel() != 1:
                raise ValueError(
                    "finite_grads must be a bool or a one-element bool tensor; got "
                    f"{finite_grads.dtype} of shape {tuple(finite_grads.shape)}"
                )
            overflowed = torch.logical_not(finite_grads).float().reshape(())
        else:
            overflowed = float(not check_bool("finite_grads", finite_grads))
        if distributed.should_reduce(self.is_distributed):
            flag = torch.as_tensor(overflowed, dtype=torch.float32).clone()
            overflowed = distributed.agree(flag)
        finite = not bool(overflowed)
        self._state = self._next_state(finite)

    def _next_state(self, finite: bool) -> RuleState:
        raise NotImplementedError


class FixedLossScaleManager(LossScaleManager):
    """Constant loss scale; overflowed steps are still skipped (and counted) when checked."""

    def __init__(
        self,
        loss_scale: float,
        enable_overflow_check: bool = True,
        *,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool | None = None,
    ) -> None:
        scale = check_scale("loss_scale", loss_scale)
        self.enable_overflow_check = check_bool("enable_overflow_check", enable_overflow_check)
        super().__init__(scale, overflow_mode, is_distributed)

    def _next_state(self, finite: bool) -> RuleState:
        skipped = not finite and self.enable_overflow_check
        return dataclasses.replace(self._state, skipped=self._state.skipped + skipped)


class ExponentialUpdateLossScaleManager(LossScaleManager):
    """Dynamic loss scale: shrink after overflows (with the adapter's hysteresis), grow after a
    run of clean steps; floor, ceiling and stuck-run guard as in the TF manager."""

    enable_overflow_check = True

    def __init__(
        self,
        init_loss_scale: float,
        incr_every_n_steps: int,
        decr_every_n_nan_or_inf: int = 2,
        incr_ratio: float = 2,
        decr_ratio: float = 0.8,
        *,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool | None = None,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        max_skipped_steps_at_floor: int | None = None,
    ) -> None:
        init, self._rule = DynamicRule.validated(
            init_loss_scale,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            incr_ratio,
            decr_ratio,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            max_skipped_steps_at_floor=max_skipped_steps_at_floor,
        )
        super().__init__(init, overflow_mode, is_distributed)

    @property
    def rule(self) -> DynamicRule:
        """The validated update rule (what GradScaler.from_manager takes over)."""
        return self._rule

    def _next_state(self, finite: bool) -> RuleState:
        state = self._rule.step(self._state, finite)
        if self._rule.is_stuck(state):
            self._state = state
            raise RuntimeError(self._rule.stuck_message(self.overflow_mode.value))
        return state


def scaler_arguments(
    manager: FixedLossScaleManager | ExponentialUpdateLossScaleManager,
) -> tuple[float, dict[str, object]]:
    """The manager's current scale and the GradScaler arguments that give its rule step for step
    and its overflow mode (GradScaler.from_manager)."""
    if not isinstance(manager, (FixedLossScaleManager, ExponentialUpdateLossScaleManager)):
        hint = ""
        if type(manager).__module__.startswith("npu_lossscale."):
            hint = " (the TensorFlow managers live in npu_lossscale; use npu_lossscale.torch's)"
        raise ValueError(
            "manager must be an npu_lossscale.torch FixedLossScaleManager or "
            f"ExponentialUpdateLossScaleManager; got {manager!r}{hint}"
        )
    dynamic = isinstance(manager, ExponentialUpdateLossScaleManager)
    if not dynamic and not manager.enable_overflow_check:
        raise ValueError(
            "manager: a FixedLossScaleManager with enable_overflow_check=False never "
            "skips a step, which a GradScaler always does on overflow; multiply the loss "
            "and divide the gradients by the constant yourself instead"
        )
    settings = manager_keywords(manager.rule if dynamic else None, SCALER_NAMES)
    return manager._state.scale, {**settings, "overflow_mode": manager.overflow_mode}
