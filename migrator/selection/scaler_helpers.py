"""Which functions of the run's files build a scaler, and which files call one of them.

icefall builds its scaler with `create_grad_scaler(init_scale=1.0)`, defined in icefall/utils.py,
and train.py reads `scaler._scale.item()` and stops below 1e-5. The port of utils.py cannot see
the guard and train.py cannot see a scaler constructor, so every file read is scanned here for
module-level `def name(` whose body builds a `GradScaler(` without setting `min_loss_scale`;
train.py's port then warns at its guard (migrator.codemods.torch.below_one).
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from migrator.selection.reexports import module_name

_DEF = re.compile(rb"^def[ \t]+(\w+)[ \t]*\(", re.M)
_TOP = re.compile(rb"^[^ \t\n#]", re.M)  # the next module-level statement ends a body


class ScalerHelper(NamedTuple):
    module: str  # how other files name its module in `from ... import` (its stem)
    name: str
    path: str  # as the report shows it


def scaler_helpers(path: str, data: bytes) -> set[ScalerHelper]:
    """Module-level functions of one file that build a GradScaler and leave its floor alone."""
    if b"GradScaler(" not in data or b"def " not in data:
        return set()
    found = set()
    for match in _DEF.finditer(data):
        rest = _TOP.search(data, match.end())
        body = data[match.end() : rest.start() if rest else len(data)]
        if b"GradScaler(" in body and b"min_loss_scale" not in body:
            found.add(ScalerHelper(module_name(path), match.group(1).decode("ascii"), path))
    return found


def calls_helper(data: bytes, helpers: frozenset[ScalerHelper]) -> bool:
    """Whether a file may call one of `helpers` (a byte check; the port decides).

    The port only follows `from <package.>module import name` (migrator.codemods.torch.below_one),
    so the file must spell the module right before an `import` too: a helper named `main` or
    `train` is called by nearly every script of a large tree, and each one sent to the port for
    nothing cost a full libcst pass (1,300 of 4,600 files of a dense real tree).
    """
    return any(call in data and modules.search(data) for call, modules in _patterns(helpers))


@functools.lru_cache(maxsize=4)  # one helper set per run, asked once per file
def _patterns(helpers: frozenset[ScalerHelper]) -> list[tuple[bytes, re.Pattern[bytes]]]:
    """Per helper name, its call and one search for any of the modules defining it: a dense
    tree's 50 helpers share 7 names (main, train...), and one search per helper and file cost
    4.6 s of CPU there (0.4 s so)."""
    modules: dict[bytes, set[bytes]] = {}
    for helper in helpers:
        call = helper.name.encode() + b"("
        modules.setdefault(call, set()).add(re.escape(helper.module.encode()))
    return [
        (call, re.compile(rb"\b(?:" + b"|".join(sorted(names)) + rb")[\s\\]+import\b"))
        for call, names in sorted(modules.items())
    ]
