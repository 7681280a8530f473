"""npu_lossscale.keras.LossScaleOptimizer where real scripts stray from one train_step function.

tf_keras 2 loops unscale their gradients themselves (get_unscaled_gradients) and Keras 3 loops
leave it to apply_gradients; real code computes and unscales in one tf.function and applies in
another, nests them, shares one optimizer between steps, or switches from Keras's own wrapper
mid-training. Every clean step here must move the weights exactly as bare SGD on the true
gradients does, and every overflowed one must apply nothing.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_lossscale.keras import LossScaleOptimizer
from npu_lossscale.tf.managers import FixedLossScaleManager

X = tf.constant(np.random.default_rng(0).random((8, 4), dtype=np.float32))
Y = tf.constant(np.random.default_rng(1).random((8, 1), dtype=np.float32))
POISONED = tf.tensor_scatter_nd_update(X, [[0, 0]], [np.inf])
LR = 0.05


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])


def _loss(model: keras.Model, x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.square(model(x) - Y))


def _bare_sgd_step(model: keras.Model, x: tf.Tensor) -> None:
    with tf.GradientTape() as tape:
        loss = _loss(model, x)
    for var, grad in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        var.assign_sub(LR * grad)


def _step_functions(model: keras.Model, opt: LossScaleOptimizer, shape: str):
    """One train step in the shapes real scripts have; returns a callable taking the input."""
    variables = model.trainable_variables

    def unscaled_grads(x: tf.Tensor) -> list:
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(_loss(model, x))
        return opt.get_unscaled_gradients(tape.gradient(scaled, variables))

    if shape == "eager":
        return lambda x: opt.apply_gradients(zip(unscaled_grads(x), variables))
    if shape == "separate":  # compute in one tf.function, apply in another
        compute = tf.function(unscaled_grads)
        apply = tf.function(lambda grads: opt.apply_gradients(zip(grads, variables)))
        return lambda x: apply(compute(x))
    if shape == "nested":  # a tf.function that computes, called by the one that applies
        compute = tf.function(unscaled_grads)
        return tf.function(lambda x: opt.apply_gradients(zip(compute(x), variables)))
    if shape == "two_steps":  # one optimizer, two train-step functions taking turns

        def step(x: tf.Tensor) -> None:
            opt.apply_gradients(zip(unscaled_grads(x), variables))

        first, second = tf.function(step), tf.function(step)
        calls = iter([first, second] * 10)
        return lambda x: next(calls)(x)
    assert shape == "subsets"  # DLRM: one unscaling, one apply per group of variables

    @tf.function
    def subsets(x: tf.Tensor) -> None:
        grads = unscaled_grads(x)
        opt.apply_gradients(zip(grads[2:], variables[2:]))
        opt.apply_gradients(zip(grads[:2], variables[:2]))

    return subsets


# Keras builds an optimizer on the variables of its first apply, so a script that applies per
# group of variables builds it on all of them first (DLRM does); the other shapes also build lazily.
@pytest.mark.parametrize(
    ("shape", "built"),
    [(shape, built) for shape in ("eager", "separate", "nested", "two_steps") for built in (0, 1)]
    + [("subsets", 1)],
)
def test_unscaled_gradients_move_the_weights_as_bare_sgd(shape: str, built: int) -> None:
    model, reference = _mlp(), _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(LR), 2.0**10)
    if built:
        opt.build(model.trainable_variables)
    step = _step_functions(model, opt, shape)
    applies = 2 if shape == "subsets" else 1
    for _ in range(3):
        step(X)
        _bare_sgd_step(reference, X)
        for ours, bare in zip(model.trainable_variables, reference.trainable_variables):
            np.testing.assert_allclose(ours.numpy(), bare.numpy(), rtol=1e-6, atol=1e-7)
    before = [v.numpy() for v in model.trainable_variables]
    step(POISONED)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
    assert int(opt.skipped_steps) == applies
    assert int(opt.iterations) == 3 * applies
    assert float(opt.loss_scale) == 2.0**10 / 2**applies
    step(X)  # and training goes on at the lowered scale
    _bare_sgd_step(reference, X)
    for ours, bare in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(ours.numpy(), bare.numpy(), rtol=1e-6, atol=1e-7)


def _sum_probe() -> keras.Model:
    """loss = sum(w * x) with w = 0: the kernel's gradient is x itself (times the scale)."""
    return keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def test_saturation_at_a_scale_of_100_is_caught_across_functions() -> None:
    # The float16 backward pass rounds 100 * 655 to 65504, which the kernel's float32 gradient
    # holds exactly; but 65504 / 100 * 100 is 65503.996 in float32, so only a decision taken on
    # the scaled value sees the saturation.
    assert np.float32(65504.0) / np.float32(100.0) * np.float32(100.0) < 65504.0
    model = keras.Sequential(
        [
            keras.Input((1,)),
            keras.layers.Dense(
                1, use_bias=False, kernel_initializer="zeros", dtype="mixed_float16"
            ),
        ]
    )
    opt = LossScaleOptimizer(keras.optimizers.SGD(1e-9), 100.0, overflow_mode="saturation")

    def scaled_grads() -> list:
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(model(tf.constant([[655.0]]))))
        return tape.gradient(scaled, model.trainable_variables)

    assert scaled_grads()[0].numpy()[0, 0] == 65504.0
    compute = tf.function(lambda: opt.get_unscaled_gradients(scaled_grads()))

    @tf.function
    def apply(grads: list) -> None:
        opt.apply_gradients(zip(grads, model.trainable_variables))

    apply(compute())
    assert (int(opt.skipped_steps), int(opt.iterations), float(opt.loss_scale)) == (1, 0, 50.0)
    assert model.weights[0].numpy()[0, 0] == 0.0
    apply(compute())  # 32768 at the scale of 50: clean, and it reached the traced function
    assert (int(opt.skipped_steps), int(opt.iterations)) == (1, 1)


def test_a_loop_traced_before_the_first_apply_follows_the_scale() -> None:
    # Traced before the optimizer is built, the loss scaling must read the scale variable, not
    # freeze the initial scale into the graph: after the overflow at 4 the step runs at 2.
    model = _sum_probe()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1e-9), 4.0, overflow_mode="saturation")

    @tf.function
    def compute() -> list:
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(model(tf.constant([[16376.0]]))))
        return tape.gradient(scaled, model.trainable_variables)

    apply = tf.function(lambda grads: opt.apply_gradients(zip(grads, model.trainable_variables)))
    apply(compute())  # 4 * 16376 = 65504: saturated
    apply(compute())  # 2 * 16376: clean
    assert (int(opt.skipped_steps), int(opt.iterations), float(opt.loss_scale)) == (1, 1, 2.0)


def test_mixing_model_fit_and_get_unscaled_gradients_is_logged(caplog) -> None:
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(LR), 2.0**10)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X, Y, verbose=0)
    with caplog.at_level("WARNING", logger="npu_lossscale"):
        opt.get_unscaled_gradients([tf.ones((4, 8))])
    assert "already applied scaled gradients" in caplog.text


def test_a_tf_keras_style_loop_from_the_first_step_is_not_warned(caplog) -> None:
    """The warning above is for mixing kinds of loop: a loop that unscales the gradients itself
    from its first step on (tf_keras's get_scaled_loss / get_unscaled_gradients) never hears it."""
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(LR), 2.0**10)
    with caplog.at_level("WARNING", logger="npu_lossscale"):
        for _ in range(2):
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(_loss(model, X))
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
            opt.apply_gradients(zip(grads, model.trainable_variables))
    assert int(opt.iterations) == 2
    assert "already applied scaled gradients" not in caplog.text


def test_the_default_growth_interval_is_keras_own() -> None:
    """Drop-in: a script that leaves dynamic_growth_steps out gets Keras's interval, and reads
    the same number back."""
    ours = LossScaleOptimizer(keras.optimizers.SGD(LR))
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(LR))
    assert ours.dynamic_growth_steps == theirs.dynamic_growth_steps == 2000


def test_a_keras_loss_scale_checkpoint_restores_into_ours(tmp_path) -> None:
    def trained(opt: keras.optimizers.Optimizer) -> keras.Model:
        model = _mlp()
        model.compile(optimizer=opt, loss="mse")
        model.fit(X, Y, batch_size=4, epochs=3, verbose=0)  # 6 steps: the scale grows 3 times
        return model

    theirs = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3), 2.0**10, 2)
    model = trained(theirs)
    path = tf.train.Checkpoint(model=model, optimizer=theirs).save(str(tmp_path / "keras"))
    ours = LossScaleOptimizer(keras.optimizers.Adam(1e-3), 2.0**10, 2)
    restored = _mlp()
    restored.compile(optimizer=ours, loss="mse")
    ours.build(restored.trainable_variables)
    # Keras's wrapper has no bad-step, floor or skip counters to restore: they start at zero.
    tf.train.Checkpoint(model=restored, optimizer=ours).restore(path).expect_partial()
    assert float(ours.loss_scale) == float(theirs.dynamic_scale.numpy()) == 2.0**13
    assert int(ours.iterations) == 6 and int(ours.dynamic_counter.numpy()) == 0
    for mine, their in zip(ours.inner_optimizer.variables, theirs.inner_optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), their.numpy())
    restored.fit(X, Y, batch_size=4, verbose=0)  # and it trains on from there
    assert int(ours.iterations) == 8 and float(ours.loss_scale) == 2.0**14


@pytest.mark.parametrize(
    "inner",
    [
        lambda: LossScaleOptimizer(keras.optimizers.SGD(0.1)),
        lambda: keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
    ],
)
def test_wrapping_a_loss_scale_optimizer_is_refused(inner) -> None:
    with pytest.raises(ValueError, match="inner_optimizer is already a loss-scale optimizer"):
        LossScaleOptimizer(inner())


@pytest.mark.parametrize("dynamic", [True, False])
def test_tf_keras_2_positional_order_says_which_keyword(dynamic: bool) -> None:
    with pytest.raises(ValueError, match=f"initial_scale.*Keras 3's order.*dynamic={dynamic}"):
        LossScaleOptimizer(keras.optimizers.SGD(0.1), dynamic, 128)
    assert LossScaleOptimizer(keras.optimizers.SGD(0.1), 128.0, 10).initial_scale == 128.0


def test_the_stuck_guard_needs_a_dynamic_scale() -> None:
    with pytest.raises(ValueError, match="max_skipped_steps_at_floor.*dynamic=False"):
        LossScaleOptimizer(
            keras.optimizers.SGD(0.1), 64.0, dynamic=False, max_skipped_steps_at_floor=3
        )


@pytest.mark.parametrize("manager", [None, "dynamic", 128])
def test_from_manager_names_the_manager(manager: object) -> None:
    with pytest.raises(ValueError, match="manager must be an npu_lossscale"):
        LossScaleOptimizer.from_manager(keras.optimizers.SGD(0.1), manager)
    fixed = LossScaleOptimizer.from_manager(keras.optimizers.SGD(0.1), FixedLossScaleManager(128))
    assert (fixed.dynamic, float(fixed.loss_scale)) == (False, 128.0)


# Two logical CPUs must be configured before TensorFlow starts, hence a process of its own.
_STRATEGY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, tensorflow as tf, keras
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from npu_lossscale.keras import LossScaleOptimizer
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = tf.constant(np.linspace(0, 1, 16, dtype="float32").reshape(4, 4)); y = tf.zeros((4, 1))
    results = {}
    for built in (False, True, "outside"):
        if built == "outside":
            opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), 2.0**10)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            layers = [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
            model = keras.Sequential(layers)
            if built != "outside":
                opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), 2.0**10)
            if built is True:
                opt.build(model.trainable_variables)

        @tf.function
        def train_step(xb, yb):
            def step_fn():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
                    scaled = opt.scale_loss(loss)
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
            strategy.run(step_fn)

        if built == "outside":
            try:
                train_step(x, y)
            except ValueError as error:
                results[built] = str(error)
            continue
        train_step(x, y)
        train_step(x, y)
        results[str(built)] = {
            "weights": [v.numpy().tolist() for v in model.trainable_variables],
            "iterations": int(opt.iterations.numpy()),
            "scale": float(opt.loss_scale.numpy()),
        }
    json.dump(results, open(sys.argv[1], "w"))
    """
)


def test_a_custom_loop_under_a_strategy_builds_the_optimizer_itself(tmp_path) -> None:
    # Keras's own wrapper fails here with an error about a cond placeholder unless built first;
    # ours creates its scale with itself, inside the scope, and builds the rest on first use.
    out = tmp_path / "results.json"
    result = subprocess.run(
        [sys.executable, "-c", _STRATEGY_SCRIPT, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["False"] == results["True"]
    assert results["False"]["iterations"] == 2 and results["False"]["scale"] == 2.0**10
    # Made outside the scope, its variables would be one copy updated once per replica.
    assert "created outside the scope of the MirroredStrategy" in results["outside"]
    assert "strategy.scope()" in results["outside"]


def _custom_step(model: keras.Model, optimizer: Any, *, tf_keras_style: bool) -> None:
    with tf.GradientTape() as tape:
        loss = _loss(model, X)
        scaled = optimizer.get_scaled_loss(loss) if tf_keras_style else optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    if tf_keras_style:
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


@pytest.mark.parametrize("loop", ["eager", "tf.function"])
def test_model_fit_after_a_tf_keras_style_loop_still_unscales(loop: str) -> None:
    """get_unscaled_gradients makes 'the caller unscales' the optimizer's fact, but model.fit's
    train step scales the loss itself and never unscales: its apply must still divide (it
    applied the gradients 1024 times too large), exactly as Keras's own optimizer does."""
    moves = {}
    for name, make in (
        ("keras", keras.mixed_precision.LossScaleOptimizer),
        ("ours", LossScaleOptimizer),
    ):
        model = _mlp()
        optimizer = make(keras.optimizers.SGD(LR), initial_scale=1024.0)
        model.compile(optimizer=optimizer, loss="mse")

        # Keras 3 has no tf_keras names: its own loop scales and lets apply divide.
        step = functools.partial(_custom_step, model, optimizer, tf_keras_style=name == "ours")
        (tf.function(step) if loop == "tf.function" else step)()
        before = [w.numpy() for w in model.trainable_variables]
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
        after = [w.numpy() for w in model.trainable_variables]
        moves[name] = [a - b for a, b in zip(after, before)]
    for ours, theirs in zip(moves["ours"], moves["keras"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
