"""Whether a ported module still parses, the last check before it may be written.

A bug in a codemod (a dangling comma, an unbalanced bracket) would otherwise put a file that no
longer imports in the user's tree and exit 0. Python's own parser is the judge, as it will be when
the script runs; a file it could not parse before the port is not held to it.

A port changes a few lines, and parsing all of the file again was a fifth of the time of a
20,000-line module. Where the caller knows the lines at which the original's top-level statements
start, only the runs of changed lines, widened to those starts (migrator.sources.spans), are
parsed: the unchanged lines between them are whole top-level statements that parsed in the
original, and a module is a sequence of top-level statements, so the ported file parses when each
widened region does on its own. The converse holds too (tests/migrator/test_output_check.py edits
a real module everywhere and compares with a whole parse), except for an edit that opens a
triple-quoted string which unchanged code closes: that file is refused, which is the safe side.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Sequence

from migrator.sources.spans import changed_spans


def output_error(old: bytes, new: bytes, starts: Sequence[int] | None = None) -> str | None:
    """Why `new`, the port of `old`, must not be written, or None when it parses.

    `starts`: the 0-based lines of `old` (as `bytes.splitlines` counts them) at which its
    top-level statements start, from a parse or the tokenizer's pass of `old`; without them the
    whole of `new` is parsed.
    """
    regions = _changed_regions(old, new, starts) if starts else None
    for first, text in regions if regions is not None else [(0, new)]:
        try:
            ast.parse(text)
        except SyntaxError as exc:
            if not _parses(old):
                return None
            where = f"{exc.lineno + first}:{exc.offset or 1}" if exc.lineno else "?"
            return (
                "internal error in npu-migrate: the ported file would not parse "
                f"({where}: {exc.msg}); left untouched, please report it"
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


def _changed_regions(old: bytes, new: bytes, starts: Sequence[int]) -> list[tuple[int, str]] | None:
    """(0-based first line, text) of each run of lines of `new` that differ from `old`, widened to
    the top-level statements of `old` around them; None where the whole file must be parsed."""
    if any(b.count(b"\r") != b.count(b"\r\n") for b in (old, new)):
        return None  # lone carriage returns: lines would be counted two ways
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(new).readline)
    except SyntaxError:
        return None
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    spans = changed_spans(old_lines, new_lines, starts)
    if spans is None:
        return None  # the whole file changed
    regions = []
    for _, _, first, stop in spans:
        chunk = b"".join(new_lines[first:stop])
        # The mark is at the start of the file only.
        chunk_encoding = "utf-8" if first > 0 and encoding == "utf-8-sig" else encoding
        try:
            regions.append((first, chunk.decode(chunk_encoding)))
        except (UnicodeDecodeError, LookupError):
            return None
    return regions
