"""The single entry point that parses a file once and chains the codemods over it.

The CLI only talks to this module: a cheap byte pre-filter, a project-wide plan built once in the
main process, and a pure per-file `migrate_source`. Keeping parsing here means every codemod sees
the same tree and the file is either rewritten as a whole or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

import libcst as cst

from migrator.findings import MigrationResult, SourceError

Distributed = Literal["auto", "always", "never"]

_TRIGGERS: tuple[bytes, ...] = (
    b"mixed_precision",
    b"LossScale",
    b"loss_scale",
    b"enable_mixed_precision_graph_rewrite",
)


@dataclasses.dataclass(frozen=True)
class MigrateOptions:
    """User choices that change the output (not how files are found or written)."""

    distributed: Distributed = "auto"

    def __post_init__(self) -> None:
        if self.distributed not in ("auto", "always", "never"):
            raise ValueError(
                f"distributed must be 'auto', 'always' or 'never', got {self.distributed!r}"
            )


@dataclasses.dataclass(frozen=True)
class ProjectPlan:
    """Cross-file facts gathered once before the per-file work (picklable for worker processes)."""

    global_step: object | None = None


def might_need_migration(source: bytes) -> bool:
    """Cheap pre-filter: a file without any trigger substring cannot hold anything to port."""
    if any(t in source for t in _TRIGGERS):
        return True
    return b"getattr" in source and b"contrib" in source


def parse(source: bytes) -> cst.Module:
    """Parse bytes (libcst keeps the detected encoding and newline); failures are SourceError."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise SourceError(f"syntax error: {exc.message} (line {exc.raw_line})") from exc
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        raise SourceError(f"cannot decode: {exc}") from exc


def plan_project(sources: Mapping[str, bytes]) -> ProjectPlan:
    """Gather cross-file facts; unparsable files are skipped here and reported by migrate_source."""
    return ProjectPlan()


def migrate_source(
    source: bytes,
    *,
    path: str,
    options: MigrateOptions = MigrateOptions(),  # noqa: B008 - frozen, so sharing it is safe
    plan: ProjectPlan | None = None,
) -> MigrationResult:
    """Port one file's bytes; pure (no I/O), byte-identical output when nothing changes."""
    parse(source)
    return MigrationResult(path=path, old_source=source, new_source=source, findings=[])
