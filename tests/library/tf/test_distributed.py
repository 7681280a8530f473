"""is_distributed=True: one skip-or-apply decision for all replicas, and clear errors without one.

The MirroredStrategy scenarios run in one subprocess (tests/library/tf/workers/mirrored_worker.py)
because two logical CPU devices must be configured before TensorFlow initialises, which another test
module in this process may already have done. Expected numbers are hand-derived in
distributed_expected.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from distributed_expected import EXPECTED

from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer
from npu_lossscale.tf.distributed import (
    NoDistributedEngineError,
    Reducer,
    TFDistributeReducer,
    check_reducer_argument,
    detect_engine,
    resolve_reducer,
)

WORKER = Path(__file__).parent / "workers" / "mirrored_worker.py"
SCENARIO_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("mirrored") / "results.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=SCENARIO_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == 0, output[-6000:]
    data = json.loads(out.read_text())
    assert len(data["devices"]) == 2
    return data


@pytest.mark.parametrize("api", ["graph", "function", "graph-per-replica"])
@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("schedule", ["mixed", "clean"])
def test_mirrored_replicas_take_one_decision(
    mirrored: dict, api: str, mode: str, schedule: str
) -> None:
    """Overflow on one replica only -> both skip; identical weights, scales and counters."""
    records = mirrored["results"][f"{api}/{mode}/{schedule}"]
    expected = EXPECTED[schedule]
    assert len(records) == len(expected)
    for number, (seen, want) in enumerate(zip(records, expected)):
        where = f"{api}/{mode}/{schedule} after step {number}"
        for replica_weights in seen["w"]:
            np.testing.assert_array_equal(replica_weights, want["w"], err_msg=where)
        assert seen["scale"] == [want["scale"]] * 2, where
        assert seen["good_steps"] == [want["good_steps"]] * 2, where
        assert seen["skipped"] == [want["skipped"]] * 2, where
        assert seen["global_step"] == [want["global_step"]] * 2, where


def test_without_the_all_reduce_the_scenario_catches_the_bug(mirrored: dict) -> None:
    """Control: a reducer that only looks at its own flag lets replica 0 apply replica 1's inf."""
    after_step_1 = mirrored["results"]["graph/inf_nan/mixed/local-only"][1]
    assert not np.all(np.isfinite(after_step_1["w"]))


def _train_once(optimizer_factory, poison: float = 1.0):
    """Build one step in a fresh graph with no distribution at all; return fetched state."""
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        manager = ExponentialUpdateLossScaleManager(
            256, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
        )
        optimizer, feeds = optimizer_factory(manager)
        train_op = optimizer.minimize(0.5 * tf.reduce_sum(weights * weights) * poison)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, feeds)
            return session.run([weights, manager.get_loss_scale(), manager.skipped_steps])


def _sgd() -> tf.compat.v1.train.Optimizer:
    return tf.compat.v1.train.GradientDescentOptimizer(0.5)


def test_no_engine_fails_at_graph_build_with_what_was_searched() -> None:
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=[1.0], use_resource=True)
        manager = ExponentialUpdateLossScaleManager(256, 2, overflow_mode="inf_nan")
        optimizer = NPULossScaleOptimizer(_sgd(), manager, is_distributed=True)
        with pytest.raises(NoDistributedEngineError) as caught:
            optimizer.minimize(tf.reduce_sum(weights))
    message = str(caught.value)
    for needle in ("tf.distribute", "Horovod", "hvd.init()", "npu_bridge", "reducer="):
        assert needle in message, (needle, message)


def test_no_engine_error_inside_tf_function_too() -> None:
    weights = tf.Variable([1.0])
    manager = ExponentialUpdateLossScaleManager(256, 2, overflow_mode="inf_nan")
    optimizer = NPULossScaleOptimizer(_sgd(), manager, is_distributed=True)

    @tf.function
    def step() -> None:
        optimizer.minimize(tf.reduce_sum(weights), var_list=[weights])

    with pytest.raises(NoDistributedEngineError, match="reducer="):
        step()


def test_engines_that_are_absent_here_are_reported_as_absent() -> None:
    assert "horovod.tensorflow" not in sys.modules
    assert detect_engine() is None
    with pytest.raises(NoDistributedEngineError, match=r"horovod\.tensorflow is not imported"):
        resolve_reducer("horovod")
    with pytest.raises(NoDistributedEngineError, match=r"npu_bridge\.hccl"):
        resolve_reducer("hccl")
    with pytest.raises(NoDistributedEngineError, match="no tf.distribute replica context"):
        resolve_reducer("tf.distribute")


@pytest.mark.parametrize("bad", ["mpi", "", 3, object()])
def test_bad_reducer_argument_is_rejected_at_construction(bad: object) -> None:
    with pytest.raises(ValueError, match="reducer must be"):
        check_reducer_argument(bad)
    with pytest.raises(ValueError, match="reducer must be"):
        NPULossScaleOptimizer(
            _sgd(), ExponentialUpdateLossScaleManager(2, 2), is_distributed=True, reducer=bad
        )


class PeerFlag:
    """An explicit reducer that adds another worker's overflow flag, fed in by the test."""

    def __init__(self) -> None:
        self.peer = tf.compat.v1.placeholder(tf.float32, [], name="peer_overflow")

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor + self.peer


@pytest.mark.parametrize("peer_overflow, applied", [(0.0, True), (1.0, False)])
def test_explicit_reducer_object_decides_for_everyone(peer_overflow: float, applied: bool) -> None:
    """Clean local gradients are still skipped when the sum says a peer overflowed."""
    assert isinstance(PeerFlag.__new__(PeerFlag), Reducer)

    def factory(manager):
        reducer = PeerFlag()
        optimizer = NPULossScaleOptimizer(_sgd(), manager, is_distributed=True, reducer=reducer)
        return optimizer, {reducer.peer: peer_overflow}

    weights, scale, skipped = _train_once(factory)
    if applied:  # w - 0.5 * w
        np.testing.assert_array_equal(weights, [0.5, -1.0])
        assert (scale, skipped) == (256.0, 0)
    else:
        np.testing.assert_array_equal(weights, [1.0, -2.0])
        assert (scale, skipped) == (128.0, 1)


def test_single_replica_strategy_needs_no_collective() -> None:
    """One replica is correct and cheap: the flag passes through without any all-reduce op."""
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            weights = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
            manager = ExponentialUpdateLossScaleManager(
                256, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
            )
            optimizer = NPULossScaleOptimizer(_sgd(), manager, is_distributed=True)
            poison = tf.compat.v1.placeholder(tf.float32, [])

            def replica_fn() -> tf.Operation:
                assert detect_engine() == "tf.distribute"
                flag = tf.constant(0.0)
                assert TFDistributeReducer().all_reduce_sum(flag) is flag
                return optimizer.minimize(0.5 * tf.reduce_sum(weights * weights) * poison)

            train_op = strategy.group(strategy.extended.call_for_each_replica(replica_fn))
        op_types = {op.type for op in graph.get_operations()}
        assert not any("Collective" in op_type or "AllReduce" in op_type for op_type in op_types)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, {poison: float("inf")})
            assert session.run(manager.skipped_steps) == 1
            session.run(train_op, {poison: 1.0})
            np.testing.assert_array_equal(session.run(weights), [0.5, -1.0])
            assert session.run(manager.get_loss_scale()) == 128.0


def test_not_distributed_with_two_replicas_is_refused(mirrored: dict) -> None:
    message = mirrored["not_distributed_error"]
    assert "2 replicas" in message and "is_distributed=True" in message, message


def test_not_distributed_with_one_replica_strategy_works() -> None:
    """The single-device case keeps is_distributed=False (the vendor's rule) under a strategy."""
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            weights = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
            manager = ExponentialUpdateLossScaleManager(
                256, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
            )
            optimizer = NPULossScaleOptimizer(_sgd(), manager)
            poison = tf.compat.v1.placeholder(tf.float32, [])
            train_op = strategy.group(
                strategy.extended.call_for_each_replica(
                    lambda: optimizer.minimize(0.5 * tf.reduce_sum(weights * weights) * poison)
                )
            )
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, {poison: float("inf")})
            session.run(train_op, {poison: 1.0})
            np.testing.assert_array_equal(session.run(weights), [0.5, -1.0])
            assert session.run([manager.get_loss_scale(), manager.skipped_steps]) == [128.0, 1]
