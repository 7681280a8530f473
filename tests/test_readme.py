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


def _quick_start() -> list[str]:
    section = README[README.index("## Quick start") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_runs_verbatim(tmp_path: Path) -> None:
    """Install from the checkout into a clean venv and port and train the example, as written.

    Only the clone is stood in for (no network here): the checkout is linked where the clone
    would land. The rest runs in one bash, line by line, and must all succeed."""
    lines = _quick_start()
    assert lines[0].startswith("git clone ") and lines[0].endswith(" npu-lossscale")
    (tmp_path / "npu-lossscale").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))
    )
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    script = "set -euo pipefail\n" + "\n".join(lines[1:]) + "\n"
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ported = (tmp_path / "train.py").read_text(encoding="utf-8")
    assert "from npu_lossscale import" in ported
    assert "mixed_precision.LossScaleOptimizer(" not in ported
    assert (tmp_path / "review.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert re.search(r"step\s+30\s+loss", done.stdout), done.stdout[-2000:]
