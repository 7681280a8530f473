"""The framework-free rule's edges the mutation run (benchmarks/mutation.py, issue 30) found
unpinned; expected scales are worked out by hand from DESIGN.md's update rule."""

from __future__ import annotations

import pytest

from npu_lossscale.rule import DynamicRule, RuleState


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
