"""Faults a real run meets, made by real means: a planted codemod bug, files that crash the parser,
a read-only directory, a killed process. Each must cost the files it concerns and nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT, cli_env, run_cli

PORTABLE = b"import tensorflow as tf\nm = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"


def _assert_ported(data: bytes) -> None:
    assert b"contrib" not in data and b"FixedLossScaleManager(128)" in data


def _run_copy(copy: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI from a copy of the package (with a planted bug), not from the checkout."""
    env = cli_env()
    env["PYTHONPATH"] = str(copy)
    return subprocess.run(
        [sys.executable, "-m", "migrator", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_rewrite_that_would_not_parse_fails_alone(tmp_path: Path) -> None:
    # Plant a plausible one-line bug in a copy of the package: when the port drops the last name of
    # a `from ... import a, b`, it forgets to drop that name's comma too (libcst renders the
    # dangling comma without complaint; Python rejects it).
    copy = tmp_path / "pkg"
    shutil.copytree(REPO_ROOT / "migrator", copy / "migrator")
    shutil.copytree(REPO_ROOT / "templates", copy / "templates")
    rewrite = copy / "migrator" / "codemods" / "tf1" / "rewrite.py"
    line = "kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)"
    text = rewrite.read_text()
    assert text.count(line) == 1
    rewrite.write_text(text.replace(line, "pass"))

    tree = tmp_path / "tree"
    tree.mkdir()
    bad = (
        b"import tensorflow as tf\n"
        b"from tensorflow.contrib.mixed_precision import LossScaleManager, FixedLossScaleManager\n"
        b"m = FixedLossScaleManager(128)\n"
    )
    (tree / "bad.py").write_bytes(bad)
    (tree / "good.py").write_bytes(PORTABLE)
    report = tmp_path / "report.json"
    proc = _run_copy(copy, "--write", "--report", report, ".", cwd=tree)

    assert proc.returncode == 123, proc.stderr
    assert (tree / "bad.py").read_bytes() == bad
    _assert_ported((tree / "good.py").read_bytes())
    assert (
        "bad.py: error: internal error in npu-migrate: the ported file would not parse (2:"
        in proc.stderr
    )
    assert "trailing comma not allowed" in proc.stderr
    (failed,) = json.loads(report.read_text())["failed"]
    assert failed["path"] == "bad.py" and "would not parse" in failed["reason"]
    # The unbroken package ports the same file: the failure came from the planted bug.
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    assert b"FixedLossScaleManager(128)" in (tree / "bad.py").read_bytes() != bad


# Each crashed libcst's native parser with signal 11 (measured: 3,000 brackets, 8,000 terms), or
# took minutes (a statement of hundreds of thousands of list items).
PATHOLOGICAL = {
    "brackets.py": "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n",
    "sum.py": "x = " + "+".join(["a"] * 8000) + "\n",
    "calls.py": "x = f" + "()" * 8000 + "\n",
    "data.py": "x = [" + ", ".join(["1"] * 30_000) + "]\n",
}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_too_deep_for_the_parser_fails_alone_with_its_line(
    tmp_path: Path, jobs: str
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    header = PORTABLE.decode() + "y = 1\n"  # the pathological statement is on line 4
    for name, statement in PATHOLOGICAL.items():
        (tree / name).write_text(header + statement)
    for index in range(4):  # enough files for worker processes with -j2
        (tree / f"good{index}.py").write_bytes(PORTABLE)
    proc = run_cli("--write", "-j", jobs, ".", cwd=tree, timeout=120)

    assert proc.returncode == 123, proc.stderr
    for index in range(4):
        _assert_ported((tree / f"good{index}.py").read_bytes())
    for name, statement in PATHOLOGICAL.items():
        assert (tree / name).read_text() == header + statement
    lines = proc.stderr.splitlines()
    for name in ("brackets.py", "sum.py", "calls.py"):
        assert any(
            line.startswith(f"{name}:4:") and ": too deeply nested for the parser: " in line
            for line in lines
        ), proc.stderr
    assert any(line.startswith("data.py:4:1: statement too long for the parser") for line in lines)
    assert lines[-1].startswith("npu-migrate: 8 files scanned, 4 changed, 0 warnings, 4 failed")


def test_the_depth_measure_tells_deep_from_long_and_flat() -> None:
    from migrator.findings import SourceError
    from migrator.sources import limits

    flat = "x = [" + ", ".join(["-1"] * 10_000) + "]\n"  # long, but every item is shallow
    limits.check(flat.encode())
    assert limits.deepest_line(("y = 1\n" + flat + "z = a+b+c\n").encode()) == 2
    chain = "x = " + ".".join(["a"] * (limits.MAX_DEPTH + 5)) + "\n"
    with pytest.raises(SourceError, match=r"^2:\d+: too deeply nested for the parser"):
        limits.check(("y = 1\n" + chain).encode())
    # Python's own limit is 200 nested brackets: all of them pass.
    limits.check(("x = " + "(" * 199 + "1" + ")" * 199 + "\n").encode())
    # Not Python at all: left to the parser, which reports the syntax error.
    limits.check(b"def f(:\n")
