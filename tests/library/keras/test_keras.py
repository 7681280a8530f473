"""npu_lossscale.keras.LossScaleOptimizer on real Keras 3 models and real training steps.

The gradients are steered exactly: a bias-free Dense(1) with a zero kernel, input a and target -1
gives loss (w*a + 1)**2 and so the gradient 2*a on the kernel, 2*a*S once the loss is scaled by S.
That makes the saturation boundary (|g_scaled| >= 65504) testable to the last unit.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_runner import REPO_ROOT
from rule_driver import run

from npu_lossscale.keras import LossScaleOptimizer
from npu_lossscale.rule import DynamicRule
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager

X = np.random.default_rng(0).random((16, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((16, 1), dtype=np.float32)


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])


def _probe() -> keras.Model:
    """loss = (w*a + 1)**2 with w = 0: kernel gradient exactly 2*a (times the loss scale)."""
    return keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def _fit_probe(model: keras.Model, a: float) -> None:
    model.fit(np.array([[a]], np.float32), np.array([[-1.0]], np.float32), verbose=0)


def _snapshot(model: keras.Model, opt: LossScaleOptimizer) -> list[np.ndarray]:
    inner = opt.inner_optimizer
    return [v.numpy() for v in model.weights] + [v.numpy() for v in inner.variables]


def _poisoned(value: float = np.inf) -> np.ndarray:
    x = X[:8].copy()
    x[0, 0] = value
    return x


def test_model_fit_trains_and_grows_the_scale_by_the_rule() -> None:
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.05), 2.0**10, 2)
    model.compile(optimizer=opt, loss="mse")
    before = model.evaluate(X, Y, verbose=0)
    model.fit(X, Y, batch_size=4, epochs=5, verbose=0)  # 20 clean steps, growth every 2
    assert model.evaluate(X, Y, verbose=0) < before
    assert int(opt.iterations) == 20
    assert float(opt.loss_scale) == 2.0**20
    assert int(opt.skipped_steps) == 0


@pytest.mark.parametrize("poison", [np.inf, np.nan])
def test_an_overflowed_fit_step_applies_nothing(poison: float) -> None:
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.Adam(1e-2), 2.0**10, 1000)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X[:8], Y[:8], batch_size=8, verbose=0)  # builds the slots, one applied step
    before = _snapshot(model, opt)
    model.fit(_poisoned(poison), Y[:8], batch_size=8, verbose=0)
    after = _snapshot(model, opt)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # weights, slots, iterations
    assert int(opt.iterations) == 1
    assert int(opt.skipped_steps) == 1
    assert float(opt.loss_scale) == 2.0**9
    model.fit(X[:8], Y[:8], batch_size=8, verbose=0)
    assert int(opt.iterations) == 2
    assert not np.array_equal(before[0], model.weights[0].numpy())


# Scale 2: the kernel gradient the backward pass produces is 4*a.
@pytest.mark.parametrize(
    ("mode", "a", "skipped"),
    [
        ("saturation", 16376.0, 1),  # 65504 exactly: saturated
        ("saturation", 16375.75, 0),  # 65503: the largest clean value
        ("saturation", 1e6, 1),
        ("inf_nan", 16376.0, 0),  # finite, so clean in INF_NAN mode
        ("inf_nan", 1e6, 0),
    ],
)
def test_saturation_judges_the_scaled_gradient(mode: str, a: float, skipped: int) -> None:
    model = _probe()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1e-9), 2.0, 1000, overflow_mode=mode)
    model.compile(optimizer=opt, loss="mse")
    _fit_probe(model, a)
    assert int(opt.skipped_steps) == skipped
    assert int(opt.iterations) == 1 - skipped
    assert float(opt.loss_scale) == (1.0 if skipped else 2.0)


def test_mixed_float16_policy_trains_and_skips_an_overflow() -> None:
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = _mlp()
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.05), 2.0**8, 1000)
        model.compile(optimizer=opt, loss="mse")
        assert model.layers[0].compute_dtype == "float16"
        before = model.evaluate(X, Y, verbose=0)
        model.fit(X, Y, batch_size=4, epochs=3, verbose=0)
        assert model.evaluate(X, Y, verbose=0) < before
        weights = [v.numpy() for v in model.weights]
        model.fit(_poisoned(70000.0), Y[:8], batch_size=8, verbose=0)  # inf once cast to fp16
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(weights, model.weights))
    assert (int(opt.iterations), int(opt.skipped_steps)) == (12, 1)


def _probe_loop(opt: LossScaleOptimizer, a: float, tf_keras_spelling: bool) -> keras.Model:
    model = _probe()
    x = tf.constant([[a]])

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) + 1.0))
            scaled = opt.get_scaled_loss(loss) if tf_keras_spelling else opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        if tf_keras_spelling:
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step()
    return model


@pytest.mark.parametrize("tf_keras_spelling", [False, True])
def test_custom_loops_in_both_spellings(tf_keras_spelling: bool) -> None:
    # Clean: the kernel moves by exactly lr * 2a (the gradient unscaled once, not twice).
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0, 1000, overflow_mode="saturation")
    model = _probe_loop(opt, 1000.0, tf_keras_spelling)
    assert model.weights[0].numpy()[0, 0] == -1000.0
    # Saturated: 4a = 65504 on the scaled gradient, whichever spelling unscales it.
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0, 1000, overflow_mode="saturation")
    model = _probe_loop(opt, 16376.0, tf_keras_spelling)
    assert model.weights[0].numpy()[0, 0] == 0.0
    assert (int(opt.skipped_steps), int(opt.iterations), float(opt.loss_scale)) == (1, 0, 1.0)


def test_save_and_load_keep_the_scale_and_the_counters(tmp_path) -> None:
    model = _mlp()
    opt = LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), 2.0**12, 3, decr_ratio=0.25, overflow_mode="saturation"
    )
    model.compile(optimizer=opt, loss="mse")
    model.fit(X[:8], Y[:8], batch_size=8, verbose=0)
    model.fit(_poisoned(), Y[:8], batch_size=8, verbose=0)
    model.fit(X[:8], Y[:8], batch_size=8, epochs=2, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    restored = loaded.optimizer
    assert type(restored) is LossScaleOptimizer
    assert float(restored.loss_scale) == float(opt.loss_scale) == 2.0**10
    assert int(restored.step_counter.value) == 2
    assert int(restored.skipped_steps) == 1
    assert int(restored.iterations) == 3
    assert restored.overflow_mode.value == "saturation"
    assert restored.get_config() == opt.get_config()
    loaded.fit(X[:8], Y[:8], batch_size=8, verbose=0)  # the third clean step in a row: grows
    assert float(restored.loss_scale) == 2.0**11


def test_config_round_trip_and_keras_spellings() -> None:
    opt = LossScaleOptimizer(
        keras.optimizers.SGD(0.1),
        initial_scale=512,
        dynamic_growth_steps=7,
        dynamic=False,
        is_distributed=True,
        decr_every_n_nan_or_inf=2,
        max_loss_scale=2.0**20,
        name="scaler",
    )
    clone = LossScaleOptimizer.from_config(opt.get_config())
    assert clone.get_config() == opt.get_config()
    assert clone.name == "scaler" and clone.dynamic is False and clone.is_distributed is True
    config = keras.optimizers.serialize(opt)
    assert type(keras.optimizers.deserialize(config)) is LossScaleOptimizer


def test_fixed_scale_skips_overflows_without_moving() -> None:
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.05), 128, dynamic=False)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    model.fit(_poisoned(), Y[:8], batch_size=8, verbose=0)
    assert (float(opt.loss_scale), int(opt.skipped_steps), int(opt.iterations)) == (128.0, 1, 4)


def _finite_flags(seed: int, n: int) -> list[bool]:
    return [bool(f) for f in np.random.default_rng(seed).random(n) < 0.6]


def _scales_through_fit(opt: LossScaleOptimizer, flags: list[bool]) -> list[float]:
    model = _mlp()
    model.compile(optimizer=opt, loss="mse")
    scales = []
    for finite in flags:
        model.fit(X[:8] if finite else _poisoned(), Y[:8], batch_size=8, verbose=0)
        scales.append(float(opt.loss_scale))
    return scales


def test_from_manager_takes_the_adapters_rule_step_for_step() -> None:
    manager = ExponentialUpdateLossScaleManager(2.0**12, 2, decr_every_n_nan_or_inf=2)
    opt = LossScaleOptimizer.from_manager(keras.optimizers.SGD(0.01), manager)
    flags = _finite_flags(3, 14)
    rule = DynamicRule(2, 2, 2.0, 0.8)
    expected = [state.scale for state in run(rule, 2.0**12, flags)]
    assert _scales_through_fit(opt, flags) == expected
    assert len(set(expected)) > 2  # the trace both grows and shrinks, with the 0.8 hysteresis


def test_from_fixed_manager() -> None:
    opt = LossScaleOptimizer.from_manager(
        keras.optimizers.SGD(0.01), FixedLossScaleManager(64, overflow_mode="saturation")
    )
    assert (opt.dynamic, opt.initial_scale, opt.overflow_mode.value) == (False, 64.0, "saturation")
    with pytest.raises(ValueError, match="manager"):
        LossScaleOptimizer.from_manager(
            keras.optimizers.SGD(0.01), FixedLossScaleManager(64, enable_overflow_check=False)
        )


def test_from_manager_carries_every_setting_of_the_rule() -> None:
    manager = ExponentialUpdateLossScaleManager(
        64,
        3,
        4,
        3.0,
        0.25,
        overflow_mode="saturation",
        min_loss_scale=2,
        max_loss_scale=2.0**20,
        max_skipped_steps_at_floor=7,
    )
    config = LossScaleOptimizer.from_manager(keras.optimizers.SGD(0.01), manager).get_config()
    written = {
        "initial_scale": 64.0,
        "dynamic_growth_steps": 3,
        "decr_every_n_nan_or_inf": 4,
        "incr_ratio": 3.0,
        "decr_ratio": 0.25,
        "overflow_mode": "saturation",
        "min_loss_scale": 2.0,
        "max_loss_scale": 2.0**20,
        "max_skipped_steps_at_floor": 7,
    }
    assert {key: config.get(key) for key in written} == written
    assert config.get("dynamic", True) is True


def test_stuck_at_the_floor_stops_training() -> None:
    model = _mlp()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01), 2.0, max_skipped_steps_at_floor=2)
    model.compile(optimizer=opt, loss="mse")
    model.fit(_poisoned(), Y[:8], batch_size=8, verbose=0)  # 2 -> 1
    model.fit(_poisoned(), Y[:8], batch_size=8, verbose=0)  # first skip at the floor
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_skipped_steps_at_floor"):
        model.fit(_poisoned(), Y[:8], batch_size=8, verbose=0)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"initial_scale": 0.5}, "initial_scale"),
        ({"dynamic_growth_steps": 0}, "dynamic_growth_steps"),
        ({"decr_ratio": 1.5}, "decr_ratio"),
        ({"incr_ratio": 1.0}, "incr_ratio"),
        ({"decr_every_n_nan_or_inf": 0}, "decr_every_n_nan_or_inf"),
        ({"min_loss_scale": 4.0, "initial_scale": 2.0}, "initial_scale"),
        ({"max_skipped_steps_at_floor": -1}, "max_skipped_steps_at_floor"),
        ({"overflow_mode": "bogus"}, "overflow_mode"),
        ({"is_distributed": "yes"}, "is_distributed"),
        ({"dynamic": "no"}, "dynamic"),
        ({"clipnorm": 1.0}, "clipnorm"),  # Keras's own refusal: set it on the inner optimizer
        # TF 2.1-2.3's experimental spelling, by keyword and by position: the way to write it
        ({"loss_scale": 128}, r"initial_scale=N, dynamic=False"),
        ({"initial_scale": "dynamic"}, r"\"dynamic\" is the default"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        LossScaleOptimizer(keras.optimizers.SGD(0.1), **kwargs)


def test_a_tf1_optimizer_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match="inner_optimizer.*NPULossScaleOptimizer"):
        LossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))


def test_the_tf1_optimizer_says_what_a_wrong_manager_was_meant_to_be() -> None:
    from npu_lossscale import NPULossScaleOptimizer
    from npu_lossscale.torch import ExponentialUpdateLossScaleManager as TorchManager

    inner = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for given, hint in (
        (TorchManager(2.0**10, 100), "npu_lossscale.torch's manager"),
        ("dynamic", "ExponentialUpdateLossScaleManager(init_loss_scale=2**15"),
        (128, "FixedLossScaleManager(128)"),
    ):
        with pytest.raises(ValueError, match="loss_scale_manager") as error:
            NPULossScaleOptimizer(inner, given)
        assert hint in str(error.value)


def test_the_tf1_optimizer_points_keras_users_here() -> None:
    from npu_lossscale import NPULossScaleOptimizer

    manager = ExponentialUpdateLossScaleManager(2.0**10, 100)
    with pytest.raises(ValueError, match="npu_lossscale.keras.LossScaleOptimizer"):
        NPULossScaleOptimizer(keras.optimizers.SGD(0.1), manager)
    # The README's TF2 loop with a Keras 3 model: refused before TensorFlow's '_unique_id' crash.
    model = _probe()
    opt = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
    with tf.GradientTape() as tape:
        loss = opt.get_scaled_loss(tf.reduce_sum(model(tf.ones((1, 1)))))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, model.trainable_variables))
    with pytest.raises(TypeError, match="Keras 3 variable.*npu_lossscale.keras"):
        opt.apply_gradients(zip(grads, model.trainable_variables))
    with pytest.raises(TypeError, match="npu_lossscale.keras"):
        opt.compute_gradients(lambda: tf.reduce_sum(model(tf.ones((1, 1)))), model.weights)
    assert model.weights[0].numpy()[0, 0] == 0.0


def test_the_readme_example_runs_as_written(tmp_path) -> None:
    import re
    import subprocess
    import sys

    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Keras and TF2", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "model.fit(" in code
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scale, skipped = re.fullmatch(r"loss scale (\S+) skipped steps (\d+)\n", result.stdout).groups()
    assert int(skipped) < 16  # the first float16 steps may overflow at 2**15; the rest trained
    restored = keras.models.load_model(tmp_path / "model.keras")
    assert type(restored.optimizer) is LossScaleOptimizer
    assert float(restored.optimizer.loss_scale) == float(scale) == 2.0**15 / 2 ** int(skipped)


def test_from_manager_inherits_is_distributed_unless_given() -> None:
    manager = ExponentialUpdateLossScaleManager(2.0**8, 10, is_distributed=True)
    sgd = keras.optimizers.SGD(0.1)
    assert LossScaleOptimizer.from_manager(sgd, manager).is_distributed is True
    own = LossScaleOptimizer.from_manager(sgd, manager, is_distributed=False)
    assert own.is_distributed is False
    local = ExponentialUpdateLossScaleManager(2.0**8, 10)
    assert LossScaleOptimizer.from_manager(sgd, local).is_distributed is None  # Keras's auto


def test_is_distributed_true_without_an_engine_says_so() -> None:
    from npu_lossscale.tf.distributed import NoDistributedEngineError

    model = _mlp()
    model.compile(
        optimizer=LossScaleOptimizer(keras.optimizers.SGD(0.1), is_distributed=True), loss="mse"
    )
    with pytest.raises(NoDistributedEngineError, match="no distributed engine"):
        model.fit(X[:8], Y[:8], batch_size=8, verbose=0)


@pytest.mark.parametrize("scale", [1.0, 100.0, 2.0**15])
def test_the_check_decides_as_the_tf1_check(scale: float) -> None:
    """On scaled gradients, and on the ones get_unscaled_gradients makes of them: with a scale of
    100, 65504 / 100 * 100 is 65503.996, so only judging before the division is exact."""
    from npu_lossscale.keras.overflow import local_finite, unscale
    from npu_lossscale.modes import OverflowMode
    from npu_lossscale.tf.overflow import overflow_status

    small = tf.fill([300, 300], 1.0)  # its sum of squares alone passes the TF1 fast bound
    cases = [  # as the backward pass produced them, scaled
        [small, tf.constant([65503.0])],
        [small, tf.constant([65504.0])],
        [small, tf.constant([-65504.0])],
        [small, tf.constant([np.nan])],
        [tf.constant([np.inf]), None],
        [tf.constant([1e20]), small],  # finite, but its square overflows float32
        [tf.constant([3e4, -7e4], tf.float16), small],
        [tf.IndexedSlices(tf.constant([[70000.0]]), tf.constant([0]), tf.constant([5, 1]))],
        [None],
    ]
    for mode in (OverflowMode.SATURATION, OverflowMode.INF_NAN):
        for grads in cases:
            expected = float(overflow_status(grads, mode, 1.0))
            assert (0.0 if bool(local_finite(grads, mode)) else 1.0) == expected, (mode, grads)
            unscaled = unscale(grads, tf.constant(scale), mode)
            got = 0.0 if bool(local_finite(unscaled, OverflowMode.INF_NAN)) else 1.0
            assert got == expected, (mode, grads, scale)
    decided = [0.0 if local_finite(g, OverflowMode.SATURATION) else 1.0 for g in cases]
    assert decided == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    # Clean values come back exactly as tf_keras and TF 2.6's Keras unscale them (a multiply by
    # the float32 reciprocal: 655.02997 where a division gives 655.03003 at 100), the dtype kept.
    clean = unscale(
        [tf.constant([65503.0, -3.0]), tf.constant([2.0], tf.float16)], scale, OverflowMode.INF_NAN
    )
    reciprocal = np.float32(1.0) / np.float32(scale)
    assert clean[0].numpy().tolist() == (np.float32([65503.0, -3.0]) * reciprocal).tolist()
    assert clean[1].dtype == tf.float16
