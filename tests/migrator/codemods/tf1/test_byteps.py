"""BytePS trains on several workers, but npu_lossscale has no BytePS engine to sum the overflow
flag over (tf.distribute, Horovod and HCCL only): the port leaves `is_distributed` out, as it
must (True would find no engine and raise), and warns at the optimizer, for the TF1 and the Keras
port alike (BytePS's own example scripts, the shapes a new-user probe found ported silently)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import run_cli

TF1 = (
    "import tensorflow as tf\nimport byteps.tensorflow as bps\n\nbps.init()\n"
    "opt = tf.train.AdamOptimizer(0.01)\nopt = bps.DistributedOptimizer(opt)\n"
    "manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
    "opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)\n"
)
KERAS = (
    "import tensorflow as tf\nimport byteps.tensorflow.keras as bps\n\nbps.init()\n"
    "opt = tf.keras.optimizers.Adam(0.01)\n"
    "opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)\n"
    "opt = bps.DistributedOptimizer(opt)\n"
)
RULE = "distributed-engine-unsupported"


def test_a_byteps_script_is_ported_without_is_distributed_and_warned(tmp_path: Path) -> None:
    src, out, report = tmp_path / "src", tmp_path / "out", tmp_path / "report.json"
    src.mkdir()
    (src / "tf1.py").write_text(TF1, encoding="utf-8")
    (src / "keras_bps.py").write_text(KERAS, encoding="utf-8")
    proc = run_cli(src, "--output-dir", out, "--report", report)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    warned = {
        (Path(f["path"]).name, f["line"]): f["message"] for f in findings if f["rule"] == RULE
    }
    assert set(warned) == {("tf1.py", 8), ("keras_bps.py", 6)}  # at the loss-scale optimizer
    assert 'overflow_mode="inf_nan"` to the loss-scale manager' in warned["tf1.py", 8]
    assert "reducer=" in warned["tf1.py", 8]
    assert "reducer=" not in warned["keras_bps.py", 6]  # the Keras classes take none
    tf1 = (out / "tf1.py").read_text(encoding="utf-8")
    assert "opt = NPULossScaleOptimizer(opt, manager)\n" in tf1
    keras = (out / "keras_bps.py").read_text(encoding="utf-8")
    assert "opt = LossScaleOptimizer(opt)\n" in keras
    for text in (tf1, keras):
        compile(text, "ported.py", "exec")
