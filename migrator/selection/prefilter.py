"""Byte-level gates: which files, and which codemod stages, can possibly matter.

Kept free of libcst so that a tree with nothing to port never pays for loading the parser, and so
each stage of the transform can be skipped before any parsing or scope analysis when the bytes of
a file cannot contain what that stage looks for. Every trigger is derived from migrator.registry:
add an API spelling there, not here.
"""

from __future__ import annotations

from migrator import registry
from migrator.selection import framework_fp16, torch_hand_loss_scale
from migrator.selection.hand_loss_scale import might_scale_by_hand


def _bytes(words: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(w.encode() for w in words)


# Substrings every loss-scale API the port rewrites or reports must spell out somewhere, derived
# from the registry's spellings (a new spelling none of them covers brings its own).
LOSS_SCALE_TRIGGERS: tuple[bytes, ...] = _bytes(
    registry.triggers(registry.tf_spellings(), registry.TF_MARKERS)
)

# Every PyTorch gradient scaler (and other loss scaling) the torch port rewrites or reports.
TORCH_TRIGGERS: tuple[bytes, ...] = _bytes(
    registry.triggers(registry.torch_spellings(), registry.TORCH_MARKERS)
)

# A file defining an optimizer class matters to the global-step move even when it mentions no
# loss scaling.
GLOBAL_STEP_TRIGGERS: tuple[bytes, ...] = (f"def {registry.STEP_METHOD}".encode(),)

_TRIGGERS = (*LOSS_SCALE_TRIGGERS, *TORCH_TRIGGERS, *GLOBAL_STEP_TRIGGERS)

# With --add-loss-scale, a file that trains with an optimizer matters even without loss scaling.
ADD_LOSS_SCALE_TRIGGERS: tuple[bytes, ...] = _bytes(registry.OPTIMIZER_WORDS)
_STEP_NAMES = _bytes(registry.STEP_NAMES)
_STEP_CALLS = _bytes(registry.STEP_CALL_PREFIXES)


def might_need_migration(source: bytes, *, add_loss_scale: bool = False) -> bool:
    """Cheap pre-filter: a file without any trigger substring cannot hold anything to port."""
    return (
        any(t in source for t in _TRIGGERS)
        or _dynamic_contrib(source)
        or _steps(source)
        or _hand_scaled(source)
        or (add_loss_scale and might_need_loss_scale_added(source))
    )


def might_need_loss_scale_added(source: bytes) -> bool:
    """False => --add-loss-scale can find no optimizer to wrap in this file."""
    return any(t in source for t in ADD_LOSS_SCALE_TRIGGERS)


def might_need_loss_scale_port(source: bytes) -> bool:
    """False => the loss-scale port can find nothing to rewrite or report in this file."""
    return any(t in source for t in LOSS_SCALE_TRIGGERS) or _dynamic_contrib(source)


def might_need_torch_port(source: bytes) -> bool:
    """False => the torch port can find no GradScaler to rewrite or report in this file."""
    return any(t in source for t in TORCH_TRIGGERS)


def _dynamic_contrib(source: bytes) -> bool:
    # `getattr(tf.contrib, name)` hides the API name from a plain substring search.
    return b"getattr" in source and b"contrib" in source


def _steps(source: bytes) -> bool:
    # A function advancing global_step by hand matters to the global-step move even without loss
    # scaling: an optimizer class it shares must not gain an increment (the step would advance
    # twice there).
    return any(n in source for n in _STEP_NAMES) and any(c in source for c in _STEP_CALLS)


def _hand_scaled(source: bytes) -> bool:
    # TF code scaling its loss by hand with its own is_finite check, torch code scaling its loss
    # by hand, and a training framework asked for fp16, need spell no trigger
    # (migrator.selection.hand_loss_scale, torch_hand_loss_scale and framework_fp16 decide; the
    # triage admits what they find).
    return (
        (b"is_finite" in source and might_scale_by_hand(source))
        or torch_hand_loss_scale.might_scale_by_hand(source)
        or framework_fp16.might_use(source)
    )
