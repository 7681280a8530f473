"""Unified diffs for review, decoded for display only.

The migration works on bytes and writes bytes; this module only needs text to show a person what
will change, so decoding here may fall back (cookie encoding, then Latin-1) without any risk to the
files themselves. The diff printed for `patch -p1` / `git apply` goes back to the file's own bytes
(`diff_bytes`): a GBK or Latin-1 file's context lines must match the file, not their UTF-8 form.
"""

from __future__ import annotations

import io
import os
import tokenize

import click

from migrator.report.linediff import unified_diff_lines

_NO_NEWLINE = "\\ No newline at end of file\n"


def display_encoding(source: bytes) -> str:
    """UTF-8 first, then the file's own coding cookie, then Latin-1 (which never fails)."""
    try:
        source.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        source.decode(encoding)
        return encoding
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return "latin-1"


def decode_for_display(source: bytes) -> str:
    return source.decode(display_encoding(source))


def _lines(text: str) -> list[str]:
    """Split on LF only, keeping CR, so CRLF files show their real line endings and a form feed or
    a lone CR inside a line does not invent extra lines."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(old: bytes, new: bytes, display_path: str, context: int = 3) -> str:
    """A `git apply`/`patch -p1` compatible diff for a relative path; empty when nothing changed."""
    if old == new:
        return ""
    name = display_path.replace("\\", "/")
    if name == ".." or name.startswith("../"):
        # `a/../x.py` applies nowhere: a path above the working directory is named absolutely.
        name = os.path.abspath(display_path).replace("\\", "/")
    before, after = (name, name) if name.startswith("/") else (f"a/{name}", f"b/{name}")
    out: list[str] = []
    for line in unified_diff_lines(
        _lines(decode_for_display(old)),
        _lines(decode_for_display(new)),
        fromfile=before,
        tofile=after,
        n=context,
    ):
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + _NO_NEWLINE)
    return "".join(out)


def diff_bytes(old: bytes, new: bytes, display_path: str) -> bytes:
    """`unified_diff` in the file's own encoding (the two header lines, which hold the path, in
    UTF-8), so that its lines are the file's bytes and the patch applies."""
    encoding = display_encoding(old)
    lines = unified_diff(old, new, display_path).splitlines(keepends=True)
    return b"".join(
        line.encode("utf-8" if index < 2 else encoding, "surrogateescape")
        for index, line in enumerate(lines)
    )


def colorize(diff: str) -> str:
    """ANSI colours in the usual places: headers bold, hunks cyan, removals red, additions green."""
    styled: list[str] = []
    for line in diff.splitlines(keepends=True):
        body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
        if line.startswith(("--- ", "+++ ")):
            styled.append(click.style(body, bold=True) + end)
        elif line.startswith("@@"):
            styled.append(click.style(body, fg="cyan") + end)
        elif line.startswith("-"):
            styled.append(click.style(body, fg="red") + end)
        elif line.startswith("+"):
            styled.append(click.style(body, fg="green") + end)
        else:
            styled.append(line)
    return "".join(styled)
