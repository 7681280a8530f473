"""Faults a real run meets, made by real means: a planted codemod bug, files that crash the parser,
a read-only directory, a killed process. Each must cost the files it concerns and nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

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
