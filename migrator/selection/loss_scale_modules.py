"""Which modules of the run build a LossScaleOptimizer: a project-level fact read from bytes.

Dreamer's dreamer.py sets the mixed_float16 policy and trains through `tools.Optimizer`, which
tools.py wraps in a LossScaleOptimizer: nothing in dreamer.py names the class, yet Keras wraps
nothing there, and a keras-implicit-loss-scale warning on it would be false. A byte scan of every
file read finds the modules that call the class, by the name other files import them under.
"""

from __future__ import annotations

import re

from migrator.selection.reexports import module_name

# A call of the class on a line that is not a comment (`prec.LossScaleOptimizer(opt, "dynamic")`).
_BUILDS = re.compile(rb"^[^#\n]*\bLossScaleOptimizer\s*\(", re.M)


def builds_loss_scale_optimizer(path: str, data: bytes) -> str | None:
    """The module's name as other files import it (its stem), where it calls the class."""
    if b"LossScaleOptimizer" not in data or _BUILDS.search(data) is None:
        return None
    return module_name(path)
