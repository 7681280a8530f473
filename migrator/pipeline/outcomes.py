"""What a run was asked to do and what happened to each file: the records the runner fills and
the writer, the CLI and the reports read (kept apart so none of them imports the runner)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from migrator.findings import Finding
from migrator.sources.files import SourceFile

Mode = Literal["diff", "write", "output-dir"]
Status = Literal["unchanged", "changed", "failed"]


@dataclass
class FileOutcome:
    """What happened to one discovered file; `old`/`new` are kept only for migrated files."""

    source: SourceFile
    status: Status
    findings: list[Finding] = field(default_factory=list)
    old: bytes | None = None
    new: bytes | None = None
    error: str | None = None

    @property
    def path(self) -> str:
        return self.source.display

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.kind != "change"]

    @property
    def changes(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "change"]


@dataclass
class RunConfig:
    mode: Mode = "diff"
    output_dir: Path | None = None
    copy_unchanged: bool = False
    jobs: int = 1
    distributed: str = "auto"
    add_loss_scale: str | None = None
    target: str = "npulossscale"


@dataclass
class RunResult:
    outcomes: list[FileOutcome]
    seconds: float
    mode: Mode

    @property
    def scanned(self) -> int:
        return len(self.outcomes)

    @property
    def changed(self) -> int:
        return sum(o.status == "changed" for o in self.outcomes)

    @property
    def warnings(self) -> int:
        return sum(len(o.warnings) for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)
