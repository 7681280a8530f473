"""Hand-derived trajectories of the distributed scenarios in tests/library/tf/workers/training.py.

Two replicas (devices or workers) each compute gradient w * poison of 0.5 * sum(w**2) * poison. The
inner optimizer (plain gradient descent, lr 0.25) sums the two replicas' gradients, so a clean step
moves w by 0.25 * 2w: w -> w / 2. An overflow anywhere changes no weight and no global step. The
manager starts at 256, grows x2 after 2 clean steps in a row, halves on every overflow.

"mixed" poisons replica 1 at step 1 and replica 0 at step 4:
  step 0 clean    w/2   scale 256 good 1
  step 1 overflow w/2   scale 128 good 0  skipped 1
  step 2 clean    w/4   scale 128 good 1
  step 3 clean    w/8   scale 256 good 0  (grown)
  step 4 overflow w/8   scale 128 good 0  skipped 2
  step 5 clean    w/16  scale 128 good 1
"clean" has four clean steps: w/2 256, w/4 512 (grown), w/8 512, w/16 1024 (grown).
"""

from __future__ import annotations

import numpy as np

W0 = np.array([1.0, -2.0])


def _step(divisor: int, scale: float, good: int, skipped: int, global_step: int) -> dict:
    return {
        "w": W0 / divisor,
        "scale": scale,
        "good_steps": good,
        "skipped": skipped,
        "global_step": global_step,
    }


EXPECTED = {
    "mixed": [
        _step(2, 256.0, 1, 0, 1),
        _step(2, 128.0, 0, 1, 1),
        _step(4, 128.0, 1, 1, 2),
        _step(8, 256.0, 0, 1, 3),
        _step(8, 128.0, 0, 2, 3),
        _step(16, 128.0, 1, 2, 4),
    ],
    "clean": [
        _step(2, 256.0, 1, 0, 1),
        _step(4, 512.0, 0, 0, 2),
        _step(8, 512.0, 1, 0, 3),
        _step(16, 1024.0, 0, 0, 4),
    ],
}
