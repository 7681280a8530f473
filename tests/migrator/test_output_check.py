"""The check that a ported module parses, by its changed regions alone against parsing the whole
module: the same verdict for every edit of a real module, anywhere in it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.pipeline.output_check import output_error
from migrator.pipeline.slicing import view_of


def _module() -> bytes:
    """The fixtures that parse, one after another: a real module of a few thousand lines, with
    decorators, classes, docstrings, comments, continuation lines and `a; b` statements."""
    parts = []
    for path in sorted(MIGRATOR_FIXTURES.rglob("*.py")):
        data = path.read_bytes()
        try:
            ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        if data.endswith(b"\n") and b"\r" not in data and b"coding" not in data[:200]:
            parts.append(data)
    return b"".join(parts)


def _starts(source: bytes) -> list[int]:
    """0-based first lines of the top-level statements (decorators included), those that share a
    line with the statement before left out: worked out here from `ast`, apart from slicing."""
    starts, reach = [], -1
    for statement in ast.parse(source).body:
        lines = [statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", []))]
        first = min(lines) - 1
        if first > reach:
            starts.append(first)
        reach = max(reach, (statement.end_lineno or statement.lineno) - 1)
    return starts


WHOLE = _module()
# The edits parse the module some thousand times: its first 1,200 lines or so are enough.
_CUT = min(s for s in _starts(WHOLE) if s >= 1200)
LINES = WHOLE.splitlines(keepends=True)[:_CUT]
OLD = b"".join(LINES)
STARTS = _starts(OLD)

EDITS = {
    "open a bracket": lambda line: b"x = (\n" + line,
    "a new statement": lambda line: b"y = 1\n" + line,
    "drop the line": lambda line: b"",
    "a dangling comma": lambda line: line.rstrip(b"\n") + b",\n",
    "a continuation": lambda line: line.rstrip(b"\n") + b" \\\n",
    "a backslash before it": lambda line: b"x = \\\n" + line,
    "indent it": lambda line: b"    " + line,
    "twice": lambda line: line + line,
}


def test_a_long_modules_view_knows_the_same_starts() -> None:
    view = view_of(WHOLE)
    assert view is not None and list(view.starts) == _starts(WHOLE)
    assert len(view.starts) > 300 and len(STARTS) > 100


def _positions() -> list[int]:
    """Where edits go: at every fifth statement start and on the line before it (the end of the
    statement before), where a region's widening matters."""
    return sorted({i for s in STARTS[::5] for i in (s - 1, s) if i >= 0})


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_the_changed_region_gives_the_whole_module_verdict(edit) -> None:
    broken = 0
    for index in _positions():
        new = b"".join([*LINES[:index], edit(LINES[index]), *LINES[index + 1 :]])
        whole = output_error(OLD, new)
        assert (output_error(OLD, new, STARTS) is None) == (whole is None), (index, LINES[index])
        broken += whole is not None
        # With an import added near the top as well: two regions, each parsed on its own.
        top = STARTS[3]
        if index > top:
            two = b"".join([*LINES[:top], b"import os\n", *new.splitlines(keepends=True)[top:]])
            verdict = output_error(OLD, two, STARTS)
            assert (verdict is None) == (output_error(OLD, two) is None), (index, LINES[index])
    assert broken or edit is EDITS["a new statement"]


def test_an_error_names_the_line_of_the_file(tmp_path: Path) -> None:
    index = STARTS[len(STARTS) // 2]
    new = b"".join([*LINES[:index], b"x = [1,, 2]\n", *LINES[index:]])
    error = output_error(OLD, new, STARTS)
    assert error is not None and f"({index + 1}:" in error
    assert error == output_error(OLD, new)


def test_a_module_in_its_own_encoding_is_read_in_it() -> None:
    old = "# -*- coding: latin-1 -*-\nimport os\n\nname = 'é'\n\nx = 1\n".encode("latin-1")
    starts = _starts(old)
    assert output_error(old, old.replace(b"x = 1", b"x = 2"), starts) is None
    assert output_error(old, old.replace(b"x = 1", b"x = (2"), starts) is not None
    marked = b"\xef\xbb\xbf" + "import os\nname = 'é'\nx = 1\n".encode()
    assert output_error(marked, marked.replace(b"x = 1", b"x = 2"), _starts(marked)) is None
