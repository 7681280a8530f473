"""benchmarks/realcode.py proves ports on the users' stacks: a tiny real-code set of our own.

The harness is run as a user runs it (its CLI, a manifest, a snapshot folder) on two files written
here: a TF 1 `create_optimizer` on tf.contrib's loss scaling and a Keras 2 trainer. Each stack
interpreter must be the one the Makefile builds (.venv-tf115: Python 3.7, TF 1.15; .venv-tf265:
Python 3.9, TF 2.6.5); where one is missing the test skips, saying which.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
TF265 = REPO_ROOT / ".venv-tf265" / "bin" / "python"
needs_tf115 = pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
needs_tf265 = pytest.mark.skipif(
    not TF265.exists(), reason="the TF 2.6.5 stack (.venv-tf265, `make stack-venvs`) is not built"
)

TF1_FILE = """\
import tensorflow as tf


def create_optimizer(loss, init_lr):
    global_step = tf.train.get_or_create_global_step()
    opt = tf.train.GradientDescentOptimizer(init_lr)
    manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**15, 1000)
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)
    return opt.minimize(loss, global_step=global_step)
"""
# Builds its optimizer when imported, so the import runs the ported class on that stack's Keras.
KERAS2_FILE = """\
import tensorflow as tf


def build(optimizer):
    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)


OPTIMIZER = build(tf.keras.optimizers.SGD(0.1))
"""
MANIFEST = (
    "repository\tcommit\tpath\tkind\texpect\n"
    "me/tiny\t0\ttf1_opt.py\ttf1-contrib\tchanged; no-contrib; "
    "has:from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer\n"
    "me/tiny\t0\tkeras2_opt.py\tkeras2\tchanged; has:LossScaleOptimizer(optimizer)\n"
)


def _harness(
    tmp_path: Path, files: dict[str, str], *flags: str, timeout: int = 900
) -> subprocess.CompletedProcess:
    """Write `files` as the snapshot of the tiny set and run the harness on it as a user does."""
    snapshot = tmp_path / "snapshot"
    (snapshot / "me+tiny").mkdir(parents=True)
    for name, text in files.items():
        (snapshot / "me+tiny" / name).write_text(text)
    (tmp_path / "manifest.tsv").write_text(MANIFEST)
    (tmp_path / "extras.tsv").write_text("")
    return subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "realcode.py"),
            str(snapshot),
            *("--manifest", str(tmp_path / "manifest.tsv")),
            *("--extras", str(tmp_path / "extras.tsv")),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """Run the harness on the tiny set; returns the process and each file's row by column."""
    files = {"tf1_opt.py": TF1_FILE, "keras2_opt.py": KERAS2_FILE}
    done = _harness(tmp_path, files, *flags)
    lines = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        rows[cells["file"]] = cells
    return done, rows


@needs_tf115
@needs_tf265
def test_each_file_runs_on_the_stacks_of_its_kind(tmp_path: Path) -> None:
    done, rows = _run(
        tmp_path,
        "--tf1-stack",
        f"tf1.15={TF115}",
        "--stack",
        f"tf2.6.5={TF265}",
        "--compile",
        f"py3.7={TF115}",
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    tf1, keras2 = rows["tf1_opt.py"], rows["keras2_opt.py"]
    assert (tf1["style"], keras2["style"]) == ("tf1", "tf2")
    assert tf1["compiles on py3.7"] == keras2["compiles on py3.7"] == "ok"
    # The TF 1 file is trained on TF 1.15 as written: reference variables, the overflowed step
    # skipped; and on TF 2.6.5 through tf.compat.v1.
    skipped = "ok (overflow skipped, step advanced on clean steps only; reference variables)"
    assert tf1["import on tf1.15"] == "ok" and tf1["train on tf1.15"] == skipped
    assert tf1["import on tf2.6.5"] == "ok" and tf1["train on tf2.6.5"] == skipped
    # The Keras 2 file never goes to TF 1.15 (its Keras has no LossScaleOptimizer); TF 2.6.5
    # imports it, building the ported optimizer on Keras 2.
    assert keras2["import on tf1.15"] == keras2["train on tf1.15"] == "-"
    assert keras2["import"] == keras2["import on tf2.6.5"] == "ok"
    assert "tf1.15: import ok 1, fail 0, n/a 0; train ok 1, fail 0, n/a 0" in done.stdout
    assert "tf2.6.5: import ok 2, fail 0, n/a 0; train ok 1, fail 0, n/a 1" in done.stdout
    assert "expectations met: 5/5" in done.stdout


@needs_tf115
def test_the_npu_bridge_port_trains_on_tf115_through_the_stand_in(tmp_path: Path) -> None:
    done, rows = _run(tmp_path, "--target", "npu-bridge", "--tf1-stack", f"tf1.15={TF115}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    tf1, keras2 = rows["tf1_opt.py"], rows["keras2_opt.py"]
    # The expectation naming npu_lossscale's import is not checked on this target.
    assert tf1["expectations"] == "2/2 (1 not checked)"
    assert tf1["import on tf1.15"] == "ok (stub: npu_bridge)"
    assert tf1["train on tf1.15"] == (
        "ok (overflow skipped, step advanced on clean steps only; reference variables; "
        "npu_bridge: ExponentialUpdateLossScaleManager, NPULossScaleOptimizer)"
    )
    # The Keras port builds the adapter's TF 2.6.5 class (the test suite's npu_device stand-in):
    # like the adapter it wraps Keras 2 optimizers only, so on TF 2.21's Keras 3 it refuses by
    # name; the row is excused by the target's warning that nothing pins Keras 2.
    assert keras2["import"].startswith("FAIL TypeError")
    assert "(Keras 2's class) was named here" in keras2["import"]
    assert "target: npu-bridge (ported with --target npu-bridge" in done.stdout


@needs_tf115
def test_a_port_that_python37_cannot_compile_fails_its_row(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import realcode
        import realcode_stacks
    finally:
        sys.path.remove(str(BENCHMARKS))
    for name, text in {
        "plain.py": "x = 1\n",
        "walrus.py": "if (n := 1):\n    pass\n",
    }.items():
        (tmp_path / name).write_text(text)
    rows = [realcode.Row("me/tiny", "0", name, "k", []) for name in ("new", "old", "same")]
    realcode_stacks.compile_with(
        str(TF115),
        [
            (rows[0], tmp_path / "walrus.py", tmp_path / "plain.py"),  # the port brought it
            (rows[1], tmp_path / "walrus.py", tmp_path / "walrus.py"),  # the project had it
            (rows[2], tmp_path / "plain.py", tmp_path / "plain.py"),
        ],
        "py3.7",
    )
    assert rows[0].compiled["py3.7"] == "FAIL SyntaxError: invalid syntax (line 1)"
    assert rows[0].failures == ["compile on py3.7 failed: SyntaxError: invalid syntax (line 1)"]
    assert rows[1].compiled["py3.7"].startswith("n/a (unported too: SyntaxError")
    assert rows[1].failures == [] and rows[2].compiled["py3.7"] == "ok"


def test_a_snapshot_older_than_the_manifest_is_named_before_any_port(tmp_path: Path) -> None:
    done = _harness(tmp_path, {"tf1_opt.py": TF1_FILE}, timeout=120)  # no keras2_opt.py
    snapshot = tmp_path / "snapshot"
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{snapshot} lacks 1 of the manifest's files:\n  me+tiny/keras2_opt.py\n" in done.stderr
    assert "--materialize" in done.stderr and "|" not in done.stdout
