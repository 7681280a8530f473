"""The framework-free rule's edges the mutation run (benchmarks/mutation.py, issue 30) found
unpinned; expected scales are worked out by hand from DESIGN.md's update rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from npu_lossscale.rule import (
    DynamicRule,
    RuleState,
    check_bool,
    check_optional_bool,
    to_float32,
)


def test_a_floor_equal_to_the_ceiling_pins_the_scale() -> None:
    init, rule = DynamicRule.validated(8, 1, 1, 2, 0.5, min_loss_scale=8, max_loss_scale=8)
    state = RuleState(init)
    for finite in (True, False, True, True, False):
        state = rule.step(state, finite)
        assert state.scale == 8.0
    assert state.skipped == 2


def test_a_floor_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match=r"min_loss_scale \(16\) must not exceed max_loss_scale"):
        DynamicRule.validated(16, 1, 1, 2, 0.5, min_loss_scale=16, max_loss_scale=8)


def test_a_growth_past_float32_keeps_the_scale() -> None:
    """2**127 * 2 does not fit in float32 (it rounds to inf there): the scale stays."""
    init, rule = DynamicRule.validated(2.0**127, 1, 1, 2, 0.5)
    assert rule.step(RuleState(init), True).scale == 2.0**127
    assert to_float32(2.0**128) == math.inf
    assert to_float32(-(2.0**128)) == -math.inf


def test_a_scale_below_one_is_refused_with_the_floor_to_pass() -> None:
    """Where the front-end allows scales below 1 (torch's), an init below the default floor of 1
    is refused with the way out; an init below a floor already under 1 gets no such hint."""
    with pytest.raises(ValueError, match="a scale below 1 needs a floor below 1 too"):
        DynamicRule.validated(0.5, 1, 1, 2, 0.5, lowest=0.0)
    with pytest.raises(ValueError, match=r"must not be below min_loss_scale \(0.5\)$"):
        DynamicRule.validated(0.25, 1, 1, 2, 0.5, min_loss_scale=0.5, lowest=0.0)


@pytest.mark.parametrize(
    ("init", "floor", "hinted"),
    [(0.5, 2, True), (0.5, 1, True), (2, 4, False), (1, 8, False)],
)
def test_only_an_init_below_1_under_a_floor_of_1_or_more_gets_the_below_1_hint(
    init: float, floor: float, hinted: bool
) -> None:
    """Any floor of 1 or more (not only the default 1) needs lowering for an init below 1, so
    the hint names the floor to pass; an init of 1 or more under a higher floor is not 'a scale
    below 1', and its error says only that it is below the floor."""
    with pytest.raises(ValueError, match="must not be below min_loss_scale") as refused:
        DynamicRule.validated(init, 1, 1, 2, 0.5, min_loss_scale=floor, lowest=0.0)
    hint = f"a scale below 1 needs a floor below 1 too: pass min_loss_scale={init!r}"
    assert (hint in str(refused.value)) is hinted, str(refused.value)


@pytest.mark.parametrize("flag", [np.bool_(True), np.bool_(False), 1, 0, True])
def test_numpy_booleans_and_0_1_are_flags(flag: object) -> None:
    assert check_bool("dynamic", flag) is bool(flag)


@pytest.mark.parametrize("flag", [2, "yes", None, 1.0])
def test_anything_else_is_not_a_flag(flag: object) -> None:
    with pytest.raises(ValueError, match="dynamic must be True or False"):
        check_bool("dynamic", flag)


@pytest.mark.parametrize(
    ("floor", "advice"),
    [(2.0, "The floor may be too high"), (1.0, "The loss is not scaled up at this floor")],
)
def test_the_stuck_message_advises_by_the_floor(floor: float, advice: str) -> None:
    _, rule = DynamicRule.validated(
        8, 1, 1, 2, 0.5, min_loss_scale=floor, max_skipped_steps_at_floor=3
    )
    assert advice in rule.stuck_message("saturation")


def test_the_stuck_guard_fires_at_a_limit_past_small_integers() -> None:
    """300 skips in a row at the floor with max_skipped_steps_at_floor=300: stuck, not before."""
    init, rule = DynamicRule.validated(1, 1, 1, 2, 0.5, max_skipped_steps_at_floor=300)
    state = RuleState(init)
    for _ in range(299):
        state = rule.step(state, False)
    assert not rule.is_stuck(state)
    state = rule.step(state, False)
    assert state.skips_at_floor == 300 and rule.is_stuck(state)


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("incr_ratio", 1 + 1e-9), ("incr_ratio", 1.0), ("decr_ratio", 1 - 1e-10), ("decr_ratio", 1.0)],
)
def test_a_ratio_that_is_1_in_float32_is_refused(keyword: str, value: float) -> None:
    """The devices multiply in float32, where these ratios are exactly 1: the scale would never
    move. Refused even where the Python float itself is inside the interval."""
    ratios = {"incr_ratio": 2.0, "decr_ratio": 0.5, keyword: value}
    with pytest.raises(ValueError, match=f"{keyword} must be a finite number in"):
        DynamicRule.validated(8, 1, 1, ratios["incr_ratio"], ratios["decr_ratio"])


@pytest.mark.parametrize("keyword", ["init", "min_loss_scale", "max_loss_scale"])
@pytest.mark.parametrize("value", [3.5e38, 1e39])
def test_a_scale_past_float32_is_refused(keyword: str, value: float) -> None:
    """A finite Python number above float32's largest (3.4028235e38) would be inf on the device:
    refused as the initial scale, the floor or the ceiling, not stored as inf."""
    init = value if keyword == "init" else 8.0
    extras = {} if keyword == "init" else {keyword: value}
    if keyword == "min_loss_scale":
        init = value  # an init below a floor is refused for another reason
    with pytest.raises(ValueError, match="that fits in float32; got"):
        DynamicRule.validated(init, 1, 1, 2, 0.5, **extras)


def test_an_optional_flag_names_none_in_its_error() -> None:
    """The Keras and torch front-ends take None for is_distributed (their default): a bad value's
    message lists it beside True and False."""
    assert check_optional_bool("is_distributed", None) is None
    assert check_optional_bool("is_distributed", 1) is True
    with pytest.raises(ValueError, match=r"^is_distributed must be True, False or None; got 2$"):
        check_optional_bool("is_distributed", 2)
