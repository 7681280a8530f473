"""Which lines of a file the review page shows, and in which groups.

A reviewer needs every changed line and every line a finding points at, each with a few lines of
context around it; the rest of the file is folded away. The layout is decided here once, as plain
data over line indexes, so the page's split and unified views show the very same lines. Lines are
matched with the printed diff's matcher (migrator/report/linediff.py), so the page and the patch
agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from migrator.report.linediff import LineMatcher

CONTEXT = 3

_DEFINITION = re.compile(r"[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+\w+")


@dataclass(frozen=True)
class Block:
    """Consecutive lines, as 0-based index ranges into the old and the new file: the same lines on
    both sides (`equal`), or old lines replaced by new ones (either range may be empty)."""

    equal: bool
    old: range
    new: range


@dataclass(frozen=True)
class Hunk:
    """Blocks shown together, after `folded_before` old lines that are not shown."""

    folded_before: int
    blocks: tuple[Block, ...]

    @property
    def old(self) -> range:
        return range(self.blocks[0].old.start, self.blocks[-1].old.stop)

    @property
    def new(self) -> range:
        return range(self.blocks[0].new.start, self.blocks[-1].new.stop)


def split_lines(text: str) -> list[str]:
    """Lines split on LF only, each keeping its LF, as the printed diff splits them (a CR or a form
    feed inside a line is part of that line)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def layout(
    old: Sequence[str], new: Sequence[str], finding_lines: Iterable[int], context: int = CONTEXT
) -> tuple[list[Hunk], int]:
    """The hunks to show and how many old lines are folded after the last one.

    `finding_lines` are 1-based lines of the old file; each is shown with `context` lines around
    it even where nothing changed, so a warning on untouched code is read in place.
    """
    opcodes = LineMatcher(old, new).get_opcodes()
    shown: set[int] = set()
    for tag, i1, i2, _, _ in opcodes:
        if tag != "equal":
            shown.update(range(max(0, i1 - context), min(len(old), i2 + context)))
    for line in finding_lines:
        if 1 <= line <= len(old):
            shown.update(range(max(0, line - 1 - context), min(len(old), line + context)))

    hunks: list[Hunk] = []
    blocks: list[Block] = []
    folded = 0

    def close() -> None:
        nonlocal folded
        if blocks:
            hunks.append(Hunk(folded, tuple(blocks)))
            blocks.clear()
            folded = 0

    for tag, i1, i2, j1, j2 in opcodes:
        if tag != "equal":
            blocks.append(Block(False, range(i1, i2), range(j1, j2)))
            continue
        start = None
        for i in range(i1, i2 + 1):
            if i < i2 and i in shown:
                start = i if start is None else start
                continue
            if start is not None:
                blocks.append(Block(True, range(start, i), range(j1 + start - i1, j1 + i - i1)))
                start = None
            if i < i2:
                close()
                folded += 1
    close()
    return hunks, folded


def enclosing_definition(old: Sequence[str], index: int) -> str:
    """The nearest `def` or `class` line above old line `index`, which git prints beside a hunk
    header (its rule for Python: no indentation check, so module-level code after a function
    still names that function)."""
    for line in reversed(old[:index]):
        if _DEFINITION.match(line):
            return line.strip()
    return ""
