"""The dynamic loss-scale rule written out step by step from its text, to check the TF code against.

Deliberately plain: Python branches where the library uses tf.where, numpy float32 so the rounding
of every multiplication matches what the device computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ReferenceState:
    scale: np.float32
    good: int = 0
    bad: int = 0
    skipped: int = 0


def reference_step(
    state: ReferenceState,
    finite: bool,
    *,
    incr_every_n_steps: int,
    decr_every_n_nan_or_inf: int,
    incr_ratio: float,
    decr_ratio: float,
    min_loss_scale: float = 1.0,
    max_loss_scale: float | None = None,
) -> ReferenceState:
    scale = np.float32(state.scale)
    if finite:
        if state.good + 1 >= incr_every_n_steps:
            with np.errstate(over="ignore"):
                bigger = scale * np.float32(incr_ratio)
            if max_loss_scale is not None:
                # Clamp to the cap.
                if bigger > np.float32(max_loss_scale):
                    bigger = np.float32(max_loss_scale)
                new_scale = bigger
            elif np.isinf(bigger):
                # Past the float32 range: keep the scale.
                new_scale = scale
            else:
                new_scale = bigger
            return ReferenceState(new_scale, 0, 0, state.skipped)
        return ReferenceState(scale, state.good + 1, state.bad, state.skipped)
    if state.bad + 1 >= decr_every_n_nan_or_inf:
        smaller = scale * np.float32(decr_ratio)
        if smaller < np.float32(min_loss_scale):
            smaller = np.float32(min_loss_scale)
        return ReferenceState(smaller, 0, 0, state.skipped + 1)
    return ReferenceState(scale, 0, state.bad + 1, state.skipped + 1)


def reference_run(
    init_loss_scale: float, steps: list[bool], **hyper: float | int | None
) -> list[ReferenceState]:
    """States after each step, starting from a fresh manager."""
    state = ReferenceState(np.float32(init_loss_scale))
    states = []
    for finite in steps:
        state = reference_step(state, finite, **hyper)
        states.append(state)
    return states
