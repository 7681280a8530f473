"""Keras 3 optimizer behaviour the mutation run (benchmarks/mutation.py, issue 30) found unpinned.

The probe model is the one test_keras.py uses: a bias-free Dense(1) with a zero kernel, input a
and target -1, so the kernel's true gradient is exactly 2*a and a training step moves the kernel
by -learning_rate * (sum of the gradients applied).
"""

from __future__ import annotations

import numpy as np
import pytest

from npu_lossscale.keras.select import keras_generation

pytestmark = pytest.mark.skipif(keras_generation() != 3, reason="Keras 3 only")

if keras_generation() == 3:
    import keras
    import tensorflow as tf

    from npu_lossscale.keras import LossScaleOptimizer

X = np.random.default_rng(0).random((8, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((8, 1), dtype=np.float32)


def _probe() -> keras.Model:
    return keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def test_unscaled_micro_batch_gradients_summed_past_65504_still_apply_in_saturation_mode():
    """Gradient accumulation in a tf_keras-style loop: each micro-batch's scaled gradient is
    40000 (clean: under 65504 at scale 1), their unscaled sum 80000 is a true gradient, not a
    saturated one. Only the scaled values say what the chip saturated."""
    model = _probe()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1e-5), 1.0, overflow_mode="saturation")
    kernel = model.trainable_variables
    summed = None
    for _ in range(2):
        with tf.GradientTape() as tape:
            prediction = model(np.array([[20000.0]], np.float32))
            loss = opt.get_scaled_loss(tf.reduce_sum(tf.square(prediction + 1.0)))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, kernel))
        np.testing.assert_array_equal(grads[0].numpy(), [[40000.0]])
        summed = grads if summed is None else [s + g for s, g in zip(summed, grads)]
    opt.apply_gradients(zip(summed, kernel))
    np.testing.assert_allclose(kernel[0].numpy(), [[-0.8]], rtol=1e-6)
    assert (int(opt.iterations), int(opt.skipped_steps)) == (1, 0)


def _poisoned() -> np.ndarray:
    x = X.copy()
    x[0, 0] = np.inf
    return x


def test_a_clean_step_restarts_the_count_of_skips_at_the_floor() -> None:
    """max_skipped_steps_at_floor counts *consecutive* skips: skip, clean, skip is one in a row."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01), 1.0, max_skipped_steps_at_floor=2)
    model.compile(optimizer=opt, loss="mse")
    model.fit(_poisoned(), Y, batch_size=8, verbose=0)  # one skip at the floor
    model.fit(X, Y, batch_size=8, verbose=0)  # clean
    model.fit(_poisoned(), Y, batch_size=8, verbose=0)  # one skip in a row again
    assert (int(opt.iterations), int(opt.skipped_steps)) == (1, 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_skipped_steps_at_floor"):
        model.fit(_poisoned(), Y, batch_size=8, verbose=0)  # the second in a row
