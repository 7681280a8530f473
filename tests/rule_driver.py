"""Drive the library's own rule over a list of steps, the trace every front-end must match.

A test helper, not library code: the library steps the rule one decision at a time.
"""

from __future__ import annotations

from npu_lossscale.rule import DynamicRule, RuleState, to_float32


def run(rule: DynamicRule, init_loss_scale: float, steps: list[bool]) -> list[RuleState]:
    """States after each of ``steps`` from a fresh start."""
    state = RuleState(to_float32(init_loss_scale))
    states = []
    for finite in steps:
        state = rule.step(state, finite)
        states.append(state)
    return states
