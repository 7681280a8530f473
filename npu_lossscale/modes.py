"""Which floating-point overflow mode the NPU runs in, and so how an overflow must be detected.

In saturation mode an overflowing result is clamped to the dtype's max instead of becoming inf, so
an inf/NaN check alone misses it; in INF/NAN mode (IEEE) that check is exactly right. A wrong guess
either applies corrupted steps or skips clean ones, so the resolved mode and the reason for it are
logged where the user can see them.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os

logger = logging.getLogger("npu_lossscale")

FP16_SATURATION_VALUE = 65504.0
"""Largest finite fp16 value: in saturation mode an overflowed fp16 result is clamped to +-this."""

ENV_VAR = "INF_NAN_MODE_ENABLE"

# Spellings users write in configs and shell exports besides the canonical values.
_ALIASES = {"infnan": "inf_nan", "inf/nan": "inf_nan", "inf-nan": "inf_nan"}


class OverflowMode(str, enum.Enum):
    """Overflow mode; AUTO is only a request and is never the result of resolution."""

    SATURATION = "saturation"
    INF_NAN = "inf_nan"
    AUTO = "auto"

    @classmethod
    def _missing_(cls, value: object) -> OverflowMode | None:
        # Lets OverflowMode("SATURATION") and OverflowMode("inf/nan") work like the canonical names.
        if isinstance(value, str):
            key = value.strip().lower()
            key = _ALIASES.get(key, key)
            for member in cls:
                if member.value == key:
                    return member
        return None

    @classmethod
    def parse(cls, value: OverflowMode | str) -> OverflowMode:
        """Turn a user-supplied mode into a member, with an error that says what is accepted."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"overflow_mode must be one of {valid} (any case); got {value!r}")


_logged: set[tuple[OverflowMode, str]] = set()


def _log_once(mode: OverflowMode, source: str) -> None:
    if (mode, source) not in _logged:
        _logged.add((mode, source))
        logger.info("npu_lossscale: overflow mode %s (decided by %s)", mode.value, source)


def _runtime_mode() -> OverflowMode | None:
    """Ask the Ascend runtime which mode the device is in, if the adapter is installed.

    Best effort and untestable off an Ascend host: the adapter is looked up lazily (never imported
    at module load, never required), and any failure means "unknown" so the next source decides.
    pyACL reports 0 for saturation and 1 for INF/NAN.
    """
    try:
        if not any(importlib.util.find_spec(n) for n in ("npu_bridge", "npu_device")):
            return None
        if importlib.util.find_spec("acl") is None:
            return None
        import acl  # only present on Ascend hosts

        result = acl.rt.get_device_sat_mode()
        # Some pyACL versions return (mode, status); status 0 means success.
        if isinstance(result, tuple):
            mode_value, status = result[0], result[-1]
            if status != 0:
                return None
        else:
            mode_value = result
        return {0: OverflowMode.SATURATION, 1: OverflowMode.INF_NAN}.get(int(mode_value))
    except Exception:  # any runtime trouble means "unknown", not a crash
        return None


def _env_mode() -> OverflowMode | None:
    raw = os.environ.get(ENV_VAR)
    if raw is None:
        return None
    value = raw.strip()
    if value == "1":
        return OverflowMode.INF_NAN
    if value == "0":
        return OverflowMode.SATURATION
    raise ValueError(
        f"environment variable {ENV_VAR} must be '1' (INF/NAN mode) or '0' (saturation mode); "
        f"got {raw!r}"
    )


def resolve_overflow_mode(mode: OverflowMode | str = "auto") -> OverflowMode:
    """Resolve AUTO to a concrete mode: explicit argument, Ascend runtime, env var, else INF/NAN.

    INF/NAN is the fallback because it is what IEEE hardware (GPUs, CPUs, Atlas A2/A3 by default)
    does, so tests and CPU runs behave like the device a new user most likely has.
    """
    requested = OverflowMode.parse(mode)
    if requested is not OverflowMode.AUTO:
        _log_once(requested, "explicit overflow_mode argument")
        return requested
    from_runtime = _runtime_mode()
    if from_runtime is not None:
        _log_once(from_runtime, "the Ascend runtime's device setting")
        return from_runtime
    from_env = _env_mode()
    if from_env is not None:
        _log_once(from_env, f"environment variable {ENV_VAR}")
        return from_env
    _log_once(OverflowMode.INF_NAN, "default (no argument, Ascend runtime or environment variable)")
    return OverflowMode.INF_NAN
