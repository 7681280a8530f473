"""`getattr()` in a TF1 script: only one on tf.contrib hides which loss-scale class is used.

Ported with the real CLI in a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import run_cli

SCRIPT = """import tensorflow as tf

opt = getattr(tf.train, "AdamOptimizer")(0.1)
opt = tf.contrib.mixed_precision.LossScaleOptimizer(
    opt, tf.contrib.mixed_precision.FixedLossScaleManager(128)
)
"""


def test_a_getattr_on_another_tensorflow_module_is_ported_around_and_not_reported(
    tmp_path: Path,
) -> None:
    """`getattr(tf.train, "AdamOptimizer")` picks an optimizer, not a loss-scale class: the
    file is ported as usual, and no unresolved-access warning names the getattr."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    report = tmp_path / "report.json"
    done = run_cli("--write", "--quiet", "--report", report, script)
    assert done.returncode == 0, done.stderr
    ported = script.read_text(encoding="utf-8")
    assert 'opt = getattr(tf.train, "AdamOptimizer")(0.1)\n' in ported
    assert "NPULossScaleOptimizer(\n    opt, FixedLossScaleManager(128)\n)" in ported
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert not [f for f in findings if f["rule"] == "unresolved-access"]
