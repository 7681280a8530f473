"""Which of a run's files an imported module name may mean.

The global-step plan resolves an optimizer class through the importing file's imports, and the
triage must put back every file the plan could find that way; both ask this one function, so the
two cannot drift apart. Paths are compared normalised (`norm`), with forward slashes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection


def norm(path: str) -> str:
    """The path as the plan and the triage compare it."""
    return posixpath.normpath(path.replace("\\", "/"))


def module_files(module: str, importer: str, paths: Collection[str]) -> list[str]:
    """The files of `paths` (normalised) that `module`, imported by `importer`, may be.

    A relative module is looked up from the importer's folder (its `.py` file, then its
    `__init__.py`); an absolute one is the importer's sibling file where there is one, else every
    file whose path ends with the module's path, in the order of `paths`.
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
    tails = ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"]))
    ends = tuple("/" + t for t in tails)
    return [p for p in paths if p in tails or p.endswith(ends)]
