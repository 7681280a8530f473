"""Loss-scale managers in real TF graphs/sessions and eagerly, checked against the reference."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from cli_runner import REPO_ROOT
from update_rule_reference import ReferenceState, reference_run, reference_step

from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    LossScaleManager,
)
from npu_lossscale.tf.optimizer import NPULossScaleOptimizer

README = REPO_ROOT / "README.md"

# (init_loss_scale, hyper-parameters, probability that a step is finite)
HYPER_SETS = {
    "every-step": (
        2.0**10,
        dict(incr_every_n_steps=1, decr_every_n_nan_or_inf=1, incr_ratio=2, decr_ratio=0.5),
        0.5,
    ),
    "ratio-3": (
        2.0**15,
        dict(incr_every_n_steps=3, decr_every_n_nan_or_inf=2, incr_ratio=3, decr_ratio=0.8),
        0.7,
    ),
    "vendor-like": (
        2**32,
        dict(incr_every_n_steps=5, decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.5),
        0.8,
    ),
    "floor-and-cap": (
        16,
        dict(
            incr_every_n_steps=2,
            decr_every_n_nan_or_inf=1,
            incr_ratio=3,
            decr_ratio=0.8,
            min_loss_scale=4,
            max_loss_scale=1000,
        ),
        0.5,
    ),
    "ceiling": (
        2.0**125,
        dict(incr_every_n_steps=1, decr_every_n_nan_or_inf=3, incr_ratio=3, decr_ratio=0.8),
        0.9,
    ),
    "mostly-overflow": (
        2.0**20,
        dict(incr_every_n_steps=4, decr_every_n_nan_or_inf=3, incr_ratio=2, decr_ratio=0.8),
        0.2,
    ),
}


def _steps(seed: int, n: int, p_finite: float) -> list[bool]:
    rng = np.random.default_rng(seed)
    return [bool(x) for x in rng.random(n) < p_finite]


def _assert_state(actual, expected: ReferenceState, where: str) -> None:
    scale, good, bad, skipped = actual
    assert np.float32(scale) == expected.scale, f"{where}: scale {scale!r} != {expected.scale!r}"
    assert (int(good), int(bad), int(skipped)) == (expected.good, expected.bad, expected.skipped), (
        f"{where}: counters {(good, bad, skipped)} != "
        f"{(expected.good, expected.bad, expected.skipped)}"
    )


def _state_vars(manager):
    return [
        manager.get_loss_scale(),
        manager.variables[1],
        manager.variables[2],
        manager.skipped_steps,
    ]


# ---- the update rule, step by step ---------------------------------------------------------


@pytest.mark.stacks
@pytest.mark.parametrize("name", sorted(HYPER_SETS))
def test_rule_matches_reference_in_graph_mode(name):
    init, hyper, p_finite = HYPER_SETS[name]
    steps = _steps(seed=sorted(HYPER_SETS).index(name), n=400, p_finite=p_finite)
    expected = reference_run(init, steps, **hyper)
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(init, **hyper)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        # One run per step: the update, then reads of the new state ordered after it.
        with tf.control_dependencies([update]):
            after = [tf.identity(v) for v in _state_vars(manager)]
        init_op = tf.compat.v1.global_variables_initializer()
        initial_scale = manager.get_loss_scale()
        g.finalize()  # the loop must not grow the graph
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init_op)
            assert sess.run(initial_scale) == np.float32(init)
            for i, (step, want) in enumerate(zip(steps, expected)):
                _assert_state(sess.run(after, {finite: step}), want, f"{name} step {i}")


@pytest.mark.parametrize("name", ["every-step", "floor-and-cap", "ceiling"])
def test_rule_matches_reference_eagerly(name):
    init, hyper, p_finite = HYPER_SETS[name]
    steps = _steps(seed=100 + sorted(HYPER_SETS).index(name), n=120, p_finite=p_finite)
    expected = reference_run(init, steps, **hyper)
    manager = ExponentialUpdateLossScaleManager(init, **hyper)
    for i, (step, want) in enumerate(zip(steps, expected)):
        manager.update_loss_scale(step)
        _assert_state([v.numpy() for v in _state_vars(manager)], want, f"{name} step {i}")


def test_rule_matches_reference_inside_tf_function():
    init, hyper, p_finite = HYPER_SETS["ratio-3"]
    steps = _steps(seed=7, n=120, p_finite=p_finite)
    expected = reference_run(init, steps, **hyper)
    manager = ExponentialUpdateLossScaleManager(init, **hyper)

    @tf.function
    def train_step(finite):
        manager.update_loss_scale(finite)

    for i, (step, want) in enumerate(zip(steps, expected)):
        train_step(tf.constant(step))
        _assert_state([v.numpy() for v in _state_vars(manager)], want, f"tf.function step {i}")


def _run_eager(manager, steps):
    out = []
    for step in steps:
        manager.update_loss_scale(step)
        out.append(tuple(v.numpy().item() for v in _state_vars(manager)))
    return out


def test_hand_computed_sequence():
    # Worked by hand from the rule: a finite step leaves the bad counter alone, so the second
    # overflow (step 5) reaches decr_every_n_nan_or_inf=2 even though a clean step came between.
    manager = ExponentialUpdateLossScaleManager(4, 2, 2, 2, 0.5)
    got = _run_eager(manager, [True, True, False, True, False, False])
    assert got == [
        (4.0, 1, 0, 0),
        (8.0, 0, 0, 0),
        (8.0, 0, 1, 1),
        (8.0, 1, 1, 1),
        (4.0, 0, 0, 2),
        (4.0, 0, 1, 3),
    ]


def test_vendor_defaults_with_bert_initial_scale():
    # BERT's init_loss_scale=2**32 with vendor defaults decr_every_n_nan_or_inf=2, decr_ratio=0.8.
    # float32(0.8) = 0.800000011920929; times 2**32 is exact: 3435973888.
    manager = ExponentialUpdateLossScaleManager(init_loss_scale=2**32, incr_every_n_steps=1000)
    assert manager.get_loss_scale().numpy() == 4294967296.0
    got = _run_eager(manager, [False, False])
    assert got == [(4294967296.0, 0, 1, 1), (3435973888.0, 0, 0, 2)]


def test_float32_ceiling_keeps_scale_and_resets_counters():
    # 2**127 * 2 = 2**128 is past float32's largest value (about 3.4e38 < 2**128).
    top = 2.0**127
    manager = ExponentialUpdateLossScaleManager(top, 2, incr_ratio=2)
    got = _run_eager(manager, [True, True, True, True])
    assert got == [(top, 1, 0, 0), (top, 0, 0, 0), (top, 1, 0, 0), (top, 0, 0, 0)]


def test_floor_is_min_loss_scale():
    manager = ExponentialUpdateLossScaleManager(
        16, 10, decr_every_n_nan_or_inf=1, decr_ratio=0.5, min_loss_scale=4
    )
    got = [s for s, *_ in _run_eager(manager, [False] * 4)]
    assert got == [8.0, 4.0, 4.0, 4.0]


def test_default_floor_is_one():
    manager = ExponentialUpdateLossScaleManager(3, 10, 1, decr_ratio=0.5)
    assert [s for s, *_ in _run_eager(manager, [False] * 3)] == [1.5, 1.0, 1.0]


def test_max_loss_scale_clamps_increase_to_the_cap():
    manager = ExponentialUpdateLossScaleManager(64, 1, max_loss_scale=100)
    assert [s for s, *_ in _run_eager(manager, [True] * 3)] == [100.0, 100.0, 100.0]


def test_max_loss_scale_clamps_an_increase_past_float32_range():
    manager = ExponentialUpdateLossScaleManager(2.0**127, 1, max_loss_scale=2.0**127 * 1.5)
    assert [s for s, *_ in _run_eager(manager, [True, True])] == [2.0**127 * 1.5] * 2


# ---- Fixed manager -------------------------------------------------------------------------


@pytest.mark.stacks
def test_fixed_manager_graph_mode():
    g = tf.Graph()
    with g.as_default():
        manager = FixedLossScaleManager(1024)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in [True, False, False, True, False]:
                sess.run(update, {finite: step})
            assert sess.run(manager.get_loss_scale()) == 1024.0
            assert sess.run(manager.skipped_steps) == 3
            # The vendor FAQ's logging hook fetches the scale by name.
            assert sess.run("loss_scale:0") == 1024.0
    assert manager.enable_overflow_check is True
    assert manager.skipped_steps.dtype == tf.int64
    assert isinstance(manager, LossScaleManager)


@pytest.mark.parametrize(("flag", "expected"), [(0, False), (1, True), (np.bool_(False), False)])
def test_fixed_manager_takes_a_config_flag_as_a_bool(flag, expected):
    """0/1 and numpy booleans (flags read from configs) are taken, and read back as a bool."""
    manager = FixedLossScaleManager(8, flag)
    assert manager.enable_overflow_check is expected
    assert manager.get_enable_overflow_check() is expected


def test_fixed_manager_eager():
    manager = FixedLossScaleManager(2**15, False, overflow_mode="SATURATION")
    for step in [False, True, False]:
        manager.update_loss_scale(tf.constant(step))
    assert manager.get_loss_scale().dtype == tf.float32
    assert manager.get_loss_scale().numpy() == 32768.0
    assert manager.skipped_steps.numpy() == 2
    assert manager.enable_overflow_check is False
    assert manager.overflow_mode is OverflowMode.SATURATION
    assert manager.variables == [manager.skipped_steps]


def test_exponential_attributes(monkeypatch):
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    manager = ExponentialUpdateLossScaleManager(8, 100)
    assert manager.overflow_mode is OverflowMode.SATURATION
    assert manager.enable_overflow_check is True
    assert manager.get_loss_scale().dtype == tf.float32
    assert ExponentialUpdateLossScaleManager(8, 100, overflow_mode="inf_nan").overflow_mode is (
        OverflowMode.INF_NAN
    )


def test_non_boolean_finite_flag_is_rejected():
    manager = ExponentialUpdateLossScaleManager(8, 100)
    with pytest.raises(ValueError, match="finite_grads.*float32"):
        manager.update_loss_scale(tf.constant(1.0))


# ---- get_loss_scale in TF1 graphs: one read per graph, where that is equivalent ------------


def _manager(kind: str) -> LossScaleManager:
    if kind == "fixed":
        return FixedLossScaleManager(1024)
    return ExponentialUpdateLossScaleManager(1024, 1000)


@pytest.mark.parametrize("kind", ["exponential", "fixed"])
def test_get_loss_scale_adds_no_ops_after_the_first(kind):
    # tf.contrib's get_loss_scale returned its variable, so scripts call it as often as they
    # like; the vendor's guide calls it once per training step.
    g = tf.Graph()
    with g.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=1.0)
        manager = _manager(kind)
        opt = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
        opt.minimize(weights * weights)
        first = manager.get_loss_scale()
        n_ops = len(g.get_operations())
        reads = [read() for _ in range(50) for read in (manager.get_loss_scale, opt.get_loss_scale)]
        reads += [opt.loss_scale for _ in range(50)]
        assert len(g.get_operations()) == n_ops
    assert all(read is first for read in reads)
    assert first.name == "loss_scale:0"


@pytest.mark.stacks
def test_vendor_loop_reads_the_scale_every_step_of_a_finalized_graph():
    # The vendor guide's loop, sess.run([manager.get_loss_scale(), train_op]), inside
    # MonitoredTrainingSession, which finalizes the graph. The scale fetched with a step is the
    # one that step trained with, through overflows (x = inf) that lower it and runs of clean
    # steps that raise it.
    hyper = dict(incr_every_n_steps=2, decr_every_n_nan_or_inf=1, incr_ratio=2, decr_ratio=0.5)
    steps = [True, True, True, False, True, False, False, True, True, True, True]
    expected = reference_run(1024, steps, **hyper)
    g = tf.Graph()
    with g.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=1.0)
        x = tf.compat.v1.placeholder(tf.float32, [])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        manager = ExponentialUpdateLossScaleManager(1024, **hyper, overflow_mode="inf_nan")
        opt = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
        train_op = opt.minimize(weights * x, global_step=global_step)
        fetched = []
        with tf.compat.v1.train.MonitoredTrainingSession(log_step_count_steps=None) as sess:
            assert g.finalized
            for finite in steps:
                feed = {x: 1.0 if finite else np.inf}
                scale, _ = sess.run([manager.get_loss_scale(), train_op], feed)
                fetched.append(scale)
            final_scale, final_step = sess.run([opt.loss_scale, global_step])
    assert fetched == [np.float32(1024)] + [state.scale for state in expected[:-1]]
    assert len(set(fetched)) > 2  # the scale did move both ways
    assert final_scale == expected[-1].scale
    assert final_step == steps.count(True)


def test_a_read_under_control_dependencies_gets_its_own_op_and_waits_for_them():
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(8, 1)  # doubles on every clean step
        shared = manager.get_loss_scale()
        update = manager.update_loss_scale(True)
        with tf.control_dependencies([update]):
            after = manager.get_loss_scale()
        with tf.control_dependencies(None):  # no dependencies: the shared read will do
            assert manager.get_loss_scale() is shared
        assert after is not shared
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert [sess.run(after) for _ in range(3)] == [16.0, 32.0, 64.0]
            assert sess.run(shared) == 64.0


@pytest.mark.stacks
@pytest.mark.parametrize("control_flow_v2", [False, True], ids=["v1-while", "v2-while"])
def test_a_read_inside_a_while_loop_is_taken_every_iteration(control_flow_v2):
    # Ascend's iterations_per_loop runs the train op in a while_loop: each iteration must read
    # the scale the previous one left, not a value read once before the loop.
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    if control_flow_v2:
        tf.compat.v1.enable_control_flow_v2()
    else:
        tf.compat.v1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            manager = ExponentialUpdateLossScaleManager(8, 1)  # doubles on every clean step
            shared = manager.get_loss_scale()

            def body(i, total):
                scale = manager.get_loss_scale()
                assert scale is not shared
                with tf.control_dependencies([scale]):
                    update = manager.update_loss_scale(True)
                with tf.control_dependencies([update]):
                    return i + 1, total + scale

            _, total = tf.compat.v1.while_loop(lambda i, _: i < 3, body, [0, 0.0])
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                assert sess.run(total) == 8.0 + 16.0 + 32.0
                assert sess.run(shared) == 64.0
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
        else:
            tf.compat.v1.disable_control_flow_v2()


# ---- variables and checkpoints -------------------------------------------------------------


def test_variables_are_non_trainable_globals_with_stable_names():
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(2**16, 100)
        names = sorted(v.op.name for v in manager.variables)
        assert names == sorted(
            [
                "current_loss_scale",
                "good_steps",
                "bad_steps",
                "loss_scale_skipped_steps",
                "loss_scale_skips_at_floor",
            ]
        )
        assert set(manager.variables) <= set(tf.compat.v1.global_variables())
        assert not tf.compat.v1.trainable_variables()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(manager.get_loss_scale()) == 65536.0


@pytest.mark.stacks
def test_update_inside_tf_cond_branch_in_graph_mode():
    # An optimizer may update the scale inside one branch of tf.cond (functional cond_v2 in TF2
    # graphs); that needs resource variables.
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(8, 1, 1, decr_ratio=0.5)
        finite = tf.compat.v1.placeholder(tf.bool, [])

        def update_then_read():
            with tf.control_dependencies([manager.update_loss_scale(finite)]):
                return tf.identity(manager.get_loss_scale())

        out = tf.cond(finite, update_then_read, manager.get_loss_scale)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert [sess.run(out, {finite: f}) for f in (True, False, True)] == [16.0, 16.0, 32.0]


def test_construction_inside_control_dependencies_does_not_capture_them():
    # The vendor warns against building the manager inside tf.control_dependencies; here the
    # enclosing dependency always fails, so initialising would fail if it had been captured.
    g = tf.Graph()
    with g.as_default():
        failing = tf.debugging.Assert(tf.constant(False), ["must not run"])
        with tf.control_dependencies([failing]):
            manager = ExponentialUpdateLossScaleManager(2**16, 100)
            fixed = FixedLossScaleManager(128)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run([manager.get_loss_scale(), fixed.get_loss_scale()]) == [65536.0, 128.0]


def _graph_state(sess, manager):
    scale, good, bad, skipped = sess.run(_state_vars(manager))
    return ReferenceState(np.float32(scale), int(good), int(bad), int(skipped))


@pytest.mark.stacks
def test_saver_round_trip_continues_from_restored_state(tmp_path):
    hyper = dict(incr_every_n_steps=3, decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.5)
    before = [True, True, True, True, False, True]
    after = [False, True, True, False, False]
    expected_saved = reference_run(1024, before, **hyper)[-1]
    path = str(tmp_path / "model.ckpt")

    g1 = tf.Graph()
    with g1.as_default():
        manager = ExponentialUpdateLossScaleManager(1024, **hyper)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=g1) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in before:
                sess.run(update, {finite: step})
            _assert_state(sess.run(_state_vars(manager)), expected_saved, "saved")
            saver.save(sess, path)

    saved_keys = dict(tf.train.list_variables(path))
    for key in ("current_loss_scale", "good_steps", "bad_steps", "loss_scale_skipped_steps"):
        assert key in saved_keys

    g2 = tf.Graph()
    with g2.as_default():
        manager = ExponentialUpdateLossScaleManager(1024, **hyper)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        scale = manager.get_loss_scale()  # taken before the restore, and read again after it
        saver = tf.compat.v1.train.Saver()
        g2.finalize()  # as MonitoredTrainingSession does: reading the state must add no ops
        with tf.compat.v1.Session(graph=g2) as sess:
            saver.restore(sess, path)
            assert sess.run(scale) == expected_saved.scale
            state = _graph_state(sess, manager)
            assert state == expected_saved
            for i, step in enumerate(after):
                state = reference_step(state, step, **hyper)
                sess.run(update, {finite: step})
                _assert_state(sess.run(_state_vars(manager)), state, f"restored step {i}")


class _VendorFaqHook(tf.compat.v1.train.SessionRunHook):
    """The logging hook of the vendor's migration FAQ (and NVIDIA's BERT), as written there."""

    def __init__(self) -> None:
        self.printed: list[str] = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(fetches=["loss_scale:0"])

    def after_run(self, run_context, run_values):
        # %d, as the FAQ has it: it rejects a handle (a numpy object array) where str() would not.
        self.printed.append("loss scale value=%d" % run_values.results[0])  # noqa: UP031


@pytest.mark.stacks
def test_vendor_faq_hook_fetches_the_scale_by_name():
    # tf.contrib's scale was a reference variable named loss_scale, so 'loss_scale:0' was its
    # value; the hook must print the scale, not fail on a resource handle.
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(64, 2, 1, decr_ratio=0.5)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        hook = _VendorFaqHook()
        steps = [False, False, True, True, True]
        scales = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            for step in steps:
                sess.run(update, {finite: step})
                scales.append(sess.run("loss_scale:0"))
    # 64 halves twice on overflow, then doubles after every second clean step.
    assert scales == [32.0, 16.0, 16.0, 32.0, 32.0]
    assert len(hook.printed) == 2 * len(steps)
    assert set(hook.printed) <= {f"loss scale value={s:.0f}" for s in [64.0, *scales]}
    assert hook.printed[-1] == "loss scale value=32"


def _readme_gpu_checkpoint_recipe() -> str:
    """The README's code for restoring a GPU checkpoint, so that the test runs what users copy."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    [recipe] = [block for block in blocks if "restore(sess, gpu_checkpoint)" in block]
    return textwrap.dedent(recipe)


def _square_loss(weights: tf.Variable) -> tf.Tensor:
    return tf.reduce_sum(weights * weights)


def _embedding_loss() -> tuple[tf.Tensor, list[tf.Variable]]:
    """A partitioned embedding, as NCF or wide&deep have: Saver stores it whole, as slices."""
    table = tf.compat.v1.get_variable(
        "emb",
        [6, 2],
        partitioner=tf.compat.v1.fixed_size_partitioner(2),
        initializer=tf.compat.v1.random_normal_initializer(seed=1),
    )
    rows = tf.nn.embedding_lookup(table, [0, 4, 5])
    return tf.reduce_sum(rows * rows), list(table)


@pytest.mark.stacks
def test_gpu_checkpoint_restores_with_a_name_map(tmp_path):
    # What the original GPU script saved after a few steps: its model, Adam's slots, the global
    # step, and tf.contrib's reference variables loss_scale, good_steps and bad_steps. The port
    # builds its whole train op (manager, NPULossScaleOptimizer, minimize), which adds variables
    # the GPU run never had, then follows the README's recipe verbatim.
    path = str(tmp_path / "gpu.ckpt")
    gpu = tf.Graph()
    with gpu.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=[1.5, -2.0], use_resource=False)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        emb_loss, parts = _embedding_loss()
        gpu_opt = tf.compat.v1.train.AdamOptimizer(0.1)
        gpu_train_op = gpu_opt.minimize(_square_loss(weights) + emb_loss, global_step=global_step)
        for name, value in (("loss_scale", 4096.0), ("good_steps", 7), ("bad_steps", 1)):
            tf.compat.v1.Variable(value, name=name, trainable=False, use_resource=False)
        with tf.compat.v1.Session(graph=gpu) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(gpu_train_op)
            saved_weights, saved_m = sess.run([weights, gpu_opt.get_slot(weights, "m")])
            saved_parts = sess.run(parts)
            tf.compat.v1.train.Saver().save(sess, path)

    ported = tf.Graph()
    with ported.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=[0.0, 0.0])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        manager = ExponentialUpdateLossScaleManager(2**32, 1000)
        emb_loss, parts = _embedding_loss()
        opt = NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.1), manager)
        train_op = opt.minimize(_square_loss(weights) + emb_loss, global_step=global_step)
        with tf.compat.v1.Session(graph=ported) as sess:
            recipe = {"tf": tf, "sess": sess, "gpu_checkpoint": path}
            exec(_readme_gpu_checkpoint_recipe(), recipe)
            assert sess.run(weights).tolist() == saved_weights.tolist()
            assert sess.run(opt.get_slot(weights, "m")).tolist() == saved_m.tolist()
            assert [p.tolist() for p in sess.run(parts)] == [p.tolist() for p in saved_parts]
            assert sess.run(global_step) == 3
            assert sess.run(_state_vars(manager)) == [4096.0, 7, 1, 0]
            assert sess.run("loss_scale:0") == 4096.0
            # Training goes on from the GPU run's state, at its scale.
            used_scale, _ = sess.run([opt.loss_scale, train_op])
            assert used_scale == 4096.0
            assert sess.run([global_step, *_state_vars(manager)[1:]]) == [4, 8, 1, 0]


def test_tf_train_checkpoint_round_trip(tmp_path):
    hyper = dict(incr_every_n_steps=2, decr_every_n_nan_or_inf=1, incr_ratio=3, decr_ratio=0.8)
    first = ExponentialUpdateLossScaleManager(500, **hyper)
    before = [True, True, False, True]
    for step in before:
        first.update_loss_scale(step)
    saved = reference_run(500, before, **hyper)[-1]
    path = tf.train.Checkpoint(manager=first).save(str(tmp_path / "ckpt"))

    second = ExponentialUpdateLossScaleManager(500, **hyper)
    tf.train.Checkpoint(manager=second).restore(path).assert_consumed()
    _assert_state([v.numpy() for v in _state_vars(second)], saved, "restored")
    second.update_loss_scale(True)
    _assert_state(
        [v.numpy() for v in _state_vars(second)],
        reference_step(saved, True, **hyper),
        "after restore",
    )


def test_manager_created_under_a_distribution_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        manager = ExponentialUpdateLossScaleManager(8, 1, decr_every_n_nan_or_inf=1)

    @tf.function
    def step(finite):
        strategy.run(lambda: manager.update_loss_scale(finite))

    step(tf.constant(True))
    step(tf.constant(False))
    step(tf.constant(True))
    assert manager.get_loss_scale().numpy() == np.float32(np.float32(16) * np.float32(0.8)) * 2
    assert manager.skipped_steps.numpy() == 1


# ---- stuck-run guard -----------------------------------------------------------------------


def _stuck_manager(**extra):
    # Floor 2, halving on every overflow from 8: steps 1-2 overflow above the floor (8, 4), and
    # from step 3 on every overflow happens with the scale at the floor.
    return ExponentialUpdateLossScaleManager(8, 10, 1, decr_ratio=0.5, min_loss_scale=2, **extra)


def _assert_stuck_message(message: str) -> None:
    assert "3 consecutive" in message
    assert "loss scale 2" in message
    for hint in ("NaN", "learning rate", "min_loss_scale", "overflow mode"):
        assert hint in message


def test_stuck_guard_raises_eagerly_after_n_skips_at_floor():
    manager = _stuck_manager(max_skipped_steps_at_floor=3)
    for _ in range(4):  # 2 above the floor, 2 at it
        manager.update_loss_scale(False)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        manager.update_loss_scale(False)
    _assert_stuck_message(err.value.message)


@pytest.mark.stacks
def test_stuck_guard_fails_the_session_run_in_graph_mode():
    g = tf.Graph()
    with g.as_default():
        manager = _stuck_manager(max_skipped_steps_at_floor=3)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(4):
                sess.run(update, {finite: False})
            with pytest.raises(tf.errors.InvalidArgumentError) as err:
                sess.run(update, {finite: False})
    _assert_stuck_message(err.value.message)


def test_stuck_guard_is_off_by_default():
    manager = _stuck_manager()
    for _ in range(30):
        manager.update_loss_scale(False)
    assert manager.skipped_steps.numpy() == 30
    assert manager.get_loss_scale().numpy() == 2.0


@pytest.mark.stacks
def test_stuck_guard_resets_on_a_clean_step():
    g = tf.Graph()
    with g.as_default():
        manager = _stuck_manager(max_skipped_steps_at_floor=3)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            # 2 above the floor, then runs of 2 at the floor broken by clean steps.
            for step in [False, False, False, False, True, False, False, True, False, False]:
                sess.run(update, {finite: step})
            with pytest.raises(tf.errors.InvalidArgumentError):
                sess.run(update, {finite: False})


# ---- argument checking ---------------------------------------------------------------------

BAD_FIXED = [
    ("loss_scale", dict(loss_scale=0.5)),
    ("loss_scale", dict(loss_scale=0)),
    ("loss_scale", dict(loss_scale=-8)),
    ("loss_scale", dict(loss_scale=float("nan"))),
    ("loss_scale", dict(loss_scale=float("inf"))),
    ("loss_scale", dict(loss_scale=1e39)),
    ("loss_scale", dict(loss_scale="1024")),
    ("loss_scale", dict(loss_scale=True)),
    ("enable_overflow_check", dict(loss_scale=8, enable_overflow_check="yes")),
    ("overflow_mode", dict(loss_scale=8, overflow_mode="saturate")),
]


@pytest.mark.parametrize(("arg", "kwargs"), BAD_FIXED)
def test_fixed_rejects_bad_arguments(arg, kwargs):
    with pytest.raises(ValueError) as err:
        FixedLossScaleManager(**kwargs)
    assert arg in str(err.value)
    assert repr(kwargs[arg]) in str(err.value)


GOOD_EXP = dict(init_loss_scale=1024, incr_every_n_steps=100)
BAD_EXP = [
    ("init_loss_scale", dict(init_loss_scale=0.5)),
    ("init_loss_scale", dict(init_loss_scale=float("nan"))),
    ("init_loss_scale", dict(init_loss_scale=float("-inf"))),
    ("init_loss_scale", dict(init_loss_scale=2.0**200)),
    ("init_loss_scale", dict(init_loss_scale=False)),
    ("incr_every_n_steps", dict(incr_every_n_steps=0)),
    ("incr_every_n_steps", dict(incr_every_n_steps=-3)),
    ("incr_every_n_steps", dict(incr_every_n_steps=2.5)),
    ("incr_every_n_steps", dict(incr_every_n_steps=1000.0)),
    ("incr_every_n_steps", dict(incr_every_n_steps=True)),
    ("decr_every_n_nan_or_inf", dict(decr_every_n_nan_or_inf=0)),
    ("decr_every_n_nan_or_inf", dict(decr_every_n_nan_or_inf=1.5)),
    ("incr_ratio", dict(incr_ratio=1)),
    ("incr_ratio", dict(incr_ratio=0.5)),
    ("incr_ratio", dict(incr_ratio=float("inf"))),
    ("incr_ratio", dict(incr_ratio=float("nan"))),
    ("incr_ratio", dict(incr_ratio=1e50)),  # inf in float32, where the update multiplies
    ("incr_ratio", dict(incr_ratio=1 + 1e-9)),  # 1 in float32: the scale would never grow
    ("decr_ratio", dict(decr_ratio=0)),
    ("decr_ratio", dict(decr_ratio=1)),
    ("decr_ratio", dict(decr_ratio=1.5)),
    ("decr_ratio", dict(decr_ratio=-0.5)),
    ("decr_ratio", dict(decr_ratio=float("nan"))),
    ("decr_ratio", dict(decr_ratio=1 - 1e-9)),  # 1 in float32: the scale would never shrink
    ("decr_ratio", dict(decr_ratio=1e-50)),  # 0 in float32
    ("min_loss_scale", dict(min_loss_scale=0.5)),
    ("min_loss_scale", dict(min_loss_scale=float("inf"))),
    ("min_loss_scale", dict(min_loss_scale=1e39)),
    ("max_loss_scale", dict(max_loss_scale=0.9)),
    ("max_loss_scale", dict(max_loss_scale=float("nan"))),
    ("max_loss_scale", dict(max_loss_scale=1e39)),
    ("max_loss_scale", dict(min_loss_scale=64, max_loss_scale=32)),
    ("min_loss_scale", dict(min_loss_scale=64, max_loss_scale=32)),
    ("min_loss_scale", dict(init_loss_scale=16, min_loss_scale=32)),
    ("max_loss_scale", dict(init_loss_scale=16, max_loss_scale=8)),
    ("max_skipped_steps_at_floor", dict(max_skipped_steps_at_floor=0)),
    ("max_skipped_steps_at_floor", dict(max_skipped_steps_at_floor=2.0)),
    ("overflow_mode", dict(overflow_mode="fp16")),
]


@pytest.mark.parametrize(("arg", "kwargs"), BAD_EXP)
def test_exponential_rejects_bad_arguments(arg, kwargs):
    with pytest.raises(ValueError) as err:
        ExponentialUpdateLossScaleManager(**{**GOOD_EXP, **kwargs})
    assert arg in str(err.value)
    assert repr(kwargs[arg]) in str(err.value)


def test_ratios_at_the_ends_of_float32_are_accepted():
    top = float(np.finfo(np.float32).max)
    manager = ExponentialUpdateLossScaleManager(
        1024, 1, 1, incr_ratio=top, decr_ratio=float(np.finfo(np.float32).tiny)
    )
    # An increase past float32's range keeps the scale; the decrease stops at the floor.
    assert _run_eager(manager, [True, False]) == [(1024.0, 0, 0, 0), (1.0, 0, 0, 1)]


def test_tensor_hyper_parameters_are_rejected():
    with pytest.raises(ValueError, match="init_loss_scale"):
        ExponentialUpdateLossScaleManager(tf.constant(8.0), 100)


# ---- the fused update op (kernels/loss_scale_update.cc) against the pure-TF update ----------


def _update_graph(init, hyper, fused: bool, monkeypatch):
    monkeypatch.setenv("NPU_LOSSSCALE_FUSED", "1" if fused else "0")
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(init, **hyper)
        finite = tf.compat.v1.placeholder(tf.bool, [])
        update = manager.update_loss_scale(finite)
        with tf.control_dependencies([update]):
            after = [tf.identity(v.read_value()) for v in manager.variables]
        init_op = tf.compat.v1.global_variables_initializer()
    has_op = any(op.type == "NpuLossScaleUpdate" for op in g.get_operations())
    session = tf.compat.v1.Session(graph=g)
    session.run(init_op)
    return session, finite, after, has_op


@pytest.mark.stacks
@pytest.mark.parametrize("name", sorted(HYPER_SETS))
def test_fused_update_is_bit_identical_to_the_pure_tf_update(name, monkeypatch):
    from npu_lossscale.tf import kernels

    if kernels.fused_ops() is None:
        pytest.skip(f"fused ops unavailable: {kernels.unavailable_reason()}")
    init, hyper, p_finite = HYPER_SETS[name]
    fused = _update_graph(init, hyper, True, monkeypatch)
    plain = _update_graph(init, hyper, False, monkeypatch)
    assert fused[3] and not plain[3]
    for i, step in enumerate(_steps(seed=100 + len(name), n=300, p_finite=p_finite)):
        got = fused[0].run(fused[2], {fused[1]: step})
        want = plain[0].run(plain[2], {plain[1]: step})
        assert [np.asarray(v).tobytes() for v in got] == [np.asarray(v).tobytes() for v in want], (
            f"{name} step {i}: {got} != {want}"
        )
    fused[0].close()
    plain[0].close()


@pytest.mark.stacks
def test_fused_update_leaves_a_value_read_earlier_in_the_step_alone(monkeypatch):
    """The op writes fresh buffers: a read taken before it in the same run keeps the old value."""
    from npu_lossscale.tf import kernels

    if kernels.fused_ops() is None:
        pytest.skip(f"fused ops unavailable: {kernels.unavailable_reason()}")
    g = tf.Graph()
    with g.as_default():
        manager = ExponentialUpdateLossScaleManager(1024.0, 1, incr_ratio=2)
        read = manager.get_loss_scale()
        with tf.control_dependencies([read]):
            update = manager.update_loss_scale(True)
        assert any(op.type == "NpuLossScaleUpdate" for op in g.get_operations())
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            before, _ = sess.run([read, update])
            assert before == 1024.0
            assert sess.run(manager.get_loss_scale()) == 2048.0
