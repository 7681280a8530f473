"""Whether a ported module still parses, the last check before it may be written.

A bug in a codemod (a dangling comma, an unbalanced bracket) would otherwise put a file that no
longer imports in the user's tree and exit 0. Python's own parser is the judge, as it will be when
the script runs; a file it could not parse before the port is not held to it.

On a long file the port changes a few lines, and parsing all of it again was a fifth of the time
of a 20,000-line module. Where the caller knows the lines at which the original's top-level
statements start, only the changed lines, widened to those starts, are parsed: the unchanged lines
before and after are whole top-level statements that parsed in the original, and a module is a
sequence of top-level statements, so the ported file parses when the widened region does on its
own. The converse holds too (tests/migrator/test_output_check.py edits a real module everywhere
and compares with a whole parse), except for an edit that opens a triple-quoted string which
unchanged code closes: that file is refused, which is the safe side.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Sequence


def output_error(old: bytes, new: bytes, starts: Sequence[int] | None = None) -> str | None:
    """Why `new`, the port of `old`, must not be written, or None when it parses.

    `starts`: the 0-based lines of `old` (as `bytes.splitlines` counts them) at which its
    top-level statements start, from a parse of `old`; without them the whole of `new` is parsed.
    """
    region = _changed_region(old, new, starts) if starts else None
    first, text = region if region is not None else (0, new)
    try:
        ast.parse(text)
    except SyntaxError as exc:
        if region is None and not _parses(old):
            return None
        where = f"{exc.lineno + first}:{exc.offset or 1}" if exc.lineno else "?"
        return (
            f"internal error in npu-migrate: the ported file would not parse ({where}: {exc.msg}); "
            "left untouched, please report it"
        )
    except (ValueError, RecursionError, MemoryError):
        return None
    return None


def _parses(source: bytes) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _changed_region(old: bytes, new: bytes, starts: Sequence[int]) -> tuple[int, str] | None:
    """(0-based first line, text) of the lines of `new` that differ from `old`, widened to the
    top-level statements of `old` around them; None where the whole file must be parsed."""
    if any(b.count(b"\r") != b.count(b"\r\n") for b in (old, new)):
        return None  # lone carriage returns: lines would be counted two ways
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(new).readline)
    except SyntaxError:
        return None
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    same_head = 0
    limit = min(len(old_lines), len(new_lines))
    while same_head < limit and old_lines[same_head] == new_lines[same_head]:
        same_head += 1
    same_tail = 0
    while same_tail < limit - same_head and old_lines[-1 - same_tail] == new_lines[-1 - same_tail]:
        same_tail += 1
    # Widen to whole statements, and by one more on each side: an indented line put first may
    # continue the block of the statement before, and a backslash put last may join the line
    # after (`x = \\` then `y = 2` parses).
    first = max((s for s in starts if s < same_head), default=0)
    old_stop = len(old_lines) - same_tail
    stop = min((s for s in starts if s > old_stop), default=len(old_lines))
    new_stop = stop + len(new_lines) - len(old_lines)
    if first == 0 and new_stop >= len(new_lines):
        return None  # the whole file changed
    chunk = b"".join(new_lines[first:new_stop])
    if first > 0 and encoding == "utf-8-sig":
        encoding = "utf-8"  # the mark is at the start of the file only
    try:
        return first, chunk.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        return None
