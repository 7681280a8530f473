"""The TF managers as the Keras front-end and ported TF2 scripts use them: called like
TensorFlow's LossScale objects (`loss_scaler()`), and carrying is_distributed (the multi-replica
case runs in tests/library/keras/test_keras_distributed.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from npu_lossscale.tf.distributed import NoDistributedEngineError
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from npu_lossscale.tf.optimizer import NPULossScaleOptimizer


def test_calling_a_manager_gives_its_loss_scale_eagerly() -> None:
    dynamic = ExponentialUpdateLossScaleManager(2.0**10, 1, decr_every_n_nan_or_inf=1)
    fixed = FixedLossScaleManager(128)
    assert float(dynamic()) == float(dynamic.get_loss_scale()) == 1024.0
    assert float(fixed()) == 128.0
    dynamic.update_loss_scale(False)  # one overflow: times decr_ratio 0.8, in float32
    assert float(dynamic()) == float(dynamic.get_loss_scale()) == 819.2000122070312


def test_calling_a_manager_in_a_graph_fetches_the_same_tensor() -> None:
    with tf.Graph().as_default():
        manager = ExponentialUpdateLossScaleManager(2.0**5, 1)
        assert manager() is manager.get_loss_scale()  # the shared 'loss_scale:0' read
        update = manager.update_loss_scale(tf.constant(True))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(update)
            assert session.run(manager()) == 64.0


def test_is_distributed_is_keyword_only_and_checked() -> None:
    assert FixedLossScaleManager(8).is_distributed is False
    assert ExponentialUpdateLossScaleManager(8, 2, is_distributed=True).is_distributed is True
    with pytest.raises(TypeError):
        FixedLossScaleManager(8, True, "auto", True)  # type: ignore[misc]
    with pytest.raises(ValueError, match="is_distributed"):
        ExponentialUpdateLossScaleManager(8, 2, is_distributed="yes")


def test_a_distributed_manager_without_an_engine_says_so() -> None:
    manager = ExponentialUpdateLossScaleManager(8, 2, is_distributed=True)
    with pytest.raises(NoDistributedEngineError):
        manager.update_loss_scale(True)


class CountingReducer:
    """An engine of one worker that counts how often the flag is summed."""

    def __init__(self) -> None:
        self.calls = 0

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        self.calls += 1
        return tensor


def test_the_optimizer_inherits_the_managers_flag_and_reduces_once() -> None:
    manager = ExponentialUpdateLossScaleManager(
        2.0**4, 100, decr_every_n_nan_or_inf=1, decr_ratio=0.5, is_distributed=True
    )
    reducer = CountingReducer()
    inner = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    opt = NPULossScaleOptimizer(inner, manager, reducer=reducer)
    assert opt._is_distributed is True
    assert NPULossScaleOptimizer(inner, manager, False)._is_distributed is False
    weight = tf.Variable([1.0])
    for value in (1.0, float("inf")):
        opt.apply_gradients([(tf.constant([value]), weight)])
    # One sum per step, by the optimizer; the manager, handed the agreed flag, adds none (with
    # no engine active its own reduction would have raised NoDistributedEngineError).
    assert reducer.calls == 2
    assert weight.numpy()[0] == 0.5
    assert (float(manager()), int(manager.skipped_steps)) == (8.0, 1)
