"""A Keras LossScaleOptimizer whose private state the script replaces after building it
(neurst's `opt._loss_scale = RevisedDynamicLossScale(...)`) stays Keras's, with the reason:
npu_lossscale.keras's class keeps its own state under such names, and the port failed at its
first step (`'RevisedDynamicLossScale' object has no attribute 'remember'`)."""

from __future__ import annotations

from migrator.pipeline.transform import migrate_source

SOURCE = """import tensorflow as tf
from mylib import RevisedDynamicLossScale


def make_optimizer(optimizer):
    opt = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    {write}
    return opt
"""


def _port(write: str) -> tuple[str, list]:
    source = SOURCE.format(write=write)
    result = migrate_source(source.encode(), path="train.py")
    return result.new_source.decode(), result.findings


def test_a_replaced_private_attribute_keeps_keras_class_and_says_why() -> None:
    ported, findings = _port("opt._loss_scale = RevisedDynamicLossScale(initial_loss_scale=8)")
    assert ported == SOURCE.format(
        write="opt._loss_scale = RevisedDynamicLossScale(initial_loss_scale=8)"
    )
    (left,) = [f for f in findings if f.kind == "warning"]
    assert (left.line, left.rule) == (6, "keras-loss-scale-optimizer")
    assert "replaces its private `opt._loss_scale` (line 7)" in left.message


def test_a_public_attribute_or_another_objects_private_one_does_not() -> None:
    for write in ("opt.name = 'scaled'", "optimizer._iterations = None"):
        ported, findings = _port(write)
        assert "opt = LossScaleOptimizer(optimizer)" in ported, write
        assert not [f for f in findings if f.kind == "warning"], write
