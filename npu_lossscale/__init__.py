"""Loss scaling for Ascend NPUs, drop-in for the Ascend TensorFlow adapter's classes of that name.

One import line is all a ported script changes; everything else reads as in the vendor's guide.

The root holds the framework-free core (overflow modes, the update rule) and loads the TF1-graph
names lazily, so `import npu_lossscale.torch` never pulls in TensorFlow and
`import npu_lossscale` alone costs nothing until a TF name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from npu_lossscale.modes import OverflowMode

# Public names of the TF1-graph front-end, resolved on first access (PEP 562).
_TF_NAMES = (
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "LossScaleLoggingHook",
    "LossScaleManager",
    "NPULossScaleOptimizer",
    "register_ops",
)

__all__ = ["OverflowMode", *_TF_NAMES]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _TF_NAMES:
        value = getattr(importlib.import_module("npu_lossscale.tf"), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'npu_lossscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TF_NAMES))
