"""Why a file cannot be read as Python, said the way a user can act on it.

Every message starts with `LINE:COL: ` (the CLI prefixes the path, as Black and compilers do) and
goes on with the offending source line and a caret under the column, so the reader sees where
without opening the file. Two causes get their own advice because they are common in the scripts
this tool meets: a GBK (or other non-UTF-8) comment without a coding cookie, and Python 2 code.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

# Python 2 constructs Python 3's parser reports in its own words, or not at all.
_PYTHON2_MESSAGES = (
    "Missing parentheses in call to 'print'",
    "Missing parentheses in call to 'exec'",
)
_PYTHON2_SOURCE = re.compile(
    rb"^[ \t]*(print[ \t]+[\"'\w>]|print[ \t]*>>|exec[ \t]+[\"']"
    rb"|except[ \t]+[\w.]+[ \t]*,[ \t]*\w+[ \t]*:|raise[ \t]+\w+[ \t]*,)",
    re.M,
)
_CONVERT_HINT = (
    "this looks like Python 2 source; convert it to Python 3 first (for example "
    "`2to3 -w FILE` on Python 3.12 or older, or `futurize -w FILE` from the `future` package), "
    "then run npu-migrate again"
)


def _pointer(line_text: str, column: int) -> str:
    """The source line and a caret under ``column`` (1-based), indented under the message."""
    shown = line_text.rstrip("\r\n").expandtabs(1)
    return f"\n    {shown}\n    {' ' * max(column - 1, 0)}^"


def _line_text(source: bytes, line: int, encoding: str = "utf-8") -> str:
    lines = source.splitlines()
    if 1 <= line <= len(lines):
        return lines[line - 1].decode(encoding, "replace")
    return ""


def syntax_error(source: bytes, fallback_line: int, fallback_message: str) -> str:
    """`LINE:COL: cannot parse: MESSAGE` with the line and a caret; Python's own account where it
    has one (libcst's parser often names the next line and lists expected tokens)."""
    line, column, message = fallback_line, 1, fallback_message
    nul = source.find(b"\0")
    if nul >= 0:
        # Python refuses the file at its first NUL byte (ast says where only from 3.12 on).
        line = source.count(b"\n", 0, nul) + 1
        column = nul - (source.rfind(b"\n", 0, nul) + 1) + 1
        message = "source code cannot contain null bytes"
        return (
            f"{line}:{column}: cannot parse: {message}{_pointer(_line_text(source, line), column)}"
        )
    try:
        ast.parse(source)
    except SyntaxError as python:
        if python.lineno is not None:
            line, column, message = python.lineno, python.offset or 1, python.msg
    except (ValueError, RecursionError, MemoryError):
        pass
    text = f"{line}:{column}: cannot parse: {message}{_pointer(_line_text(source, line), column)}"
    if message.startswith(_PYTHON2_MESSAGES) or _PYTHON2_SOURCE.search(source):
        text += f"\n  {_CONVERT_HINT}"
    return text


def decode_error(source: bytes, error: UnicodeDecodeError) -> str:
    """Where decoding failed (line, and byte within it), and the coding-cookie fix."""
    encoding = declared_encoding(source)
    start = error.start
    line = source.count(b"\n", 0, start) + 1
    line_start = source.rfind(b"\n", 0, start) + 1
    column = start - line_start + 1
    byte = source[start : start + 1].hex()
    guess = _guess(source)
    fix = (
        f"if the file is {guess}, say so on its first or second line: `# -*- coding: {guess} -*-`"
        if guess
        else "save it as UTF-8, or declare its encoding on its first or second line: "
        "`# -*- coding: <encoding> -*-`"
    )
    return (
        f"{line}:{column}: cannot decode byte 0x{byte} (byte {column} of the line) as "
        f"{encoding}{'' if encoding != 'utf-8' else ' (no coding cookie)'}; {fix}"
        f"{_pointer(_line_text(source, line, guess or 'latin-1'), column)}"
    )


def declared_encoding(source: bytes) -> str:
    try:
        return tokenize.detect_encoding(io.BytesIO(source).readline)[0]
    except SyntaxError:
        return "utf-8"


def _guess(source: bytes) -> str | None:
    """An encoding the whole file decodes in, among those this audience's scripts use."""
    for candidate in ("gbk", "gb18030", "shift_jis", "euc-kr"):
        try:
            source.decode(candidate)
        except UnicodeDecodeError:
            continue
        return candidate
    return None
