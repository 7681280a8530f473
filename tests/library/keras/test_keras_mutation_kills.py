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


def test_the_default_scale_is_2_to_the_15_as_keras_own_and_a_first_gradient_of_2_saturates():
    """Left out, initial_scale is Keras's own default (keras.mixed_precision's optimizer,
    2**15): the probe's first gradient, 2, is 65536 scaled, past float16's 65504, so in
    saturation mode the first step is skipped and the scale halves; the second, at 2**14,
    applies."""
    keras_own = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())
    assert keras_own.get_config()["initial_scale"] == 2.0**15
    model = _probe()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.25), overflow_mode="saturation")
    assert float(opt.loss_scale) == 2.0**15
    model.compile(optimizer=opt, loss="mse")
    x, y = np.ones((1, 1), np.float32), -np.ones((1, 1), np.float32)
    model.fit(x, y, batch_size=1, verbose=0)
    assert model.weights[0].numpy()[0, 0] == 0.0
    assert (int(opt.iterations), int(opt.skipped_steps), float(opt.loss_scale)) == (0, 1, 2.0**14)
    model.fit(x, y, batch_size=1, verbose=0)  # 2 * 2**14 = 32768: clean
    assert model.weights[0].numpy()[0, 0] == -0.5  # 0 - 0.25 * 2
    assert (int(opt.iterations), int(opt.skipped_steps)) == (1, 1)


def _eager_fit_step(model: keras.Model, opt: LossScaleOptimizer, x: np.ndarray) -> None:
    model.fit(x, Y, batch_size=8, verbose=0)


def _eager_loop_step(model: keras.Model, opt: LossScaleOptimizer, x: np.ndarray) -> None:
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(keras.losses.mean_squared_error(Y, model(x)))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.weights))


@pytest.mark.parametrize("step", [_eager_fit_step, _eager_loop_step], ids=["fit", "loop"])
def test_eager_training_stuck_at_the_floor_stops_at_the_limit_and_not_before(step) -> None:
    """Run eagerly (model.fit with run_eagerly=True, or a custom loop outside tf.function), the
    stuck guard is a Python check: skips at the floor below max_skipped_steps_at_floor are
    skipped quietly, the one that reaches it raises, and none of them moves a weight."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01), 1.0, max_skipped_steps_at_floor=3)
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    before = [w.numpy() for w in model.weights]
    step(model, opt, _poisoned())
    step(model, opt, _poisoned())  # two in a row, below the limit of 3
    assert (int(opt.iterations), int(opt.skipped_steps), float(opt.loss_scale)) == (0, 2, 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_skipped_steps_at_floor"):
        step(model, opt, _poisoned())  # the third in a row
    assert (int(opt.iterations), int(opt.skipped_steps)) == (0, 3)
    for weight, initial in zip(model.weights, before):
        np.testing.assert_array_equal(weight.numpy(), initial)


def test_scale_loss_after_get_unscaled_gradients_warns_once_over_eager_steps(caplog) -> None:
    """A tf_keras-style loop (get_unscaled_gradients) and then model.fit run eagerly on the same
    optimizer: the user is told once, not at every step of the fit."""
    model = _probe()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1e-3), 4.0)
    kernel = model.trainable_variables
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(tf.square(model(np.ones((1, 1))) + 1.0)))
    opt.apply_gradients(zip(opt.get_unscaled_gradients(tape.gradient(loss, kernel)), kernel))
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    with caplog.at_level("WARNING", logger="npu_lossscale"):
        model.fit(
            np.ones((3, 1), np.float32), -np.ones((3, 1), np.float32), batch_size=1, verbose=0
        )
        model.fit(
            np.ones((2, 1), np.float32), -np.ones((2, 1), np.float32), batch_size=1, verbose=0
        )
    warned = [r for r in caplog.records if "scale_loss (which model.fit calls)" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert int(opt.iterations) == 6  # the loop's step and the fit's five


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_a_restored_run_already_past_a_lowered_stuck_limit_stops_at_its_next_skip(
    tmp_path, run_eagerly
) -> None:
    """Saved after 4 skips in a row at the floor under max_skipped_steps_at_floor=10, resumed
    with the limit lowered to 3: the run is already past its new limit, so its next skip at the
    floor stops training, in model.fit's tf.function as eagerly, and moves no weight."""
    keras.utils.set_random_seed(0)
    saved_model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    saved = LossScaleOptimizer(keras.optimizers.SGD(0.01), 1.0, max_skipped_steps_at_floor=10)
    saved_model.compile(optimizer=saved, loss="mse")
    for _ in range(4):
        saved_model.fit(_poisoned(), Y, batch_size=8, verbose=0)
    path = tf.train.Checkpoint(optimizer=saved).save(str(tmp_path / "run"))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01), 1.0, max_skipped_steps_at_floor=3)
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(optimizer=opt).restore(path).assert_existing_objects_matched()
    assert (int(opt.iterations), int(opt.skipped_steps), float(opt.loss_scale)) == (0, 4, 1.0)
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    before = [w.numpy() for w in model.weights]
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_skipped_steps_at_floor"):
        model.fit(_poisoned(), Y, batch_size=8, verbose=0)
    assert int(opt.skipped_steps) == 5
    for weight, initial in zip(model.weights, before):
        np.testing.assert_array_equal(weight.numpy(), initial)
