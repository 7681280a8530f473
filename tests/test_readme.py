"""Every Python block of the README either runs as written or says what it needs around it.

A block whose introducing paragraph says it "needs" something is only checked to compile (its
surroundings are a user's script); every other block is run, as written, in a fresh process.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT

ROOT = REPO_ROOT
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.M | re.S)


def _blocks() -> list[tuple[int, str, str]]:
    """(line, introducing paragraph, code) for every Python block."""
    out = []
    for match in BLOCK.finditer(README):
        before = README[: match.start()].rstrip("\n ")
        paragraph = before.rsplit("\n\n", 1)[-1]
        indent = len(match.group(1))
        code = "\n".join(line[indent:] for line in match.group(2).splitlines())
        out.append((README[: match.start()].count("\n") + 1, paragraph, code))
    return out


BLOCKS = _blocks()


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("line", "paragraph", "code"), BLOCKS, ids=[f"L{b[0]}" for b in BLOCKS])
def test_block_runs_or_says_what_it_needs(
    line: int, paragraph: str, code: str, tmp_path: Path
) -> None:
    ast.parse(code)  # every block is valid Python
    if re.search(r"\bneeds?\b", paragraph):
        return  # a fragment of a user's script, and the README says of what
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # whatever the example writes (a saved model) lands there
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"README line {line}:\n{done.stderr[-3000:]}"
