"""The checks of `GradScaler.load_state_dict`: what a scaler's state dict holds, and what is not
one (a whole checkpoint, an optimizer's state dict, a malformed entry), said with the entry's name
before anything is loaded.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import torch

# state-dict key -> the rule's own name for it
SETTINGS = {
    "growth_interval": "incr_every_n_steps",
    "growth_factor": "incr_ratio",
    "backoff_factor": "decr_ratio",
    "decr_every_n_nan_or_inf": "decr_every_n_nan_or_inf",
    "min_loss_scale": "min_loss_scale",
    "max_loss_scale": "max_loss_scale",
    "max_skipped_steps_at_floor": "max_skipped_steps_at_floor",
}
# state-dict key -> the RuleState counter it holds
COUNTS = {
    "_growth_tracker": "good",
    "_bad_steps": "bad",
    "_skipped_steps": "skipped",
    "_skips_at_floor": "skips_at_floor",
}


def require_scaler_state(state_dict: Any) -> None:
    """A scaler's state dict has a "scale" (stock raises KeyError: 'scale' without one). Say what
    was passed instead where it is recognisable: a whole checkpoint holding the scaler's state
    under some key, or an optimizer's state dict."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict; got {type(state_dict).__name__}")
    if "scale" in state_dict:
        return
    keys = sorted(map(str, state_dict))
    inner = [k for k, v in state_dict.items() if isinstance(v, dict) and "scale" in v]
    if inner:
        what = (
            f"a whole checkpoint (keys {keys}); the scaler's state is under {inner[0]!r}: "
            f"load_state_dict(checkpoint[{inner[0]!r}])"
        )
    elif {"state", "param_groups"} <= set(state_dict):
        what = "an optimizer's state dict; pass the one scaler.state_dict() returned"
    else:
        what = f"a dict with the keys {keys}, not a GradScaler's state dict"
    raise KeyError(f"GradScaler.load_state_dict: no 'scale' entry: this is {what}")


def count(state_dict: dict[str, Any], key: str, current: int) -> int:
    """A counter entry (stock's _growth_tracker, the rule's others): a non-negative integer,
    as an int, an integral float or a one-element tensor; ``current`` where absent."""
    value = state_dict.get(key, current)
    number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    integral = isinstance(number, numbers.Integral) or (
        isinstance(number, float) and number.is_integer()
    )
    if isinstance(number, bool) or not integral or number < 0:
        raise ValueError(f"state_dict[{key!r}] must be a non-negative integer; got {value!r}")
    return int(number)


def scale_to_resume(scale: object, floor: object) -> object:
    """The entry "scale" (a one-element tensor read as its number). One below the floor, as
    stock's scale becomes after many overflows (0 at last), is raised to the floor with a
    warning, so such a run can resume; anything else is left for the rule's own checks."""
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.item()
    numeric = isinstance(scale, numbers.Real) and isinstance(floor, numbers.Real)
    if numeric and 0 <= scale < floor:
        warnings.warn(
            f"npu_lossscale: the loaded scale {scale!r} is below min_loss_scale ({floor!r}), "
            "as stock torch's scale becomes after many overflows; training resumes from "
            f"the floor, {floor!r}",
            stacklevel=3,
        )
        return floor
    return scale
