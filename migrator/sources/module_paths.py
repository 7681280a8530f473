"""Which of a run's files an imported module name may mean.

The global-step plan resolves an optimizer class through the importing file's imports, and the
triage must put back every file the plan could find that way; both ask this one function, so the
two cannot drift apart. Paths are compared normalised (`norm`), with forward slashes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Iterator


class Paths(Collection[str]):
    """A run's normalised paths, in their order, indexed by every tail of folders they end with.

    `module_files` is asked about every import of every file the triage admits (10,940 times on
    the dense speed tree, from `widen` alone), and matching each module against every path made
    those questions quadratic in the run's size; build this once and pass it instead.
    """

    def __init__(self, paths: Iterable[str]) -> None:
        self._order: dict[str, int] = {}
        self._tails: dict[str, list[str]] = {}
        for path in paths:
            if path in self._order:
                continue
            self._order[path] = len(self._order)
            parts = path.split("/")
            for start in range(len(parts)):
                self._tails.setdefault("/".join(parts[start:]), []).append(path)

    def __contains__(self, path: object) -> bool:
        return path in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def ending(self, tails: Iterable[str]) -> list[str]:
        """The paths equal to one of `tails` or ending in `/` and one of them, in order."""
        found = dict.fromkeys(path for tail in tails for path in self._tails.get(tail, ()))
        return sorted(found, key=self._order.__getitem__)


def norm(path: str) -> str:
    """The path as the plan and the triage compare it."""
    return posixpath.normpath(path.replace("\\", "/"))


def module_files(module: str, importer: str, paths: Collection[str]) -> list[str]:
    """The files of `paths` (normalised) that `module`, imported by `importer`, may be.

    A relative module is looked up from the importer's folder (its `.py` file, then its
    `__init__.py`); an absolute one is the importer's sibling file where there is one, else every
    file whose path ends with the module's path, in the order of `paths` (a `Paths` when the
    caller asks more than once).
    """
    level = len(module) - len(module.lstrip("."))
    parts = module.lstrip(".").split(".") if module.strip(".") else []
    here = posixpath.dirname(importer)
    if level:
        base = here
        for _ in range(level - 1):
            base = posixpath.dirname(base)
        candidates = (
            norm(posixpath.join(base, *parts) + ".py"),
            norm(posixpath.join(base, *parts, "__init__.py")),
        )
        return [c for c in candidates if c in paths]
    sibling = norm(posixpath.join(here, *parts) + ".py")
    if sibling in paths:
        return [sibling]
    index = paths if isinstance(paths, Paths) else Paths(paths)
    return index.ending(("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])))
