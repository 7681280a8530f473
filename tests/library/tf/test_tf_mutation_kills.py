"""TF1 front-end behaviour that the mutation run (benchmarks/mutation.py, issue 30) found unpinned.

Horovod is not installed here (it builds against one TensorFlow and CPU-only wheels do not
exist), so the Horovod scenarios register a stand-in ``horovod.tensorflow`` module with the four
names the library uses (``is_initialized``, ``size``, ``allreduce``, ``Sum``): its "all-reduce"
adds a second worker's overflow flag, fed by the test, to this worker's — what a two-process
``hvd.allreduce(op=hvd.Sum)`` returns. The HCCL case does the same with a stand-in for the
Ascend adapter's ``hccl_ops`` (installed on Ascend hosts only), handed over as a reducer or
written as a stand-in ``npu_bridge`` package (with ``hccl.manage.api.get_rank_size``) on
sys.path so that the adapter is found the way an Ascend host's is. TensorFlow itself is real
throughout.
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from npu_lossscale import (
    ExponentialUpdateLossScaleManager,
    LossScaleManager,
    NPULossScaleOptimizer,
)
from npu_lossscale.tf import kernels
from npu_lossscale.tf.distributed import HcclReducer, NoDistributedEngineError, detect_engine


def _horovod(monkeypatch: pytest.MonkeyPatch, *, initialised: bool, size: int = 2, old=False):
    """Register a two-worker Horovod whose other worker's overflow flag is a placeholder."""
    hvd = types.ModuleType("horovod.tensorflow")
    hvd.Sum = "Sum"
    hvd.peer = None

    def _size() -> int:
        if not initialised:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        return size

    def allreduce(tensor: tf.Tensor, op: object = None, name: str | None = None) -> tf.Tensor:
        assert op == hvd.Sum
        hvd.peer = tf.compat.v1.placeholder(tf.float32, [], name="peer_overflow")
        return tensor + hvd.peer

    hvd.size = _size
    hvd.allreduce = allreduce
    if not old:  # Horovod >= 0.21 has is_initialized(); older ones only raise from size()
        hvd.is_initialized = lambda: initialised
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", hvd)
    return hvd


def _one_step(is_distributed: bool, feed_peer: float | None, hvd=None, poison: float = 1.0):
    """One SGD step of 0.5 * |w|^2 from w = [1, -2] at scale 256; (weights, scale, skipped)."""
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        manager = ExponentialUpdateLossScaleManager(
            256, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
        )
        optimizer = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5), manager, is_distributed
        )
        train_op = optimizer.minimize(0.5 * tf.reduce_sum(weights * weights) * poison)
        feeds = {} if feed_peer is None else {hvd.peer: feed_peer}
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, feeds)
            return session.run([weights, manager.get_loss_scale(), manager.skipped_steps])


def test_under_horovod_a_peer_overflow_skips_the_clean_local_step(monkeypatch) -> None:
    hvd = _horovod(monkeypatch, initialised=True)
    assert detect_engine() == "horovod"
    weights, scale, skipped = _one_step(True, 1.0, hvd)
    np.testing.assert_array_equal(weights, [1.0, -2.0])
    assert (scale, skipped) == (128.0, 1)
    weights, scale, skipped = _one_step(True, 0.0, hvd)  # nobody overflowed: w - 0.5 * w
    np.testing.assert_array_equal(weights, [0.5, -1.0])
    assert (scale, skipped) == (256.0, 0)


@pytest.mark.parametrize("old", [False, True], ids=["is_initialized", "size-raises"])
def test_horovod_imported_but_not_initialised_is_no_engine(monkeypatch, old: bool) -> None:
    _horovod(monkeypatch, initialised=False, old=old)
    assert detect_engine() is None
    with pytest.raises(NoDistributedEngineError, match="no distributed engine"):
        _one_step(True, None)
    # One worker without Horovod: is_distributed=False trains as usual.
    weights, _, _ = _one_step(False, None)
    np.testing.assert_array_equal(weights, [0.5, -1.0])


def test_a_strategy_replica_context_wins_over_an_initialised_horovod(monkeypatch) -> None:
    """Inside strategy.run the strategy's own collectives decide: Horovod's flag is never read."""
    _horovod(monkeypatch, initialised=True)
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            weights = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
            manager = ExponentialUpdateLossScaleManager(256, 2, overflow_mode="inf_nan")
            optimizer = NPULossScaleOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.5), manager, is_distributed=True
            )
            engines = []

            def replica_fn() -> tf.Operation:
                engines.append(detect_engine())
                return optimizer.minimize(0.5 * tf.reduce_sum(weights * weights))

            train_op = strategy.group(strategy.extended.call_for_each_replica(replica_fn))
        assert engines == ["tf.distribute"]
        peer = sys.modules["horovod.tensorflow"].peer
        assert peer is None  # no Horovod all-reduce in the graph
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            np.testing.assert_array_equal(session.run(weights), [0.5, -1.0])


@pytest.mark.parametrize("flag", [2, -1, 0.0, 1.0])
def test_is_distributed_other_than_a_bool_or_0_1_is_refused(flag: object) -> None:
    with tf.Graph().as_default():
        manager = ExponentialUpdateLossScaleManager(256, 2)
        inner = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        with pytest.raises(ValueError, match="is_distributed must be True or False"):
            NPULossScaleOptimizer(inner, manager, flag)


@pytest.mark.parametrize("flag", [0, np.bool_(False)])
def test_is_distributed_0_or_a_numpy_false_trains_alone(flag: object) -> None:
    weights, scale, skipped = _one_step(flag, None)
    np.testing.assert_array_equal(weights, [0.5, -1.0])
    assert (scale, skipped) == (256.0, 0)


@pytest.mark.skipif(not hasattr(tf.keras, "Variable"), reason="Keras 3 only")
def test_compute_gradients_refuses_keras_3_variables_before_touching_them() -> None:
    import keras

    variable = keras.Variable([1.0, -2.0])
    optimizer = NPULossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.5),
        ExponentialUpdateLossScaleManager(256, 2),
    )
    with pytest.raises(TypeError, match="Keras 3 variable.*npu_lossscale.keras.LossScaleOpt"):
        optimizer.compute_gradients(lambda: tf.reduce_sum(variable * variable), [variable])
    np.testing.assert_array_equal(variable.numpy(), [1.0, -2.0])


def test_a_bad_reducer_is_refused_when_the_optimizer_is_built() -> None:
    with tf.Graph().as_default():
        inner = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        with pytest.raises(ValueError, match="reducer must be"):
            NPULossScaleOptimizer(
                inner, ExponentialUpdateLossScaleManager(256, 2), True, reducer="mpi"
            )


class _Decided:
    """An explicit reducer whose sum is known while the graph is built (a constant)."""

    def __init__(self, total: float) -> None:
        self.total = total

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        return tf.constant(self.total)


@pytest.mark.parametrize(("total", "weights"), [(0.0, [0.5, -1.0]), (1.0, [1.0, -2.0])])
def test_a_decision_known_while_building_is_applied_as_decided(total, weights) -> None:
    """A constant agreed status takes the static path: 0 applies the step, 1 skips it."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        manager = ExponentialUpdateLossScaleManager(256, 2, overflow_mode="inf_nan")
        optimizer = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5), manager, True, reducer=_Decided(total)
        )
        train_op = optimizer.minimize(0.5 * tf.reduce_sum(w * w))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            np.testing.assert_array_equal(session.run(w), weights)
            assert session.run(manager.skipped_steps) == int(total)


class _HcclOps:
    """Stand-in for npu_bridge.hccl.hccl_ops (Ascend only): allreduce adds the other rank's flag."""

    def __init__(self) -> None:
        self.peer = tf.compat.v1.placeholder(tf.float32, [], name="peer_overflow")

    def allreduce(self, tensor: tf.Tensor, reduction: str, fusion: int = 1) -> tf.Tensor:
        assert (reduction, fusion) == ("sum", 0)
        return tensor + self.peer


@pytest.mark.parametrize("ranks", [2, None], ids=["two-ranks", "rank-count-unknown"])
def test_hccl_sums_the_flag_over_the_ranks(ranks: int | None) -> None:
    """With two ranks (or when the adapter cannot say how many) the other rank's overflow
    skips this rank's clean step."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        ops = _HcclOps()
        manager = ExponentialUpdateLossScaleManager(256, 2, overflow_mode="inf_nan")
        optimizer = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5),
            manager,
            True,
            reducer=HcclReducer(ops, ranks),
        )
        train_op = optimizer.minimize(0.5 * tf.reduce_sum(w * w))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, {ops.peer: 1.0})
            np.testing.assert_array_equal(session.run(w), [1.0, -2.0])
            session.run(train_op, {ops.peer: 0.0})
            np.testing.assert_array_equal(session.run(w), [0.5, -1.0])


@pytest.mark.parametrize("factor", [float("inf"), float("nan")])
def test_an_inf_or_nan_made_after_a_clean_backward_pass_skips_the_step(factor: float) -> None:
    """The backward pass is clean, but what the script does to its gradients before applying
    them (here a rescale by a fed factor) makes inf/NaN: that step is skipped and the scale
    backs off; the same script with a finite factor applies."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        k = tf.compat.v1.placeholder(tf.float32, [])
        manager = ExponentialUpdateLossScaleManager(
            256, 100, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
        )
        optimizer = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), manager)
        grads = optimizer.compute_gradients(0.5 * tf.reduce_sum(w * w))
        train_op = optimizer.apply_gradients([(g * k, v) for g, v in grads])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op, {k: 1.0})  # w - 0.5 * w
            np.testing.assert_array_equal(session.run(w), [0.5, -1.0])
            session.run(train_op, {k: factor})
            np.testing.assert_array_equal(session.run(w), [0.5, -1.0])
            assert session.run([manager.get_loss_scale(), manager.skipped_steps]) == [128.0, 1]


def test_an_eager_scale_restored_below_the_floor_is_read_as_the_floor_and_said(
    caplog, tmp_path
) -> None:
    """Eagerly, a checkpoint whose scale (1) is below this manager's floor (4) reads as the
    floor, with a warning; a scale at or above the floor reads as itself, silently."""
    written = {}
    for scale in (1.0, 4.0, 64.0):
        source = ExponentialUpdateLossScaleManager(scale, 100)
        written[scale] = tf.train.Checkpoint(manager=source).write(str(tmp_path / str(scale)))
    for scale, expected, warned in ((1.0, 4.0, True), (4.0, 4.0, False), (64.0, 64.0, False)):
        manager = ExponentialUpdateLossScaleManager(16.0, 100, min_loss_scale=4.0)
        tf.train.Checkpoint(manager=manager).read(written[scale]).assert_consumed()
        caplog.clear()
        with caplog.at_level("WARNING", logger="npu_lossscale"):
            assert float(manager.get_loss_scale()) == expected
        assert ("is below min_loss_scale" in caplog.text) is warned, (scale, caplog.text)
        if warned:
            assert "restored loss scale 1.0 is below min_loss_scale (4)" in caplog.text


def test_a_manager_subclass_without_an_update_says_what_to_implement() -> None:
    """A LossScaleManager subclass that gives the scale but neither update: building the step
    says which method to write (not a TypeError from deep inside); one that writes
    tf.contrib's update_loss_scale gets the agreed flag through update_with_agreed_flag."""

    class OnlyScale(LossScaleManager):
        def get_loss_scale(self) -> tf.Tensor:
            return tf.constant(8.0)

    class ContribStyle(OnlyScale):
        def __init__(self) -> None:
            self.seen = []

        def update_loss_scale(self, finite_grads):
            self.seen.append(finite_grads)
            return tf.no_op()

    graph = tf.Graph()
    with graph.as_default():
        with pytest.raises(NotImplementedError, match=r"OnlyScale must implement update_loss_s"):
            OnlyScale("inf_nan").update_with_agreed_flag(tf.constant(True))
        manager = ContribStyle()
        flag = tf.constant(False)
        manager.update_with_agreed_flag(flag)
        assert len(manager.seen) == 1 and manager.seen[0] is flag


@pytest.mark.parametrize(
    ("given", "hint", "not_said"),
    [
        (1024, "pass FixedLossScaleManager(1024)", "npu_lossscale.torch"),
        ("dynamic", "pass ExponentialUpdateLossScaleManager(init_loss_scale=2**15", "torch"),
        ("torch", "that is npu_lossscale.torch's manager, for GradScaler", "pass Fixed"),
    ],
)
def test_a_wrong_manager_is_refused_with_what_was_meant(given, hint, not_said) -> None:
    """A scale number, TF's old 'dynamic', or the torch front-end's manager where the TF1 one
    goes: each refusal says what to pass instead, and only that."""
    if given == "torch":
        from npu_lossscale.torch.managers import FixedLossScaleManager as TorchFixed

        given = TorchFixed(1024)
    with pytest.raises(ValueError, match="loss_scale_manager must be") as refused:
        NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), given)
    assert hint in str(refused.value)
    assert not_said not in str(refused.value)


@pytest.mark.parametrize("given", ["keras", "adam", "tf.Module"])
def test_only_a_keras_optimizer_is_pointed_to_the_keras_front_end(given: str) -> None:
    """A Keras optimizer where a tf.compat.v1 one goes is refused with the Keras front-end to use
    instead; anything else (a name, some other object) is refused without that advice."""
    if given == "keras":
        if not hasattr(tf.keras, "Variable"):
            pytest.skip("Keras 3 only (the hint names its front-end)")
        opt = tf.keras.optimizers.SGD(0.5)
    else:
        opt = "adam" if given == "adam" else tf.Module()
    with pytest.raises(ValueError, match="opt must be a tf.compat.v1.train.Optimizer") as refused:
        NPULossScaleOptimizer(opt, ExponentialUpdateLossScaleManager(256, 2))
    advised = "use npu_lossscale.keras.LossScaleOptimizer" in str(refused.value)
    assert advised is (given == "keras"), str(refused.value)


def test_apply_gradients_inside_the_scripts_own_cond_steps_and_skips() -> None:
    """Gradient accumulation builds the step inside the script's tf.cond (apply on every n-th
    micro-batch): the wrapped step trains there, a poisoned one is skipped, and the scale and
    last_step_applied follow, in a TF1 graph (control flow v2 on TF 2, v1 on TF 1.15)."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        k = tf.compat.v1.placeholder(tf.float32, [])
        apply_now = tf.compat.v1.placeholder(tf.bool, [])
        manager = ExponentialUpdateLossScaleManager(
            256, 100, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
        )
        optimizer = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), manager)

        def step() -> tf.Operation:
            return tf.group(optimizer.minimize(0.5 * tf.reduce_sum(w * w) * k))

        train_op = tf.cond(apply_now, step, tf.no_op)
        state = [w, manager.get_loss_scale(), optimizer.last_step_applied]
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            expected = [
                (True, 1.0, [0.5, -1.0], 256.0, True),  # w - 0.5 * w
                (True, float("inf"), [0.5, -1.0], 128.0, False),  # skipped, scale halved
                (False, 1.0, [0.5, -1.0], 128.0, False),  # an accumulation-only micro-batch
                (True, 1.0, [0.25, -0.5], 128.0, True),
            ]
            for now, factor, weights, scale, applied in expected:
                session.run(train_op, {apply_now: now, k: factor})
                got = session.run(state)
                np.testing.assert_array_equal(got[0], weights)
                assert (got[1], bool(got[2])) == (scale, applied)


def test_steps_built_in_the_scripts_own_while_loop_all_train() -> None:
    """Several steps per session.run (a tf.while_loop around minimize, as TPU-style loops run):
    each iteration applies its step, in a TF1 graph."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0], use_resource=True)
        manager = ExponentialUpdateLossScaleManager(256, 100, overflow_mode="inf_nan")
        optimizer = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), manager)

        def body(i: tf.Tensor) -> tf.Tensor:
            with tf.control_dependencies([optimizer.minimize(0.5 * tf.reduce_sum(w * w))]):
                return i + 1

        loop = tf.compat.v1.while_loop(lambda i: i < 3, body, [tf.constant(0)])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(loop) == 3
            np.testing.assert_array_equal(session.run(w), [0.125, -0.25])
            assert bool(session.run(optimizer.last_step_applied))


_ADAPTER_MODULES = (
    "npu_bridge",
    "npu_bridge.hccl",
    "npu_bridge.hccl.hccl_ops",
    "hccl",
    "hccl.manage",
    "hccl.manage.api",
)

_HCCL_OPS = """
import tensorflow as tf

calls = []
peer = None


def allreduce(tensor, reduction, fusion=1, fusion_id=-1, group="hccl_world_group"):
    # The other rank's overflow flag is fed by the test.
    global peer
    calls.append((reduction, fusion))
    peer = tf.compat.v1.placeholder(tf.float32, [], name="peer_overflow")
    return tensor + peer
"""


@pytest.fixture
def adapter(tmp_path, monkeypatch):
    """Writes a stand-in Ascend adapter on sys.path: ``install(hccl_ops, rank_size)`` with the
    text of npu_bridge/hccl/hccl_ops.py (None: no hccl subpackage) and what
    hccl.manage.api.get_rank_size() returns (None: no such module). The fused ops' verdict,
    taken once per process, is taken afresh meanwhile and the process's own put back after: a
    first use with the adapter present would leave "an Ascend adapter is installed" to every
    later test of the process (which then found no fused ops)."""
    for name in _ADAPTER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(hccl_ops: str | None, rank_size: int | None) -> None:
        files = {"npu_bridge/__init__.py": ""}
        if hccl_ops is not None:
            files.update(
                {"npu_bridge/hccl/__init__.py": "", "npu_bridge/hccl/hccl_ops.py": hccl_ops}
            )
        if rank_size is not None:
            api = f"def get_rank_size(group='hccl_world_group'):\n    return {rank_size}\n"
            files.update(
                {"hccl/__init__.py": "", "hccl/manage/__init__.py": "", "hccl/manage/api.py": api}
            )
        for relative, text in files.items():
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / relative).write_text(text)
        importlib.invalidate_caches()

    yield install
    for name in _ADAPTER_MODULES:  # imported during the test: not left for the next one
        sys.modules.pop(name, None)


@pytest.mark.parametrize("ranks", [2, None], ids=["two-ranks", "rank-count-unknown"])
def test_an_installed_adapter_sums_the_flag_over_hccl(adapter, ranks: int | None) -> None:
    """is_distributed=True on a host with the Ascend adapter and no other engine: the HCCL
    all-reduce is found and used, so the other rank's overflow skips this rank's clean step."""
    adapter(_HCCL_OPS, ranks)
    assert detect_engine() == "hccl"
    ops = importlib.import_module("npu_bridge.hccl.hccl_ops")
    weights, scale, skipped = _one_step(True, 1.0, ops)
    np.testing.assert_array_equal(weights, [1.0, -2.0])
    assert (scale, skipped) == (128.0, 1)
    weights, scale, skipped = _one_step(True, 0.0, ops)
    np.testing.assert_array_equal(weights, [0.5, -1.0])
    assert (scale, skipped) == (256.0, 0)
    assert ops.calls == [("sum", 0), ("sum", 0)]


def test_one_hccl_rank_trains_without_an_all_reduce(adapter) -> None:
    """A single-rank HCCL job (get_rank_size() == 1) has nobody to agree with: the step is
    decided on the local flag alone, without an all-reduce (here one would wait for a peer flag
    nobody feeds)."""
    adapter(_HCCL_OPS, 1)
    assert detect_engine() == "hccl"
    weights, scale, skipped = _one_step(True, None)
    np.testing.assert_array_equal(weights, [0.5, -1.0])
    assert (scale, skipped) == (256.0, 0)
    weights, scale, skipped = _one_step(True, None, poison=float("inf"))
    np.testing.assert_array_equal(weights, [1.0, -2.0])
    assert (scale, skipped) == (128.0, 1)
    assert importlib.import_module("npu_bridge.hccl.hccl_ops").calls == []


@pytest.mark.parametrize(
    "hccl_ops",
    [None, "raise ImportError('libhccl.so: cannot open shared object file')"],
    ids=["no-hccl-package", "hccl-ops-fails-to-load"],
)
def test_an_adapter_whose_hccl_ops_cannot_be_imported_is_no_engine(adapter, hccl_ops) -> None:
    """npu_bridge is there but its HCCL ops cannot be imported: no engine is found (the error
    lists what was searched), reducer='hccl' says the ops cannot be imported, and one worker
    with is_distributed=False trains as usual."""
    adapter(hccl_ops, 2)
    assert detect_engine() is None
    with pytest.raises(NoDistributedEngineError, match="no distributed engine is active"):
        _one_step(True, None)
    with tf.Graph().as_default():
        optimizer = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5),
            ExponentialUpdateLossScaleManager(256, 2),
            True,
            reducer="hccl",
        )
        w = tf.compat.v1.get_variable("w", initializer=[1.0], use_resource=True)
        with pytest.raises(NoDistributedEngineError, match=r"hccl_ops\) cannot be imported"):
            optimizer.minimize(tf.reduce_sum(w))
    weights, _, _ = _one_step(False, None)
    np.testing.assert_array_equal(weights, [0.5, -1.0])


@pytest.mark.parametrize(("ceiling", "expected"), [(2.0**16, 65536.0), (None, None)])
def test_the_managers_bounds_read_as_numbers(ceiling: float | None, expected) -> None:
    """min_loss_scale and max_loss_scale read back as the numbers given (None: no ceiling)."""
    manager = ExponentialUpdateLossScaleManager(256, 100, min_loss_scale=2, max_loss_scale=ceiling)
    assert manager.min_loss_scale == 2.0
    assert manager.max_loss_scale == expected


def test_a_manager_driven_by_the_script_moves_its_scale_on_the_summed_flag(adapter) -> None:
    """The vendor FAQ's loop drives the manager itself (`update_loss_scale(finite)`) with
    is_distributed=True: the flag is summed over the ranks first, so a clean step everywhere
    grows the scale and an overflow on the other rank backs it off here too."""
    adapter(_HCCL_OPS, 2)
    hccl = importlib.import_module("npu_bridge.hccl.hccl_ops")
    scales = []
    for peer_overflow in (0.0, 1.0):
        with tf.Graph().as_default():
            manager = ExponentialUpdateLossScaleManager(
                128, 1, decr_every_n_nan_or_inf=1, decr_ratio=0.5, is_distributed=True
            )
            update = manager.update_loss_scale(tf.constant(True))
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(update, {hccl.peer: peer_overflow})
                scales.append(float(session.run(manager.get_loss_scale())))
    assert scales == [256.0, 64.0]


class _WeightDecayOptimizer(tf.compat.v1.train.GradientDescentOptimizer):
    """BERT's AdamWeightDecayOptimizer keeps its settings as public attributes, which scripts
    read back (to log them, or to build a second optimizer alike)."""

    def __init__(self, learning_rate: float) -> None:
        super().__init__(learning_rate)
        self.weight_decay_rate = 0.01
        self.exclude_from_weight_decay = ["LayerNorm", "bias"]


def test_the_inner_optimizers_own_public_attributes_read_through_the_wrapper() -> None:
    opt = NPULossScaleOptimizer(
        _WeightDecayOptimizer(0.1), ExponentialUpdateLossScaleManager(2.0**8, 2)
    )
    assert opt.weight_decay_rate == 0.01
    assert opt.exclude_from_weight_decay == ["LayerNorm", "bias"]
    assert opt._learning_rate == 0.1  # a private one as well, as the README says
    with pytest.raises(AttributeError, match="warmup_steps"):
        getattr(opt, "warmup_steps")  # noqa: B009


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
def test_last_step_applied_reads_true_before_the_first_step(graph: bool) -> None:
    """A hook that logs `last_step_applied` from step 0 on must not report a skip that never
    happened."""
    if not graph:
        opt = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            ExponentialUpdateLossScaleManager(4.0, 2),
        )
        assert bool(opt.last_step_applied.numpy()) is True
        return
    with tf.Graph().as_default():
        opt = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            ExponentialUpdateLossScaleManager(4.0, 2),
        )
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert bool(session.run(opt.last_step_applied)) is True
