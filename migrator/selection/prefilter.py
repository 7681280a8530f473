"""Byte-level gates: which files, and which codemod stages, can possibly matter.

Kept free of libcst so that a tree with nothing to port never pays for loading the parser, and so
each stage of the transform can be skipped before any parsing or scope analysis when the bytes of
a file cannot contain what that stage looks for.
"""

from __future__ import annotations

# Substrings every loss-scale API the port rewrites or reports must spell out somewhere.
LOSS_SCALE_TRIGGERS: tuple[bytes, ...] = (
    b"mixed_precision",
    b"LossScale",
    b"loss_scale",
    b"enable_mixed_precision_graph_rewrite",
    b"set_dtype_policy",  # keras.config's: a mixed_float16 policy brings Keras's own scaling
)

# Every PyTorch gradient scaler the torch port rewrites or reports is spelled with this.
TORCH_TRIGGERS: tuple[bytes, ...] = (b"GradScaler", b"apex")  # apex: its own loss scaling

# A file defining an optimizer class matters to the global-step move even when it mentions no
# loss scaling.
GLOBAL_STEP_TRIGGERS: tuple[bytes, ...] = (b"def apply_gradients",)

_TRIGGERS = (*LOSS_SCALE_TRIGGERS, *TORCH_TRIGGERS, *GLOBAL_STEP_TRIGGERS)

# With --add-loss-scale, a file that trains with an optimizer matters even without loss scaling.
ADD_LOSS_SCALE_TRIGGERS: tuple[bytes, ...] = (b"Optimizer", b"optimizer")


def might_need_migration(source: bytes, *, add_loss_scale: bool = False) -> bool:
    """Cheap pre-filter: a file without any trigger substring cannot hold anything to port."""
    return (
        any(t in source for t in _TRIGGERS)
        or _dynamic_contrib(source)
        or _steps(source)
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
    return b"global_step" in source and b"assign" in source
