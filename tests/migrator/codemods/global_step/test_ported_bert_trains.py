"""Port the BERT-style fixture with the real CLI, then train it under TensorFlow with npu_lossscale.

The driver starts from a loss scale far too large for its fp16 forward pass, so the first steps
overflow and are skipped. It detects skipped steps on its own (no trainable variable changed), so
`global_step == steps - skipped` checks the move end to end: the step advances only where the
loss-scale optimizer really applied the gradients.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli

FIXTURE = MIGRATOR_FIXTURES / "bert"


@pytest.fixture(scope="module")
def ported(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("bert_src")
    out = tmp_path_factory.mktemp("bert_out")
    for name in ("optimization.py", "run_tiny.py"):
        shutil.copy(FIXTURE / name, src / name)
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--no-color", "-j", "1")
    assert proc.returncode == 0, proc.stderr
    return out


def _run(ported: Path, optimizer_type: str, steps: int, accumulation: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("INF_NAN_MODE_ENABLE", None)
    proc = subprocess.run(
        [sys.executable, "run_tiny.py", optimizer_type, str(steps), str(accumulation)],
        cwd=ported,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_port_uses_npu_loss_scaling_and_moves_the_step(ported):
    tree = ast.parse((ported / "optimization.py").read_text())
    code = ast.unparse(tree)
    assert "contrib" not in code
    assert "NPULossScaleOptimizer" in code
    create = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "create_optimizer"
    )
    assert "global_step.assign" not in ast.unparse(create)


# With accumulation the original script advanced the step on every micro-batch, overflowed or
# not (it would report global_step == steps); after the move only applied updates count.
@pytest.mark.parametrize(
    ("optimizer_type", "steps", "accumulation"), [("adam", 24, 1), ("lamb", 24, 1), ("adam", 40, 2)]
)
def test_global_step_counts_only_applied_steps(ported, optimizer_type, steps, accumulation):
    result = _run(ported, optimizer_type, steps, accumulation)
    assert result["steps"] == steps
    assert 0 < result["skipped"] < steps  # the huge initial scale overflows, then recovers
    assert result["global_step"] == steps - result["skipped"]
