"""The single entry point that parses a file once and chains the codemods over it.

The CLI only talks to this module: a cheap byte pre-filter, a project-wide plan built once in the
main process, and a pure per-file `migrate_source`. Keeping parsing here means every codemod sees
the same tree and the file is either rewritten as a whole or not at all.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrator.codemods import global_step
from migrator.codemods.port import port_loss_scale
from migrator.findings import Finding, MigrationResult, SourceError

Distributed = Literal["auto", "always", "never"]

_TRIGGERS: tuple[bytes, ...] = (
    b"mixed_precision",
    b"LossScale",
    b"loss_scale",
    b"enable_mixed_precision_graph_rewrite",
    *global_step.GLOBAL_STEP_TRIGGERS,
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

    global_step: global_step.GlobalStepPlan | None = None


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
        raise SourceError(f"syntax error at line {exc.raw_line}: {exc.message}") from exc
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        raise SourceError(f"cannot decode: {exc}") from exc


def plan_project(sources: Mapping[str, bytes]) -> ProjectPlan:
    """Gather cross-file facts; unparsable files are skipped here and reported by migrate_source."""
    facts = []
    for path, source in sources.items():
        try:
            module = parse(source)
        except SourceError:
            continue
        facts.append(global_step.scan(module, path))
    return ProjectPlan(global_step=global_step.build_plan(facts))


def migrate_source(
    source: bytes,
    *,
    path: str,
    options: MigrateOptions = MigrateOptions(),  # noqa: B008 - frozen, so sharing it is safe
    plan: ProjectPlan | None = None,
) -> MigrationResult:
    """Port one file's bytes; pure (no I/O), byte-identical output when nothing changes.

    The global-step move runs first, on the original tree, so its findings (and the project
    plan's) carry original line numbers; the loss-scale port's lines are mapped back through the
    difference the move made.
    """
    original = parse(source)
    step_plan = plan.global_step if plan is not None else None
    moved, findings = global_step.rewrite(MetadataWrapper(original), path, step_plan)
    ported, port_findings = port_loss_scale(MetadataWrapper(moved), path, options.distributed)
    if moved is not original and port_findings:
        port_findings = _map_lines(port_findings, original.code, moved.code)
    findings = sorted([*findings, *port_findings], key=lambda f: (f.line, f.kind, f.rule))
    if not any(f.kind == "change" for f in findings):
        return MigrationResult(path=path, old_source=source, new_source=source, findings=findings)
    return MigrationResult(path=path, old_source=source, new_source=ported.bytes, findings=findings)


def _map_lines(findings: list[Finding], old: str, new: str) -> list[Finding]:
    """Re-anchor findings made on `new` to the matching lines of `old`."""
    opcodes = difflib.SequenceMatcher(
        None, old.splitlines(), new.splitlines(), autojunk=False
    ).get_opcodes()

    def to_old(line: int) -> int:
        index = line - 1
        for tag, i1, _i2, j1, j2 in opcodes:
            if j1 <= index < j2 or (j1 == j2 == index):
                return (i1 + index - j1 if tag == "equal" else i1) + 1
        return line

    return [dataclasses.replace(f, line=to_old(f.line)) for f in findings]
