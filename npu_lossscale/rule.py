"""The loss-scale update rule and its argument checks, written once for every front-end.

Framework-free on purpose (plain Python, no numpy): the TF1, Keras and PyTorch front-ends each run
the rule on their own device tensors, but they validate their arguments and flags here
(`DynamicRule.validated`, `check_bool`), take a manager's settings over through one mapping
(`manager_keywords`), and are tested against `DynamicRule.step`, so the three can never drift
apart. Arithmetic rounds to float32 after every
multiplication because that is what the devices compute: a scale of 0.8 * 2**15 is not the same
number in float64.

The rule (tf.contrib's and the Ascend adapter's): state is the scale, a good-step counter and a
bad-step counter.
- finite step: if good + 1 >= incr_every_n_steps, multiply the scale by incr_ratio (clamped to
  max_loss_scale, or kept when the product leaves the float32 range) and reset both counters;
  otherwise good += 1.
- overflow step: if bad + 1 >= decr_every_n_nan_or_inf, scale = max(min_loss_scale,
  scale * decr_ratio) and reset both counters; otherwise bad += 1 and good = 0.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from collections.abc import Mapping

FLOAT32_MAX = 3.4028234663852886e38
"""Largest finite float32: a scale beyond it would be inf on the device."""


def to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as a Python float (inf past the range)."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # struct refuses what rounds past float32's range
        return math.copysign(math.inf, value)


def check_scale(name: str, value: object, lowest: float = 1.0) -> float:
    """A loss scale must be a Python number in [lowest, float32 max]: below 1 it shrinks
    gradients instead of protecting them, so 1 unless a front-end's stock class goes lower (torch's
    scale may fall to 0), and a value float32 cannot hold would become inf on the device."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a Python number >= {lowest:g}; got {value!r}")
    number = float(value)
    if math.isnan(number) or math.isinf(number) or number < lowest or number > FLOAT32_MAX:
        raise ValueError(
            f"{name} must be a finite number >= {lowest:g} that fits in float32; got {value!r}"
        )
    return number


def check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def check_ratio(name: str, value: object, low: float, high: float | None) -> float:
    """Ratios live in an open interval: incr_ratio in (1, inf), decr_ratio in (0, 1).

    The devices multiply in float32, so the bounds must hold for the float32 value too: 1e50
    would become inf there, and the scale would silently stop growing (the ceiling rule keeps a
    scale whose increase is not finite); 1 + 1e-9 would become 1, and the scale would never grow.
    """
    bounds = f"({low:g}, {'inf' if high is None else f'{high:g}'})"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a Python number in {bounds}; got {value!r}")
    number = float(value)
    stored = to_float32(number)
    top = math.inf if high is None else high
    if not (low < number < top and low < stored < top):
        raise ValueError(
            f"{name} must be a finite number in {bounds}, also rounded to float32; got {value!r}"
        )
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` as a Python bool: the one check of every front-end's flags.

    True/False, numpy booleans (a comparison of numpy numbers) and 0/1 (flags read from configs)
    pass, as the vendor's classes, which only test a flag for truth, let ported scripts write them
    (``is_distributed=hvd.size() > 1``). Anything else -- a string, None, a tensor, 2 -- is more
    likely a misplaced argument than a flag, and is refused.
    """
    if isinstance(value, bool):
        return value
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")
    if numpy_bool or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{name} must be True or False; got {value!r}")


def check_optional_bool(name: str, value: object) -> bool | None:
    """None, where None means "decide automatically" (the Keras and torch front-ends'
    ``is_distributed``: reduce exactly when several replicas or ranks take part), or a flag as
    check_bool takes it; the error names None too, which these front-ends take (their default)."""
    if value is None:
        return None
    try:
        return check_bool(name, value)
    except ValueError:
        raise ValueError(f"{name} must be True, False or None; got {value!r}") from None


def _check_fixed_extras(dynamic: bool, max_skipped_steps_at_floor: int | None) -> None:
    """The stuck-run guard watches a dynamic scale at its floor; a fixed scale has no floor, so
    a guard given with one would never fire and is refused rather than silently ignored."""
    if not dynamic and max_skipped_steps_at_floor is not None:
        raise ValueError(
            "max_skipped_steps_at_floor applies only to a dynamic scale (the run is stuck when "
            "the scale cannot fall any further); with dynamic=False the scale never moves, as "
            "with npu_lossscale.FixedLossScaleManager, which has no such guard. Drop "
            "max_skipped_steps_at_floor, or use dynamic=True with min_loss_scale"
        )


@dataclasses.dataclass(frozen=True)
class RuleState:
    """Where the rule stands after some steps; every front-end keeps these numbers on its device."""

    scale: float
    good: int = 0
    bad: int = 0
    skipped: int = 0
    skips_at_floor: int = 0


# The rule's own field names; front-ends pass theirs (growth_interval, backoff_factor...) so an
# error names the argument the user actually wrote.
_DEFAULT_NAMES = {
    "init_loss_scale": "init_loss_scale",
    "incr_every_n_steps": "incr_every_n_steps",
    "decr_every_n_nan_or_inf": "decr_every_n_nan_or_inf",
    "incr_ratio": "incr_ratio",
    "decr_ratio": "decr_ratio",
    "min_loss_scale": "min_loss_scale",
    "max_loss_scale": "max_loss_scale",
    "max_skipped_steps_at_floor": "max_skipped_steps_at_floor",
}


@dataclasses.dataclass(frozen=True)
class DynamicRule:
    """Validated settings of the dynamic rule, and the rule itself as a pure function.

    max_skipped_steps_at_floor turns a silently stuck run into an error: when that many
    consecutive steps overflow even at min_loss_scale, lowering the scale cannot help, so the
    cause is NaN/inf in the data or model, or a diverging learning rate.
    """

    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int
    incr_ratio: float
    decr_ratio: float
    min_loss_scale: float = 1.0
    max_loss_scale: float | None = None
    max_skipped_steps_at_floor: int | None = None

    @classmethod
    def validated(
        cls,
        init_loss_scale: object,
        incr_every_n_steps: object,
        decr_every_n_nan_or_inf: object,
        incr_ratio: object,
        decr_ratio: object,
        *,
        min_loss_scale: object = 1.0,
        max_loss_scale: object = None,
        max_skipped_steps_at_floor: object = None,
        dynamic: bool = True,
        names: Mapping[str, str] | None = None,
        lowest: float = 1.0,
        growth_may_stop: bool = False,
    ) -> tuple[float, DynamicRule]:
        """Check every argument (errors name them as ``names`` says) and return (init, rule):
        the one construction every front-end and manager builds its rule with.

        Scales below ``lowest`` are refused: 1 for the adapter's rule, 0 where a front-end's
        stock class lets the scale fall below 1 (torch's), with min_loss_scale as the floor.
        ``dynamic=False`` (a fixed scale, which the Keras and torch front-ends still keep a rule
        for) refuses the settings only a moving scale can use. ``growth_may_stop`` also takes an
        incr_ratio of exactly 1 (no growth), which torch's setters and state dicts carry (scripts
        freeze the scale at a cap with `set_growth_factor(1)`), unlike its constructor."""
        label = {**_DEFAULT_NAMES, **(names or {})}
        init = check_scale(label["init_loss_scale"], init_loss_scale, lowest)
        low = check_scale(label["min_loss_scale"], min_loss_scale, lowest)
        high = (
            None
            if max_loss_scale is None
            else check_scale(label["max_loss_scale"], max_loss_scale, lowest)
        )
        if high is not None and low > high:
            raise ValueError(
                f"{label['min_loss_scale']} ({min_loss_scale!r}) must not exceed "
                f"{label['max_loss_scale']} ({max_loss_scale!r})"
            )
        if init < low:
            hint = ""
            # Only where the front-end allows scales below 1 (init >= lowest was checked).
            if init < 1 <= low:
                hint = (
                    f"; a scale below 1 needs a floor below 1 too: pass "
                    f"{label['min_loss_scale']}={init_loss_scale!r} (or 0, which lets the scale "
                    "fall as far as it must)"
                )
            raise ValueError(
                f"{label['init_loss_scale']} ({init_loss_scale!r}) must not be below "
                f"{label['min_loss_scale']} ({min_loss_scale!r}){hint}"
            )
        if high is not None and init > high:
            raise ValueError(
                f"{label['init_loss_scale']} ({init_loss_scale!r}) must not exceed "
                f"{label['max_loss_scale']} ({max_loss_scale!r})"
            )
        stuck = max_skipped_steps_at_floor
        rule = cls(
            incr_every_n_steps=check_count(label["incr_every_n_steps"], incr_every_n_steps),
            decr_every_n_nan_or_inf=check_count(
                label["decr_every_n_nan_or_inf"], decr_every_n_nan_or_inf
            ),
            incr_ratio=(
                1.0
                if growth_may_stop and not isinstance(incr_ratio, bool) and incr_ratio == 1
                else check_ratio(label["incr_ratio"], incr_ratio, 1.0, None)
            ),
            decr_ratio=check_ratio(label["decr_ratio"], decr_ratio, 0.0, 1.0),
            min_loss_scale=low,
            max_loss_scale=high,
            max_skipped_steps_at_floor=(
                None if stuck is None else check_count(label["max_skipped_steps_at_floor"], stuck)
            ),
        )
        _check_fixed_extras(dynamic, rule.max_skipped_steps_at_floor)
        return init, rule

    def step(self, state: RuleState, finite: bool) -> RuleState:
        """The state after one step whose (all-reduced) gradients were finite or not."""
        scale = to_float32(state.scale)
        if finite:
            if state.good + 1 >= self.incr_every_n_steps:
                grown = to_float32(scale * to_float32(self.incr_ratio))
                if self.max_loss_scale is not None:
                    grown = min(grown, to_float32(self.max_loss_scale))
                elif math.isinf(grown):
                    grown = scale
                return RuleState(grown, 0, 0, state.skipped, 0)
            return RuleState(scale, state.good + 1, state.bad, state.skipped, 0)
        floor = to_float32(self.min_loss_scale)
        at_floor = state.skips_at_floor + 1 if scale <= floor else 0
        if state.bad + 1 >= self.decr_every_n_nan_or_inf:
            shrunk = max(floor, to_float32(scale * to_float32(self.decr_ratio)))
            return RuleState(shrunk, 0, 0, state.skipped + 1, at_floor)
        return RuleState(scale, 0, state.bad + 1, state.skipped + 1, at_floor)

    def is_stuck(self, state: RuleState) -> bool:
        """Whether the stuck-run guard must stop training now."""
        limit = self.max_skipped_steps_at_floor
        return limit is not None and state.skips_at_floor >= limit

    def stuck_message(self, overflow_mode: str) -> str:
        # The guard fires the first time the count reaches the limit, and a step only counts when
        # it ran at the floor, so both numbers are known before training starts.
        # At a floor of 1 or less the loss is not scaled up at all, so its gradients overflow
        # unscaled: only a floor above 1 leaves a lower scale worth trying.
        if self.min_loss_scale > 1:
            advice = (
                "The floor may be too high: lower min_loss_scale, or check the data and model "
                "for NaN/inf"
            )
        else:
            advice = (
                "The loss is not scaled up at this floor, so a lower scale cannot help: check "
                "the data and model for NaN/inf"
            )
        return (
            f"npu_lossscale: {self.max_skipped_steps_at_floor} consecutive training steps were "
            f"skipped for gradient overflow with the loss scale at its floor "
            f"(loss scale {self.min_loss_scale:g} = min_loss_scale, "
            f"overflow_mode={overflow_mode}). {advice}, lower the learning rate, or check that "
            "the overflow mode matches the device (INF_NAN_MODE_ENABLE). Raise "
            "max_skipped_steps_at_floor, or set it to None, to keep going."
        )


def manager_keywords(
    rule: DynamicRule | None, names: Mapping[str, str] | None = None
) -> dict[str, object]:
    """A manager's scale settings as a front-end's constructor keywords: what ``from_manager``
    passes (Keras's two classes, torch's GradScaler) so that the front-end runs the manager's
    rule step for step. ``rule`` is the dynamic manager's; None is a fixed manager's constant
    scale. ``names`` renames the rule's fields to the front-end's arguments, as for
    ``DynamicRule.validated``; the scale itself and the overflow mode the caller adds."""
    if rule is None:
        return {"dynamic": False}
    label = {**_DEFAULT_NAMES, **(names or {})}
    fields = dataclasses.asdict(rule)
    return {"dynamic": True, **{label[field]: value for field, value in fields.items()}}
