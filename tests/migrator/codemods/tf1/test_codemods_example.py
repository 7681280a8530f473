"""examples/train_fp16.py: written for tf.contrib, it must train once npu-migrate has ported it."""

from __future__ import annotations

import ast
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

from cli_runner import REPO_ROOT, cli_env, run_cli

EXAMPLE = REPO_ROOT / "examples" / "train_fp16.py"
TRACE = re.compile(r"step\s+(\d+)\s+loss\s+(\S+)\s+loss scale\s+(\S+)\s+skipped\s+(\d+)")


def _scale(text: str) -> float:
    """`2^31` or a plain number, as the example prints loss scales."""
    base, _, exponent = text.partition("^")
    return float(base) ** int(exponent) if exponent else float(text)


def test_ported_example_trains(tmp_path: Path) -> None:
    script = tmp_path / "train_fp16.py"
    shutil.copy(EXAMPLE, script)
    assert "tf.contrib.mixed_precision" in script.read_text()

    result = run_cli("--write", "-q", script)
    assert result.returncode == 0, result.stderr
    tree = ast.parse(script.read_text())
    attributes = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    assert not [a for a in attributes if "contrib" in a]
    imported = {
        a.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module == "npu_lossscale"
        for a in n.names
    }
    assert imported == {"ExponentialUpdateLossScaleManager", "NPULossScaleOptimizer"}

    run = subprocess.run(
        [sys.executable, str(script), "--steps", "30", "--trace-every", "5"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [
        (int(s), float(loss), _scale(scale), int(skipped))
        for s, loss, scale, skipped in TRACE.findall(run.stdout)
    ]
    assert [r[0] for r in rows] == [1, 5, 10, 15, 20, 25, 30]
    first, last = rows[0], rows[-1]
    # 2**32 overflows float16 gradients: the first step is skipped and the scale is lowered ...
    assert first[3] == 1
    assert last[2] < 2.0**32
    # ... until the scaled gradients fit, after which steps are applied and the loss falls.
    assert last[3] < last[0]
    assert all(math.isfinite(r[1]) for r in rows)
    assert last[1] < first[1]
