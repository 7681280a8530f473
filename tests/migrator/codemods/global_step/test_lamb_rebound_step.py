"""A LAMB that rebinds `global_step` before reading it (NEZHA's shape), ported and trained.

Its apply_gradients never reads the step it is handed: `global_step = get_or_create_global_step()
+ 1` reads the variable, before this step's updates, and counts the step being made. The move
renames that local and advances the argument after the updates, so the bias correction still sees
`step + 1` (deterministically now; the original's read was unordered with its assignment) and the
learning rate outside sees the step before. Expected weights: the numpy LAMB of
test_lamb_step_reads, which the unported script matches on TF 1.15 where it was written.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json
from test_lamb_step_reads import STEPS, _reference

FIXTURE = MIGRATOR_FIXTURES / "lamb_rebound"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
needs_tf115 = pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    src = tmp_path_factory.mktemp("rebound_src")
    out = tmp_path_factory.mktemp("rebound_out")
    shutil.copy(FIXTURE / "optimization.py", src / "optimization.py")
    shutil.copy(MIGRATOR_FIXTURES / "bert_lamb" / "train_steps.py", src / "train_steps.py")
    report = src.parent / "rebound_report.json"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    return {"src": src, "out": out, "findings": findings}


def _assert_lamb(results: dict) -> None:
    expected = _reference("lamb")
    for config, rows in results.items():
        assert [r["global_step"] for r in rows] == list(range(1, STEPS + 1)), config
        np.testing.assert_allclose(
            [r["weights"] for r in rows], expected, rtol=1e-4, atol=1e-6, err_msg=config
        )


def test_the_increment_moves_in_and_the_local_is_renamed(ported: dict) -> None:
    code = (ported["out"] / "optimization.py").read_text(encoding="utf-8")
    assert "    global_step_read = tf.train.get_or_create_global_step() + 1\n" in code
    assert "    t = tf.cast(global_step_read, tf.float32)\n" in code
    assert "      updates.extend([global_step.assign(new_global_step)])\n" in code
    assert "\n  return train_op\n" in code  # the step is no longer advanced outside
    rules = [(f["line"], f["rule"], f["kind"]) for f in ported["findings"]]
    assert not [r for r in rules if r[1] == "global-step-manual"]
    moves = [f for f in ported["findings"] if f["rule"] == "global-step-move"]
    assert [f["line"] for f in moves] == [26, 61]  # the update outside, the class's return
    assert "global_step_read" in moves[1]["message"]


def test_ported_lamb_trains_like_the_reference_here(ported: dict) -> None:
    results = run_json(
        sys.executable,
        ported["out"],
        "train_steps.py",
        str(STEPS),
        "lamb:resource:fp32",
        "lamb:resource:fp16",
        "lamb:ref:fp16",
    )["results"]
    _assert_lamb(results)


@needs_tf115
def test_on_tf115_the_port_trains_like_the_original(ported: dict) -> None:
    """Reference variables, where the script was written: the unported fp32 run is the reference
    (or, where its unordered read lost the race, NaN); the port is the reference every time."""
    original = run_json(TF115, ported["src"], "train_steps.py", str(STEPS), "lamb:ref:fp32")
    rows = original["results"]["lamb:ref:fp32"]
    if not np.isnan([r["weights"] for r in rows]).all():
        _assert_lamb(original["results"])
    _assert_lamb(
        run_json(
            TF115, ported["out"], "train_steps.py", str(STEPS), "lamb:ref:fp32", "lamb:ref:fp16"
        )["results"]
    )
