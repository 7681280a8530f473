"""What a migration found in one file: the changes it made and the places it left for a person.

Kept apart from the codemods and the CLI so both sides speak one vocabulary: the codemods produce
`Finding`s, the CLI turns them into the diff summary and the JSON/Markdown reports.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

Kind = Literal["change", "warning", "error"]
_LINE_BREAK = re.compile(r"[ \t]*\r?\n\s*")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One change or warning, anchored to a line of the *original* file."""

    path: str
    line: int
    rule: str
    message: str
    kind: Kind = "change"

    def __post_init__(self) -> None:
        # A finding is one line of the CLI's output (PATH:LINE: RULE: MESSAGE), which a reader
        # or a grep takes line by line: code quoted from a statement spanning lines is folded.
        if "\n" in self.message:
            object.__setattr__(self, "message", _LINE_BREAK.sub(" ", self.message.strip()))

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class MigrationResult:
    """The outcome of migrating one file's bytes.

    `new_source` equals the input bytes exactly when nothing was changed, so callers can compare
    bytes to decide whether a file needs writing.
    """

    path: str
    old_source: bytes
    new_source: bytes
    findings: list[Finding] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.new_source != self.old_source

    @property
    def changes(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "change"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "warning"]


class SourceError(Exception):
    """The file cannot be migrated at all (does not decode or parse); the message is the reason."""
