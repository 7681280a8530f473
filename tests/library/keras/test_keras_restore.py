"""Keras 3 class: a restored scale that would poison the weights, an engine that is not there,
an optimizer of the other Keras. Real checkpoints written by Keras's own optimizer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_lossscale.keras.optimizer import LossScaleOptimizer
from npu_lossscale.tf.distributed import NoDistributedEngineError

X = np.random.default_rng(0).random((8, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((8, 1), dtype=np.float32)


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])


@pytest.mark.parametrize("bad", [0.0, 1e-40, 0.25, np.inf])
def test_restored_unusable_scale_goes_to_the_floor_and_weights_stay_finite(
    tmp_path, capfd, bad
) -> None:
    stock_model = _model()
    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    stock.build(stock_model.trainable_variables)
    stock.dynamic_scale.assign(bad)  # as a stock run whose scale collapsed saves it
    path = tf.train.Checkpoint(optimizer=stock).save(str(tmp_path / "stock"))

    model = _model()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01))
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(optimizer=opt).restore(path).expect_partial()
    assert float(opt.loss_scale) == pytest.approx(bad, abs=1e-45) or not np.isfinite(bad)
    model.compile(optimizer=opt, loss="mse")
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)  # two steps
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert float(opt.loss_scale) == 1.0  # the floor: skipped, reset, then one clean step
    assert "reset to the floor" in capfd.readouterr().err


def test_restored_zero_scale_in_an_xla_step(tmp_path) -> None:
    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    stock.build(_model().trainable_variables)
    stock.dynamic_scale.assign(0.0)
    path = tf.train.Checkpoint(optimizer=stock).save(str(tmp_path / "stock"))
    model = _model()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01))
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(optimizer=opt).restore(path).expect_partial()
    model.compile(optimizer=opt, loss="mse", jit_compile=True)  # XLA cannot print: reset only
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert float(opt.loss_scale) == 1.0 and int(opt.skipped_steps) == 1


def test_is_distributed_without_an_engine_names_the_keras_class() -> None:
    model = _model()
    model.compile(
        optimizer=LossScaleOptimizer(keras.optimizers.SGD(), is_distributed=True), loss="mse"
    )
    with pytest.raises(NoDistributedEngineError) as raised:
        model.fit(X, Y, verbose=0)
    message = str(raised.value)
    assert "npu_lossscale.keras.LossScaleOptimizer(is_distributed=True)" in message
    assert "NPULossScaleOptimizer" not in message and "reducer=" not in message


def test_a_keras2_optimizer_is_refused_with_what_to_change() -> None:
    tf_keras = pytest.importorskip("tf_keras", reason="tf_keras not installed")
    with pytest.raises(ValueError, match="Keras 2 optimizer.*TF_USE_LEGACY_KERAS=1"):
        LossScaleOptimizer(tf_keras.optimizers.legacy.SGD())


def test_a_keras3_optimizer_is_refused_by_the_keras2_class() -> None:
    pytest.importorskip("tf_keras", reason="tf_keras not installed")
    from npu_lossscale.keras.keras2 import LossScaleOptimizer as Keras2LossScaleOptimizer

    with pytest.raises(TypeError, match="Keras 3 optimizer.*TF_USE_LEGACY_KERAS") as raised:
        Keras2LossScaleOptimizer(keras.optimizers.SGD())
    # what was found: the Keras 2 class named directly, in a process whose tf.keras is Keras 3
    version = ".".join(tf.__version__.split(".")[:2])
    assert f"TensorFlow {version}'s tf.keras is Keras 3" in str(raised.value)
    assert "is Keras 2)" not in str(raised.value)
