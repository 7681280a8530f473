"""TF2 custom loops: GradientTape with get_scaled_loss / get_unscaled_gradients, eagerly and in
tf.function, plus eager minimize; v1 optimizers update tf.Variables eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from chip import saturate

import npu_lossscale as nl


def make(mode: str, scale: float = 1024.0):
    w = tf.Variable([1.0, 2.0, 3.0])
    step = tf.Variable(0, dtype=tf.int64)
    manager = nl.FixedLossScaleManager(scale, overflow_mode=mode)
    opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.1), manager)
    return w, step, opt


def unscaled_grad(opt, w, k):
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(k * tf.reduce_sum(w * w))
    (grad,) = opt.get_unscaled_gradients([tape.gradient(scaled, w)])
    return grad


def tape_step(w, step, opt, k):
    grad = unscaled_grad(opt, w, k)
    opt.apply_gradients([(grad, w)], global_step=step)
    return grad


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_tape_loop_unscales_applies_and_skips(mode):
    w, step, opt = make(mode)
    grad = tape_step(w, step, opt, tf.constant(1.0))
    np.testing.assert_array_equal(grad.numpy(), [2.0, 4.0, 6.0])  # d/dw sum(w^2) = 2w
    assert int(step.numpy()) == 1 and bool(opt.last_step_applied.numpy())
    before = w.numpy().copy()
    tape_step(w, step, opt, tf.constant(np.inf))
    np.testing.assert_array_equal(w.numpy(), before)
    assert int(step.numpy()) == 1 and not bool(opt.last_step_applied.numpy())
    assert int(opt.skipped_steps.numpy()) == 1
    tape_step(w, step, opt, tf.constant(1.0))
    assert int(step.numpy()) == 2


def test_tape_loop_saturation_only_in_saturation_mode():
    # k = 20: scaled gradient of w[2] = 1024 * 20 * 6 = 122880 >= 65504, finite in float32.
    for mode, applied in (("inf_nan", True), ("saturation", False)):
        w, step, opt = make(mode)
        tape_step(w, step, opt, tf.constant(20.0))
        assert bool(opt.last_step_applied.numpy()) is applied
        assert int(step.numpy()) == int(applied)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_tape_loop_inside_tf_function(mode):
    w, step, opt = make(mode)

    @tf.function
    def train(k):
        tape_step(w, step, opt, k)

    train(tf.constant(1.0))
    assert int(step.numpy()) == 1
    before = w.numpy().copy()
    train(tf.constant(np.nan))
    np.testing.assert_array_equal(w.numpy(), before)
    assert int(step.numpy()) == 1
    assert int(opt.skipped_steps.numpy()) == 1
    train(tf.constant(20.0))  # saturates only in saturation mode
    assert int(step.numpy()) == (2 if mode == "inf_nan" else 1)
    train(tf.constant(1.0))
    assert int(opt.skipped_steps.numpy()) == (1 if mode == "inf_nan" else 2)


def test_crafted_chip_gradients_eagerly():
    w, step, opt = make("saturation")
    chip_grads = saturate(np.array([1.0, 1e6, np.nan], np.float32))  # as the chip returns them
    (grad,) = opt.get_unscaled_gradients([tf.constant(chip_grads)])
    opt.apply_gradients([(grad, w)], global_step=step)
    assert int(step.numpy()) == 0 and not bool(opt.last_step_applied.numpy())


def test_eager_minimize_with_callable_loss():
    w, step, opt = make("inf_nan")
    opt.minimize(lambda: tf.reduce_sum(w * w), global_step=step)
    assert int(step.numpy()) == 1
    assert np.all(w.numpy() < [1.0, 2.0, 3.0])


def test_foreign_gradients_are_checked_under_the_mode():
    w, step, opt = make("saturation")
    opt.apply_gradients([(tf.constant([0.0, 64.0, 0.0]), w)], global_step=step)  # 64*1024
    assert int(step.numpy()) == 0
    opt.apply_gradients([(tf.constant([0.0, 1.0, 0.0]), w)], global_step=step)
    assert int(step.numpy()) == 1


def test_eager_clipping_cannot_hide_a_saturated_backward_pass():
    # k = 20 saturates w[2]'s scaled gradient (122880); clipping the unscaled gradient to norm 1
    # brings every element far below 65504 / 1024, so only the backward pass knows.
    w, step, opt = make("saturation")
    grad = unscaled_grad(opt, w, tf.constant(20.0))
    (clipped,), _ = tf.clip_by_global_norm([grad], 1.0)
    before = w.numpy().copy()
    opt.apply_gradients([(clipped, w)], global_step=step)
    np.testing.assert_array_equal(w.numpy(), before)
    assert int(step.numpy()) == 0 and int(opt.skipped_steps.numpy()) == 1
    # The skipped pass was taken by that apply: the next clean, clipped step is applied.
    (clipped,), _ = tf.clip_by_global_norm([unscaled_grad(opt, w, tf.constant(1.0))], 1.0)
    opt.apply_gradients([(clipped, w)], global_step=step)
    assert int(step.numpy()) == 1 and int(opt.skipped_steps.numpy()) == 1


def test_eager_accumulated_micro_batches_keep_each_pass_status():
    # Two micro-batches whose saturated elements cancel in the sum: the sum alone looks clean.
    w, step, opt = make("saturation")
    total = unscaled_grad(opt, w, tf.constant(20.0)) + unscaled_grad(opt, w, tf.constant(-20.0))
    np.testing.assert_array_equal(total.numpy(), [0.0, 0.0, 0.0])
    opt.apply_gradients([(total, w)], global_step=step)
    assert int(step.numpy()) == 0 and int(opt.skipped_steps.numpy()) == 1
    total = unscaled_grad(opt, w, tf.constant(1.0)) + unscaled_grad(opt, w, tf.constant(2.0))
    opt.apply_gradients([(total, w)], global_step=step)
    assert int(step.numpy()) == 1


def test_eager_sum_of_clean_micro_batches_is_applied():
    # Each pass is clean (largest scaled element 1024 * 10 * 2 * 3 = 61440 < 65504), but the
    # unscaled sum, 120, would reach 65504 if it were taken for a single pass's gradient.
    w, step, opt = make("saturation")
    total = unscaled_grad(opt, w, tf.constant(10.0)) + unscaled_grad(opt, w, tf.constant(10.0))
    opt.apply_gradients([(total, w)], global_step=step)
    assert int(step.numpy()) == 1 and int(opt.skipped_steps.numpy()) == 0


def test_eager_inf_made_after_the_backward_pass_is_skipped():
    w, step, opt = make("saturation")
    grad = unscaled_grad(opt, w, tf.constant(1.0)) * tf.constant([1.0, np.inf, 1.0])
    opt.apply_gradients([(grad, w)], global_step=step)
    assert int(step.numpy()) == 0 and int(opt.skipped_steps.numpy()) == 1
