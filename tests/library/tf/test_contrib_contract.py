"""Managers written to tf.contrib's contract work with NPULossScaleOptimizer, as with the adapter's.

contrib's contract is two methods, get_loss_scale() and update_loss_scale(finite_grads); scripts
subclass LossScaleManager without calling its __init__ (contrib's had none) or write a plain
class. The manager below moves its scale by +1 on a clean step and -1 on an overflow, so what
the optimizer handed it is visible in the scale; x = [1, 2] with loss sum(k * w * x) under SGD
with learning rate 1 loses k * x on a clean step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl

pytestmark = pytest.mark.stacks

X = np.array([1.0, 2.0], np.float32)


class Plain:
    """Duck-typed: no base class at all."""

    def __init__(self, scale):
        self._scale = tf.compat.v1.Variable(scale, dtype=tf.float32, trainable=False)

    def get_loss_scale(self):
        return self._scale

    def update_loss_scale(self, finite_grads):
        return tf.cond(
            finite_grads,
            lambda: tf.compat.v1.assign_add(self._scale, 1.0),
            lambda: tf.compat.v1.assign_sub(self._scale, 1.0),
        )


class Subclassed(nl.LossScaleManager, Plain):
    """contrib-style subclass: overrides the two methods, never calls LossScaleManager.__init__."""

    def __init__(self, scale):
        Plain.__init__(self, scale)

    get_loss_scale = Plain.get_loss_scale
    update_loss_scale = Plain.update_loss_scale


@pytest.mark.parametrize("manager_class", [Plain, Subclassed])
def test_a_contrib_contract_manager_drives_the_optimizer(manager_class):
    graph = tf.Graph()
    with graph.as_default():
        k = tf.compat.v1.placeholder(tf.float32, [])
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 1.0]))
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = manager_class(8.0)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), manager)
        train = opt.minimize(tf.reduce_sum(k * w * tf.constant(X)), global_step=step)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        expected_w = np.array([1.0, 1.0], np.float32)
        for value, scale_after in [(np.nan, 7.0), (np.inf, 6.0), (0.5, 7.0)]:
            sess.run(train, {k: value})
            if np.isfinite(value):
                expected_w = expected_w - np.float32(value) * X
            got_w, got_scale = sess.run([w, manager.get_loss_scale()])
            np.testing.assert_allclose(got_w, expected_w, rtol=1e-6)
            assert got_scale == scale_after
        assert sess.run([step, opt.skipped_steps]) == [1, 2]


def test_an_object_without_the_contract_is_refused():
    with pytest.raises(ValueError, match=r"get_loss_scale\(\) and update_loss_scale"):
        nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), object())


@pytest.mark.parametrize("check", [True, False])
def test_fixed_manager_says_whether_it_checks_overflow(check):
    with tf.Graph().as_default():
        manager = nl.FixedLossScaleManager(128.0, enable_overflow_check=check)
    assert manager.get_enable_overflow_check() is check
