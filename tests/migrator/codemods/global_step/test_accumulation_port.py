"""The gradient-accumulating create_optimizer of BERT-family pre-training scripts, ported and run.

The fixture advances global_step by hand in both branches (when an accumulated update is applied
and its micro-batches were finite; when a plain step is finite). After the port the step must
advance exactly when the loss-scale optimizer applies an update, keep the script's op name, and a
LAMB-style optimizer that reads global_step in apply_gradients must read the step being made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli

FIXTURE = MIGRATOR_FIXTURES / "bert_accum"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    src = tmp_path_factory.mktemp("accum_src")
    out = tmp_path_factory.mktemp("accum_out")
    for name in ("optimization.py", "run_accum.py"):
        shutil.copy(FIXTURE / name, src / name)
    report = out / "report.json"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(report.read_text(encoding="utf-8"))


def _run(ported: Path, optimizer_type: str, accumulation: int, pattern: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    proc = subprocess.run(
        [sys.executable, "run_accum.py", optimizer_type, str(accumulation), pattern],
        cwd=ported,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_both_hand_made_increments_move_into_every_optimizer_class(ported) -> None:
    out, report = ported
    warnings = [f for f in report["findings"] if f["kind"] == "warning"]
    assert warnings == []
    moved = [f for f in report["findings"] if f["rule"] == "global-step-move"]
    assert any("AdamLikeOptimizer.apply_gradients" in f["message"] for f in moved)
    assert any("LambLikeOptimizer.apply_gradients" in f["message"] for f in moved)


@pytest.mark.parametrize("optimizer_type", ["adam", "lamb"])
def test_with_accumulation_the_step_advances_exactly_when_an_update_is_applied(
    ported, optimizer_type: str
) -> None:
    # Micro-batch pairs: clean+clean (applied), overflow+clean (skipped), clean+clean, clean+over.
    result = _run(ported[0], optimizer_type, 2, "ccocccco")
    applied = [row["applied"] for row in result["rows"]]
    assert applied == [False, True, False, False, False, True, False, False]
    assert [row["global_step"] for row in result["rows"]] == [0, 1, 1, 1, 1, 2, 2, 2]
    assert result["advance_step_op"]  # the script's own op name survives the move


def test_without_accumulation_and_a_step_reading_optimizer(ported) -> None:
    result = _run(ported[0], "lamb", 1, "coc")
    rows = result["rows"]
    assert [row["applied"] for row in rows] == [True, False, True]
    assert [row["global_step"] for row in rows] == [1, 1, 2]
    # LAMB's bias correction reads the step being made, as under TF 1.15 before the move (the
    # skipped step runs no update, so the value seen stays).
    assert [row["seen_step"] for row in rows] == [1.0, 1.0, 2.0]
