"""The manager `--add-loss-scale dynamic|N` asks for, kept free of libcst.

Apart from the codemod so the CLI can reject a bad value before it reads any file, without paying
for loading the parser.
"""

from __future__ import annotations

import math

from migrator.codemods.shared import api

# The seed's values for a dynamic scale (the vendor guide's own example), one line each.
_DYNAMIC = (
    "init_loss_scale=2**32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,",
    "decr_ratio=0.5",
)


def manager_call(choice: str, *, multiline: bool = False) -> tuple[str, str]:
    """(manager class, constructor call) for `dynamic` or a fixed scale N; ValueError otherwise.

    `multiline` puts a long call's arguments on lines indented four spaces, for a statement:
    libcst adds the indentation of the block the statement lands in.
    """
    if choice == "dynamic":
        if not multiline:
            return api.DYNAMIC, f"{api.DYNAMIC}({' '.join(_DYNAMIC)})"
        lines = "".join(f"\n    {line}" for line in _DYNAMIC)
        return api.DYNAMIC, f"{api.DYNAMIC}({lines})"
    try:
        value = float(choice)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ValueError(f"expected 'dynamic' or a fixed loss scale of at least 1, got {choice!r}")
    number = str(int(value)) if value.is_integer() else repr(value)
    return api.FIXED, f"{api.FIXED}({number})"
