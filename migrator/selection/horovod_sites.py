"""Where the files of one run call Horovod's `init()`: a project-level fact read from bytes.

A file that imports Horovod but never initialises it gets `is_distributed=True` with a warning
(the optimizer needs an initialised Horovod at graph build); the warning is only useful if it
names where the run does initialise it, usually a runner script with nothing to port, which the
codemods never parse. A byte scan of every file read keeps that free.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from migrator import registry
from migrator.findings import Finding

_INIT = re.compile(rb"^[ \t]*(?:if [^\n]*:[ \t]*)?[A-Za-z_][A-Za-z_0-9]*\.init\(\)", re.M)


def init_sites(files: Iterable[tuple[str, bytes]]) -> list[tuple[str, int]]:
    """(path, line) of each `X.init()` call in a file that mentions Horovod."""
    sites = []
    for path, data in files:
        if b"horovod" not in data:
            continue
        for match in _INIT.finditer(data):
            sites.append((path, data.count(b"\n", 0, match.start()) + 1))
    return sites


def name_init_sites(findings: list[Finding], sites: list[tuple[str, int]]) -> list[Finding]:
    """The unverified-is_distributed warnings of one file, completed with where the run calls
    hvd.init() in other files (or that none of the files given does)."""
    out = []
    for finding in findings:
        if finding.rule == registry.DISTRIBUTED_UNVERIFIED:
            elsewhere = [f"{p}:{line}" for p, line in sites if p != finding.path]
            where = (
                f"other files of this run call it: {', '.join(elsewhere[:3])}"
                if elsewhere
                else "no file of this run calls it"
            )
            finding = dataclasses.replace(finding, message=f"{finding.message} ({where})")
        out.append(finding)
    return out
