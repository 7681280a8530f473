"""Which files of a git work tree had uncommitted or untracked changes before `--write`.

`--write` on such a tree mixes the port with the user's own unfinished edits, and `git checkout`
would then undo both. The run still proceeds (the user asked for it), but the CLI says so and says
which files can be restored with git alone. Asking git costs one subprocess, only with `--write`;
without git, or outside a repository, there is nothing to say.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class WorkTree:
    root: Path
    dirty: frozenset[str]  # real paths of modified, added or untracked files


def dirty_work_tree(inputs: Sequence[Path]) -> WorkTree | None:
    """The git work tree holding the first input, when it has uncommitted or untracked files."""
    if not inputs:
        return None
    first = Path(os.path.abspath(inputs[0]))
    where = first if first.is_dir() else first.parent
    try:
        root = _git(where, "rev-parse", "--show-toplevel").strip()
        if not root:
            return None
        status = _git(Path(root), "status", "--porcelain", "-z", "--untracked-files=all")
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = set()
    entries = iter(status.split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        code, name = entry[:2], entry[3:]
        dirty.add(os.path.realpath(os.path.join(root, name)))
        if "R" in code or "C" in code:
            next(entries, None)  # a rename's or copy's source path follows
    return WorkTree(Path(root), frozenset(dirty)) if dirty else None


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_SECONDS,
        check=True,
    )
    return proc.stdout
