"""npu_lossscale.keras's Keras 2 class on real Keras 2: tf_keras (TF 2.16+) or TF 2.6.5's tf.keras.

Runs wherever a Keras 2 is importable (also under ``pytest -m stacks`` on TF 2.6.5) and skips with
the reason elsewhere. Keras 2's own behaviour is the reference: where the test says "as Keras 2",
the same scenario runs through ``tf.keras.mixed_precision.LossScaleOptimizer`` and must match.
Python 3.7-compatible on purpose.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.stacks
tf = pytest.importorskip("tensorflow")
if int(tf.__version__.split(".")[0]) < 2:
    pytest.skip("TensorFlow 1.x has no Keras 2 LossScaleOptimizer", allow_module_level=True)

from npu_lossscale.keras.select import KerasVersionError, keras2  # noqa: E402

try:
    k2 = keras2()
except KerasVersionError as missing:
    pytest.skip(f"no Keras 2 here: {missing}", allow_module_level=True)

from npu_lossscale.keras.keras2 import LossScaleOptimizer  # noqa: E402
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager  # noqa: E402

STOCK = k2.mixed_precision.LossScaleOptimizer
_legacy = getattr(k2.optimizers, "legacy", None)
CLASSIC = _legacy if _legacy is not None else k2.optimizers  # OptimizerV2 optimizers
KINDS = [("classic", CLASSIC)] + ([("newer", k2.optimizers)] if _legacy is not None else [])
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _sgd(kind, lr=1.0):
    return dict(KINDS)[kind].SGD(lr)


def _step(opt, var, grad):
    """One apply of a gradient the caller already unscaled, as tf_keras loops do."""
    opt.apply_gradients([(tf.constant(grad, tf.float32), var)])


@pytest.mark.parametrize("kind", [k for k, _ in KINDS])
def test_seed_examples_minimize_and_tape_loop(kind: str) -> None:
    opt = LossScaleOptimizer(_sgd(kind, 0.25))
    assert isinstance(opt, STOCK)
    var = tf.Variable(1.0)

    def loss_fn():
        return var**2

    opt.minimize(loss_fn, var_list=[var])
    assert var.numpy() == 0.5
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss_fn())
    (grad,) = opt.get_unscaled_gradients([tape.gradient(scaled, var)])
    opt.apply_gradients([(grad, var)])
    assert var.numpy() == 0.25
    assert float(opt.loss_scale) == 2.0**15 and int(opt.dynamic_counter) == 2


@pytest.mark.parametrize("kind", [k for k, _ in KINDS])
def test_overflow_skips_like_keras2_and_iterations_advance(kind: str) -> None:
    results = []
    for cls in (LossScaleOptimizer, STOCK):
        var = tf.Variable([1.0, 2.0])
        opt = cls(dict(KINDS)[kind].Adam(0.1), initial_scale=8.0, dynamic_growth_steps=2)
        _step(opt, var, [1.0, 1.0])
        slots = (
            [v.numpy().copy() for v in opt.variables() if v.shape == (2,)]
            if callable(opt.variables)
            else [v.numpy().copy() for v in opt.variables if v.shape == (2,)]
        )
        before = var.numpy().copy()
        _step(opt, var, [np.inf, 1.0])
        after = [
            v.numpy()
            for v in (opt.variables() if callable(opt.variables) else opt.variables)
            if v.shape == (2,)
        ]
        assert np.array_equal(var.numpy(), before)  # nothing applied
        assert all(np.array_equal(a, b) for a, b in zip(after, slots))
        _step(opt, var, [np.nan, 1.0])
        results.append((int(opt.iterations), float(opt.loss_scale), int(opt.dynamic_counter)))
    ours, stock = results
    assert ours == stock == (3, 2.0, 0)  # iterations advance on skipped steps, as Keras 2's


def test_skipped_steps_counted() -> None:
    var = tf.Variable(1.0)
    opt = LossScaleOptimizer(_sgd("classic"))
    _step(opt, var, np.inf)
    _step(opt, var, 1.0)
    assert int(opt.skipped_steps) == 1 and var.numpy() == 0.0


def test_fixed_scale_keras2_attributes_and_still_skips() -> None:
    with pytest.raises(ValueError, match="initial_scale"):
        LossScaleOptimizer(_sgd("classic"), dynamic=False)
    with pytest.raises(ValueError, match="dynamic_growth_steps"):
        LossScaleOptimizer(_sgd("classic"), dynamic=False, initial_scale=4, dynamic_growth_steps=2)
    with pytest.raises(TypeError, match="must be a bool"):
        LossScaleOptimizer(_sgd("classic"), "dynamic")
    opt = LossScaleOptimizer(_sgd("classic"), dynamic=False, initial_scale=4)
    assert opt.dynamic is False and opt.dynamic_counter is None
    assert opt.dynamic_growth_steps is None and float(opt.loss_scale) == 4.0
    var = tf.Variable(1.0)
    _step(opt, var, np.inf)  # Keras 2's fixed scale would apply it: ours never does
    assert var.numpy() == 1.0 and int(opt.skipped_steps) == 1
    assert float(opt.loss_scale) == 4.0


def test_hyperparameters_delegate_to_the_inner_optimizer() -> None:
    inner = CLASSIC.Adam(beta_1=0.8, epsilon=1e-5)
    opt = LossScaleOptimizer(inner)
    assert opt.beta_1 == 0.8
    opt.beta_1 = 0.7
    opt.learning_rate = 0.125
    assert inner.beta_1 == 0.7 and float(inner.learning_rate) == 0.125
    with pytest.raises(AttributeError):
        opt.epsilon  # noqa: B018  (not a hyperparameter: Keras 2 does not delegate it)
    assert opt.inner_optimizer is inner


@pytest.mark.parametrize("mode,applied", [("inf_nan", True), ("saturation", False)])
def test_saturation_judges_the_scaled_magnitude(mode: str, applied: bool) -> None:
    var = tf.Variable(0.0)
    opt = LossScaleOptimizer(_sgd("classic"), initial_scale=2.0, overflow_mode=mode)
    # loss = a * var: gradient a, scaled 2a; 2 * 32752 = 65504 saturates fp16 exactly
    opt.minimize(lambda: 32752.0 * var, var_list=[var])
    assert bool(var.numpy() == -32752.0) == applied
    below = tf.Variable(0.0)
    opt.minimize(lambda: 32751.0 * below, var_list=[below])
    assert below.numpy() == -32751.0


@pytest.fixture(params=["fused", "pure"])
def unscale_path(request, monkeypatch) -> str:
    """Each test twice: with the fused CPU op where it builds, and on the pure-TF path."""
    if request.param == "pure":
        monkeypatch.setenv("NPU_LOSSSCALE_FUSED", "0")
    return request.param


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_unscaled_gradients_carry_the_overflow_and_decide_the_step(unscale_path, mode) -> None:
    big, small = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
    opt = LossScaleOptimizer(_sgd("classic"), initial_scale=2.0, overflow_mode=mode)
    with tf.GradientTape() as tape:  # scaled gradients [65504, 2] and [6, -4]
        loss = tf.reduce_sum(tf.constant([32752.0, 1.0]) * big)
        loss += tf.reduce_sum(tf.constant([3.0, -2.0]) * small)
        scaled = opt.get_scaled_loss(loss)
    g_big, g_small = opt.get_unscaled_gradients(tape.gradient(scaled, [big, small]))
    expected_big = [np.inf if mode == "saturation" else 32752.0, 1.0]
    assert g_big.numpy().tolist() == expected_big and g_small.numpy().tolist() == [3.0, -2.0]
    opt.apply_gradients([(g_big, big), (g_small, small)])
    applied = mode == "inf_nan"
    assert big.numpy().tolist() == ([-32752.0, -1.0] if applied else [0.0, 0.0])
    assert small.numpy().tolist() == ([-3.0, 2.0] if applied else [0.0, 0.0])
    assert int(opt.skipped_steps) == (0 if applied else 1)


def test_gradients_changed_after_unscaling_are_checked_again(unscale_path) -> None:
    var, other = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
    opt = LossScaleOptimizer(_sgd("classic"), initial_scale=4.0, overflow_mode="saturation")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.constant([1.0, 2.0]) * var)
        loss += tf.reduce_sum(tf.constant([16376.0, 1.0]) * other)  # scaled: 65504 saturates
        scaled = opt.get_scaled_loss(loss)
    clean, saturated = opt.get_unscaled_gradients(tape.gradient(scaled, [var, other]))
    opt.apply_gradients([(clean * np.inf, var)])  # a clean gradient made inf afterwards
    assert var.numpy().tolist() == [0.0, 0.0] and int(opt.skipped_steps) == 1
    opt.apply_gradients([(clean, var)])  # its saturated neighbour is not applied: no skip
    assert var.numpy().tolist() == [-1.0, -2.0] and int(opt.skipped_steps) == 1
    assert saturated.numpy()[0] == np.inf


def test_model_fit_under_mixed_float16_trains_and_moves_the_scale() -> None:
    k2.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = k2.Sequential(
            [k2.layers.Dense(8, input_shape=(4,)), k2.layers.Dense(1, dtype="float32")]
        )
        opt = LossScaleOptimizer(CLASSIC.SGD(0.05), initial_scale=2.0**10, dynamic_growth_steps=2)
        model.compile(optimizer=opt, loss="mse")
        x = np.random.RandomState(0).rand(16, 4).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        before = model.evaluate(x, y, verbose=0)
        model.fit(x, y, batch_size=4, epochs=3, verbose=0)  # 12 clean steps
        assert model.evaluate(x, y, verbose=0) < before
        assert float(opt.loss_scale) == 2.0**16 and int(opt.iterations) == 12
    finally:
        k2.mixed_precision.set_global_policy("float32")


def test_checkpoint_carries_the_scale_and_reads_stock_checkpoints(tmp_path) -> None:
    var = tf.Variable(1.0)
    stock = STOCK(CLASSIC.SGD(1.0), initial_scale=64.0)
    _step(stock, var, np.inf)  # 32
    path = tf.train.Checkpoint(optimizer=stock, var=var).save(str(tmp_path / "stock"))
    ours = LossScaleOptimizer(CLASSIC.SGD(1.0), initial_scale=64.0)
    tf.train.Checkpoint(optimizer=ours, var=tf.Variable(0.0)).restore(path).expect_partial()
    assert float(ours.loss_scale) == 32.0
    _step(ours, tf.Variable(1.0), np.inf)  # 16
    mine = tf.train.Checkpoint(optimizer=ours).save(str(tmp_path / "ours"))
    again = LossScaleOptimizer(CLASSIC.SGD(1.0))
    tf.train.Checkpoint(optimizer=again).restore(mine)
    assert float(again.loss_scale) == 16.0 and int(again.skipped_steps) == 1


@pytest.mark.parametrize("bad", [0.0, 1e-40, 0.25])
def test_restored_unusable_scale_goes_to_the_floor_with_a_warning(tmp_path, caplog, bad) -> None:
    stock = STOCK(CLASSIC.SGD(1.0))
    stock._loss_scale.current_loss_scale.assign(bad)  # what a collapsed stock run can save
    path = tf.train.Checkpoint(optimizer=stock).save(str(tmp_path / "stock"))
    ours = LossScaleOptimizer(CLASSIC.SGD(1.0))
    tf.train.Checkpoint(optimizer=ours).restore(path).expect_partial()
    var = tf.Variable(1.0)
    with caplog.at_level(logging.WARNING, logger="npu_lossscale"):
        opt_loss = lambda: 0.5 * var  # noqa: E731
        ours.minimize(opt_loss, var_list=[var])
        ours.minimize(opt_loss, var_list=[var])
    assert np.isfinite(var.numpy()) and var.numpy() <= 1.0
    assert float(ours.loss_scale) == 1.0
    assert "reset to the floor" in caplog.text


def test_from_manager_takes_the_ascend_rule() -> None:
    manager = ExponentialUpdateLossScaleManager(256, 100, decr_every_n_nan_or_inf=2, decr_ratio=0.5)
    opt = LossScaleOptimizer.from_manager(CLASSIC.SGD(1.0), manager)
    var = tf.Variable(1.0)
    _step(opt, var, np.inf)
    assert float(opt.loss_scale) == 256.0  # one overflow: not yet
    _step(opt, var, np.inf)
    assert float(opt.loss_scale) == 128.0 and var.numpy() == 1.0


def test_is_distributed_without_an_engine_names_the_keras_class() -> None:
    opt = LossScaleOptimizer(CLASSIC.SGD(1.0), is_distributed=True)
    with pytest.raises(Exception) as raised:
        _step(opt, tf.Variable(1.0), 1.0)
    message = str(raised.value)
    assert "npu_lossscale.keras.LossScaleOptimizer(is_distributed=True)" in message
    assert "NPULossScaleOptimizer" not in message and "reducer=" not in message


def test_bad_inner_optimizers_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="tf.compat.v1 optimizer"):
        LossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    with pytest.raises(TypeError, match="cannot wrap another"):
        LossScaleOptimizer(LossScaleOptimizer(CLASSIC.SGD()))


_MIRRORED = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from npu_lossscale.keras.keras2 import LossScaleOptimizer
from npu_lossscale.keras.select import keras2
k2 = keras2()
optimizers = getattr(k2.optimizers, "legacy", k2.optimizers)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    var = tf.Variable([1.0])
    opt = LossScaleOptimizer(optimizers.SGD(1.0), initial_scale=4.0)

@tf.function
def step(poison):
    def replica():
        ctx = tf.distribute.get_replica_context()
        g = tf.where(tf.logical_and(poison, ctx.replica_id_in_sync_group == 1), np.inf, 1.0)
        opt.apply_gradients([(tf.reshape(g, [1]), var)], experimental_aggregate_gradients=False)
    strategy.run(replica)

step(tf.constant(False)); step(tf.constant(True))
print([float(v.numpy()[0]) for v in strategy.experimental_local_results(var)],
      float(opt.loss_scale), int(opt.skipped_steps))
"""


def test_mirrored_strategy_one_replica_overflows_every_replica_skips() -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-c", _MIRRORED], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Gradients not aggregated: only the flag's sum keeps the replicas together.
    assert done.stdout.strip().splitlines()[-1] == "[0.0, 0.0] 2.0 1"


def test_the_import_resolves_to_keras2_without_keras3_internals() -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, TF_USE_LEGACY_KERAS="1")
    code = (
        "import sys; from npu_lossscale.keras import LossScaleOptimizer as L; "
        "print(L.__module__, any(m.startswith('keras.src') for m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["npu_lossscale.keras.keras2", "False"]
