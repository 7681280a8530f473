"""Comments the codemods write, wrapped to the line length the file itself keeps.

A note like "npu-migrate: global_step now advances in LAMBOptimizer.apply_gradients (skipped on
overflow). Original update:" is over 100 characters once indented; dropped into a script whose lines
all fit in 80 or 100 columns it is the one line a linter flags. The file's own longest line tells
which common limit it keeps (PEP 8's 79, 80, Black's 88, 99/100, 119/120); a file with longer lines
keeps no limit we could follow and gets the comments unwrapped. Tabs count as 4 columns (ruff's and
most editors' default).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import libcst as cst

COMMON_LIMITS = (79, 80, 88, 99, 100, 110, 119, 120)
TAB_WIDTH = 4


def width(text: str) -> int:
    return len(text.expandtabs(TAB_WIDTH))


def line_limit(code: str) -> int | None:
    """The smallest common line length the file's lines all fit in, or None above 120."""
    longest = max((width(line) for line in code.splitlines()), default=0)
    return next((limit for limit in COMMON_LIMITS if longest <= limit), None)


def comment_lines(text: str, indent: int, limit: int | None) -> list[cst.EmptyLine]:
    """`# text` as comment lines at `indent` columns, wrapped within `limit`."""
    line = cst.EmptyLine(indent=True, comment=cst.Comment(f"# {text}".rstrip()))
    return _reflowed([line], indent, limit)


def wrapped(lines: Sequence[cst.EmptyLine], indent: int, limit: int | None) -> list[cst.EmptyLine]:
    """`lines` (a statement's leading lines, indented by `indent` columns) with each run of
    comment lines that has a line over `limit` re-flowed as one paragraph within it."""
    out: list[cst.EmptyLine] = []
    run: list[cst.EmptyLine] = []
    for line in [*lines, None]:
        if line is not None and line.comment is not None and line.indent:
            run.append(line)
            continue
        out += _reflowed(run, indent, limit)
        run = []
        if line is not None:
            out.append(line)
    return out


def _reflowed(run: list[cst.EmptyLine], indent: int, limit: int | None) -> list[cst.EmptyLine]:
    assert all(line.comment is not None for line in run)
    texts = [line.comment.value for line in run if line.comment is not None]
    if limit is None or all(indent + width(text) <= limit for text in texts):
        return run
    words = " ".join(text.lstrip("#").strip() for text in texts)
    pieces = textwrap.wrap(
        words,
        width=max(limit - indent - 2, 20),
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [run[0].with_changes(comment=cst.Comment(f"# {piece}")) for piece in pieces]


def wrap_statements(
    statements: Sequence[cst.BaseStatement], indent: int, unit: int, limit: int | None
) -> list[cst.BaseStatement]:
    """Inserted statements (at `indent` columns, blocks `unit` deeper) with their comments wrapped
    (migrator.codemods.shared.comments.wrapped), in nested blocks too."""
    if limit is None:
        return list(statements)
    out = []
    for statement in statements:
        statement = statement.with_changes(
            leading_lines=wrapped(statement.leading_lines, indent, limit)
        )
        body = getattr(statement, "body", None)
        if isinstance(body, cst.IndentedBlock):
            inner = wrap_statements(body.body, indent + unit, unit, limit)
            statement = statement.with_changes(body=body.with_changes(body=inner))
        out.append(statement)
    return out
