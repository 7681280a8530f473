"""What an Ascend chip in saturation mode makes of overflowing values, for injecting them in tests.

In saturation mode an fp16 result that overflows is clamped to +-65504 and an invalid one (NaN)
comes out as 0, so the gradients the software sees are finite: exactly the case an inf/NaN check
misses and the saturation rule must catch.
"""

from __future__ import annotations

import numpy as np

SATURATED = 65504.0


def saturate(x: np.ndarray | float) -> np.ndarray:
    """Values as the chip produces them in saturation mode: clamp to +-65504, NaN becomes 0."""
    values = np.asarray(x, dtype=np.float32)
    return np.clip(
        np.nan_to_num(values, nan=0.0, posinf=SATURATED, neginf=-SATURATED), -SATURATED, SATURATED
    ).astype(np.float32)
