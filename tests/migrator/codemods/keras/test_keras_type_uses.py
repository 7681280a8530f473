"""Keras's LossScaleOptimizer named in a type test or an annotation is left as written without a
word: npu_lossscale.keras's class subclasses Keras's own, so `isinstance`, unittest's
`assertIsInstance` and an annotation stay true of the port. The Model Garden's trainer test
(`assertIsInstance`) and stylegan-tf2's helpers (annotated parameters) had been told to port them
by hand. Proven by running the ported test module on this TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_runner import REPO_ROOT, run_cli

SOURCE = """import json
import typing
import unittest

import tensorflow as tf


def make(float16: bool) -> tf.keras.optimizers.Optimizer:
    optimizer = tf.keras.optimizers.SGD(0.1)
    if float16:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def unscale(grads, optimizer: tf.keras.mixed_precision.LossScaleOptimizer):
    return optimizer.get_unscaled_gradients(grads)


def scaled(optimizer) -> typing.Optional[tf.keras.mixed_precision.LossScaleOptimizer]:
    kept: tf.keras.mixed_precision.LossScaleOptimizer = optimizer
    return kept if isinstance(kept, tf.keras.mixed_precision.LossScaleOptimizer) else None


class MakeTest(unittest.TestCase):
    def test_wrapped(self):
        optimizer = make(True)
        self.assertIsInstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        self.assertIs(scaled(optimizer), optimizer)
        grads = unscale([tf.constant(optimizer.initial_scale)], optimizer)
        self.assertEqual(float(grads[0]), 1.0)
        print(json.dumps({"class": type(optimizer).__module__}))


if __name__ == "__main__":
    unittest.main()
"""


def test_type_tests_and_annotations_are_left_and_still_hold(tmp_path: Path) -> None:
    script = tmp_path / "trainer_test.py"
    script.write_text(SOURCE)
    report = tmp_path / "report.json"
    proc = run_cli("--write", "--report", report, script)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert not [f for f in findings if f["rule"] == "unported-api"]
    ported = script.read_text()
    assert "optimizer = LossScaleOptimizer(optimizer)" in ported  # the construction is ported
    assert ported.count("tf.keras.mixed_precision.LossScaleOptimizer") == 5  # the rest stays
    run = subprocess.run(
        [sys.executable, str(script), "-v"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert '"class": "npu_lossscale.keras' in run.stdout
