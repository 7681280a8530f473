"""tf.train.Checkpoint of NPULossScaleOptimizer around optimizers with slots, and is_distributed.

A checkpoint must hold every piece of state a run continues from: the model, the inner
optimizer's slots and non-slot variables (Adam's beta powers), the loss scale and the manager's
counters, and the optimizer's own last_step_applied; restoring into fresh objects and training on
must give bit-identical values to the run that never stopped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl

InnerFactory = Callable[[], tf.compat.v1.train.Optimizer]

INNER: dict[str, tuple[InnerFactory, list[str]]] = {
    "sgd": (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), []),
    "momentum": (lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), ["momentum"]),
    "adam": (lambda: tf.compat.v1.train.AdamOptimizer(0.1), ["m", "v"]),
}

# Clean, clean (the scale doubles), clean, overflow (one bad step, skipped): the scale, both
# counters, the skipped-step count and last_step_applied all differ from a fresh optimizer's.
STEPS = [1.0, 1.0, 1.0, np.inf]


def _manager() -> nl.ExponentialUpdateLossScaleManager:
    return nl.ExponentialUpdateLossScaleManager(
        2.0**10, incr_every_n_steps=2, decr_every_n_nan_or_inf=2, overflow_mode="inf_nan"
    )


def _bits(value: object) -> bytes:
    """Bit pattern of a variable's value: equal bits, not merely equal numbers (0.0 vs -0.0)."""
    array = np.asarray(value.numpy() if isinstance(value, tf.Variable) else value)
    return array.tobytes()


# ---- eager ---------------------------------------------------------------------------------------


def _eager_model(inner: InnerFactory) -> tuple[tf.Variable, nl.NPULossScaleOptimizer]:
    return tf.Variable([1.0, -2.0, 3.0]), nl.NPULossScaleOptimizer(inner(), _manager())


def _eager_step(weights: tf.Variable, opt: nl.NPULossScaleOptimizer, k: float) -> None:
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.constant(k) * tf.reduce_sum(weights * weights))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [weights]))
    opt.apply_gradients(zip(grads, [weights]))


@pytest.mark.parametrize("inner_name", list(INNER))
def test_eager_round_trip_restores_everything_and_training_continues(tmp_path, inner_name):
    inner, slot_names = INNER[inner_name]
    weights, opt = _eager_model(inner)
    for k in STEPS:
        _eager_step(weights, opt, k)
    assert int(opt.skipped_steps.numpy()) == 1
    assert not bool(opt.last_step_applied.numpy())
    assert float(opt.loss_scale.numpy()) == 2.0**11
    saved_slots = {name: _bits(opt.get_slot(weights, name)) for name in slot_names}
    saved_manager = [_bits(v) for v in opt.loss_scale_manager.variables]
    path = tf.train.Checkpoint(weights=weights, optimizer=opt).save(str(tmp_path / "ckpt"))

    # The slots are recorded once, under the inner optimizer, where TF's own
    # MixedPrecisionLossScaleOptimizer has them.
    keys = {name for name, _ in tf.train.list_variables(path)}
    value = ".ATTRIBUTES/VARIABLE_VALUE"
    for name in slot_names:
        assert f"weights/.OPTIMIZER_SLOT/optimizer/base_optimizer/{name}/{value}" in keys, keys
    assert f"optimizer/last_step_applied/{value}" in keys, keys

    restored_weights, restored = _eager_model(inner)
    assert [_bits(v) for v in restored.loss_scale_manager.variables] != saved_manager
    status = tf.train.Checkpoint(weights=restored_weights, optimizer=restored).restore(path)
    assert _bits(restored_weights) == _bits(weights)
    # Eagerly the slots are created by the restore itself, with the saved values.
    assert sorted(restored.get_slot_names()) == sorted(slot_names)
    for name in slot_names:
        assert _bits(restored.get_slot(restored_weights, name)) == saved_slots[name], name
    assert [_bits(v) for v in restored.loss_scale_manager.variables] == saved_manager
    assert int(restored.skipped_steps.numpy()) == 1
    assert not bool(restored.last_step_applied.numpy())

    # Both go on with the same clean steps (the second one doubles the scale): bit for bit the
    # same, Adam's beta powers (created on the first step, restored then) included.
    for _ in range(2):
        _eager_step(weights, opt, 1.0)
        _eager_step(restored_weights, restored, 1.0)
    status.assert_consumed()
    assert float(restored.loss_scale.numpy()) == 2.0**12
    assert bool(restored.last_step_applied.numpy())
    expected = [_bits(weights), *(_bits(v) for v in opt.variables())]
    got = [_bits(restored_weights), *(_bits(v) for v in restored.variables())]
    assert got == expected


# ---- graph (tf.compat.v1.train.Checkpoint) -------------------------------------------------------


class _GraphModel:
    """A TF1 graph with one weight vector, a train op fed a loss factor, and its checkpoint."""

    def __init__(self, inner: InnerFactory) -> None:
        self.graph = tf.Graph()
        with self.graph.as_default():
            weights = tf.compat.v1.get_variable(
                "w", initializer=[1.0, -2.0, 3.0], use_resource=True
            )
            self.k = tf.compat.v1.placeholder(tf.float32, [])
            self.opt = nl.NPULossScaleOptimizer(inner(), _manager())
            self.train_op = self.opt.minimize(self.k * tf.reduce_sum(weights * weights))
            self.checkpoint = tf.compat.v1.train.Checkpoint(weights=weights, optimizer=self.opt)
            self.state = [weights, *self.opt.variables()]
            self.loss_scale = self.opt.loss_scale
            init = tf.compat.v1.global_variables_initializer()
        self.sess = tf.compat.v1.Session(graph=self.graph)
        self.sess.run(init)

    def step(self, k: float) -> None:
        self.sess.run(self.train_op, {self.k: k})

    def state_bits(self) -> list[bytes]:
        return [_bits(value) for value in self.sess.run(self.state)]

    def save(self, prefix: str) -> str:
        with self.graph.as_default():
            return self.checkpoint.save(prefix, session=self.sess)

    def restore(self, path: str) -> None:
        with self.graph.as_default():
            self.checkpoint.restore(path).assert_consumed().run_restore_ops(self.sess)


@pytest.mark.parametrize("inner_name", ["momentum", "adam"])
def test_graph_checkpoint_round_trip(tmp_path, inner_name):
    inner = INNER[inner_name][0]
    first = _GraphModel(inner)
    for k in STEPS:
        first.step(k)
    assert first.sess.run(first.opt.skipped_steps) == 1
    path = first.save(str(tmp_path / "ckpt"))

    second = _GraphModel(inner)
    assert second.state_bits() != first.state_bits()
    second.restore(path)
    assert second.state_bits() == first.state_bits()
    for _ in range(2):
        first.step(1.0)
        second.step(1.0)
    assert second.state_bits() == first.state_bits()
    assert second.sess.run(second.loss_scale) == 2.0**12
    first.sess.close()
    second.sess.close()


# ---- is_distributed ------------------------------------------------------------------------------


class _CountingReducer:
    """Sum over a single worker (the value itself), counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        self.calls += 1
        return tensor


@pytest.mark.parametrize(
    ("flag", "distributed"),
    [
        (True, True),
        (False, False),
        (np.bool_(True), True),
        (np.bool_(False), False),
        (np.int64(3) > 1, True),  # a numpy comparison, as ported scripts compute it
        (1, True),
        (0, False),
    ],
)
def test_is_distributed_accepts_bools_numpy_bools_and_0_or_1(flag, distributed):
    reducer = _CountingReducer()
    opt = nl.NPULossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.5),
        nl.FixedLossScaleManager(8.0),
        is_distributed=flag,
        reducer=reducer,
    )
    assert opt._is_distributed is distributed
    weights = tf.Variable([1.0])
    grads = opt.get_unscaled_gradients([tf.constant([8.0])])
    opt.apply_gradients(zip(grads, [weights]))
    assert reducer.calls == int(distributed)
    assert weights.numpy().tolist() == [0.5]


@pytest.mark.parametrize("flag", ["yes", "False", 2, -1, 1.0, None, tf.constant(True)])
def test_is_distributed_rejects_other_values(flag):
    with pytest.raises(ValueError, match="is_distributed must be True or False") as caught:
        nl.NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5),
            nl.FixedLossScaleManager(8.0),
            is_distributed=flag,
        )
    assert repr(flag) in str(caught.value)
