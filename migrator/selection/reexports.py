"""Which names the files of one run import from each other: a project-level fact read from bytes.

`train.py` may take `LossScaleOptimizer` from `utils.py`, which imported it from tf.contrib. The
port removes that import from utils.py, and train.py would then fail at start-up: so a name other
files import from a module stays bound there, to the npu_lossscale class. A byte scan of every
file read finds those imports without parsing files that have nothing to port.
"""

from __future__ import annotations

import functools
import re
from pathlib import PurePath

# `from pkg.utils import A, B as C` and `from .utils import (A,` (the first line of a
# parenthesized list is enough for the names on it; the rest are read from the next lines).
_FROM = re.compile(rb"^[ \t]*from[ \t]+\.*([\w.]*)[ \t]+import[ \t]+\(?([^\n#)]*)(\)?)", re.M)
_NAME = re.compile(r"[A-Za-z_]\w*")


def imported_from(data: bytes) -> set[tuple[str, str]]:
    """(module's last component, name) for every `from M import name` in one file."""
    found = set()
    for match in _FROM.finditer(data):
        module = match.group(1).decode("ascii", "replace").rsplit(".", 1)[-1]
        names = match.group(2).decode("utf-8", "replace")
        if match.group(3) == b"" and names.strip() == "" and data[match.end() : match.end() + 1]:
            tail = data[match.end() :].split(b")", 1)[0].decode("utf-8", "replace")
            names = tail
        for item in names.split(","):
            words = _NAME.findall(item)
            if words:
                found.add((module, words[0]))
    return found


def names_imported_from(reexports: frozenset[tuple[str, str]], path: str) -> set[str]:
    """The names other files of the run import from the module at ``path``."""
    return set(_by_module(reexports).get(module_name(path), ()))


@functools.lru_cache(maxsize=2)  # one set per run, asked by each port of each file
def _by_module(reexports: frozenset[tuple[str, str]]) -> dict[str, list[str]]:
    """The run's imports by module: the run may import thousands of names, and reading them all
    for each file was 1% of the dense speed tree's time."""
    found: dict[str, list[str]] = {}
    for module, name in reexports:
        found.setdefault(module, []).append(name)
    return found


def module_name(path: str) -> str:
    """How other files name the module at ``path`` in `from ... import`: its stem, or its
    package's name for an `__init__.py`."""
    pure = PurePath(path)
    return pure.parent.name if pure.stem == "__init__" else pure.stem
