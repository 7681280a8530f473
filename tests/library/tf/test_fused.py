"""The fused unscale-and-check op agrees bit for bit with the pure-TF path, and falls back cleanly.

Expected statuses are derived independently with numpy (float32 arithmetic, the rule written out
by hand); unscaled values are compared bitwise against the pure-TF ``overflow.unscale``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf import kernels, overflow

INF_NAN = OverflowMode.INF_NAN
SAT = OverflowMode.SATURATION
MODES = [INF_NAN, SAT]
# 100 and 0.8 * 2**15 (a dynamic scale after one decrease): 65504 / s * s rounds below 65504.
SCALES = [1.0, 3.0, 100.0, 0.8 * 2.0**15, 2.0**15, 2.0**32]


@pytest.fixture(scope="module")
def ops():
    module = kernels.fused_ops()
    if module is None:
        pytest.skip(f"fused op unavailable here: {kernels.unavailable_reason()}")
    return module


def expected_status(arrays, mode, scale) -> float:
    """The rule by hand, on the scaled gradients g: inf/NaN, or (saturation) |g| >= 65504."""
    bad = False
    for g in arrays:
        g = np.asarray(g, np.float32)
        bad |= not np.all(np.isfinite(g))
        if mode is SAT:
            bad |= bool(np.any(np.abs(g) >= np.float32(65504.0)))
    return float(bad)


def assert_bitwise_equal(actual, expected):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))


def make_cases(scale: float) -> dict[str, list[np.ndarray]]:
    """Scaled gradients (what the backward pass of loss * scale produces)."""
    rng = np.random.default_rng(int(scale) % 1000)
    f32 = np.float32
    top = f32(65504.0)
    below = np.nextafter(top, f32(0))

    def noise(*shape):
        return (rng.standard_normal(shape) * 100).astype(f32)

    def injected(value, at):
        big = noise(70_000)  # above the kernel's parallel threshold: several shards
        big[at] = value
        return [noise(3, 5), big, noise(17)]

    return {
        "clean": [noise(4, 3), noise(70_000), noise(1), noise(0), noise(2, 0, 3)],
        "inf": injected(np.inf, 69_999),
        "-inf": injected(-np.inf, 0),
        "nan": injected(np.nan, 35_001),
        "at-threshold": injected(top, 12),
        "-at-threshold": injected(-top, 50_000),
        "just-below": injected(-below, 7),
        "huge-finite": [np.full(9, 3e38, f32), noise(40)],
        # The kernel orders |u| by its bits: the largest finite float sits just below inf's
        # pattern, and a NaN with the sign bit and a payload must still count.
        "max-finite": [np.full(40, np.finfo(f32).max, f32), -np.full(3, np.finfo(f32).max, f32)],
        "-nan-payload": injected(np.array(0xFFC00123, np.uint32).view(f32), 40_000),
        "only-empty": [noise(0), noise(0, 4)],
        "tail": [noise(33), np.array([1.0, 2.0, np.inf], f32)],  # non-vector tail elements
    }


def pure_tf(arrays, mode, scale):
    grads = [tf.constant(a) for a in arrays]
    unscaled = overflow.unscale(grads, tf.constant(scale, tf.float32))
    status = overflow.overflow_status(grads, mode, 1.0)
    return [u.numpy() for u in unscaled], float(status)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", SCALES)
def test_eager_fused_matches_pure_tf_and_the_rule(ops, mode, scale):
    for name, arrays in make_cases(scale).items():
        grads = [tf.constant(a) for a in arrays]
        outputs, status = overflow.unscale_with_status(grads, scale, mode)
        want_values, want_status = pure_tf(arrays, mode, scale)
        assert float(status) == want_status == expected_status(arrays, mode, scale), name
        for got, want in zip(outputs, want_values):
            assert_bitwise_equal(got.numpy(), want)


def test_the_op_itself_is_used_and_reports_scalar_status(ops):
    unscaled, status = ops.npu_unscale_and_check(
        tf.constant([[2.0, -4.0], [65504.0, 0.5]]), tf.constant(2.0), saturation=True
    )
    assert status.shape == [] and status.dtype == tf.float32
    assert float(status) == 1.0  # 65504: what the chip clamps to
    np.testing.assert_array_equal(unscaled.numpy(), [[1.0, -2.0], [32752.0, 0.25]])
    _, status = ops.npu_unscale_and_check(
        tf.constant([65504.0]), tf.constant(2.0), saturation=False
    )
    assert float(status) == 0.0  # finite, and INF_NAN ignores saturation
    with pytest.raises(tf.errors.InvalidArgumentError, match="loss_scale must be a scalar"):
        ops.npu_unscale_and_check(tf.constant([1.0]), tf.constant([2.0]), saturation=False)


def test_denormal_results_match_pure_tf(ops):
    # 1e-30 / 2**32 is a float32 subnormal: both paths must round (or flush) it the same way.
    arrays = [np.array([1e-30, -3e-31, 1e-35, 5.0], np.float32)]
    for mode in MODES:
        outputs, status = overflow.unscale_with_status([tf.constant(arrays[0])], 2.0**32, mode)
        want_values, want_status = pure_tf(arrays, mode, 2.0**32)
        assert float(status) == want_status == 0.0
        assert_bitwise_equal(outputs[0].numpy(), want_values[0])


@pytest.mark.parametrize("mode", MODES)
def graph_runner(build):
    """Feeds three gradients doubled in-graph, so ``build``'s inputs have no other reader."""
    g = tf.Graph()
    with g.as_default():
        feeds = [tf.compat.v1.placeholder(tf.float32, None) for _ in range(3)]
        scale = tf.compat.v1.placeholder(tf.float32, [])
        outputs, status = build([f * 2.0 for f in feeds], scale)
        sess = tf.compat.v1.Session(graph=g)

    def run(arrays, s):
        feed = {f: a for f, a in zip(feeds, arrays)}
        feed[scale] = s
        return sess.run([outputs, status], feed)

    return g, sess, run


@pytest.mark.parametrize("mode", MODES)
def test_graph_mode_with_forwardable_inputs_matches_pure_tf(ops, mode):
    # The fused op is the only reader of its inputs here, so it may overwrite them in place; a
    # separate graph computes the pure-TF answer from the same feeds.
    def pure(grads, scale):
        unscaled = overflow.unscale(grads, scale)
        return unscaled, overflow.overflow_status(unscaled, mode, scale)

    fused_graph, fused_sess, fused_run = graph_runner(
        lambda grads, scale: overflow.unscale_with_status(grads, scale, mode)
    )
    pure_graph, pure_sess, pure_run = graph_runner(pure)
    assert "NpuUnscaleAndCheck" in {op.type for op in fused_graph.get_operations()}
    assert "NpuUnscaleAndCheck" not in {op.type for op in pure_graph.get_operations()}
    with fused_sess, pure_sess:
        for s in (1.0, 2.0**15):
            cases = make_cases(s)
            for name in ("clean", "inf", "nan", "at-threshold", "just-below", "-at-threshold"):
                arrays = [a / np.float32(2.0) for a in cases[name]]  # doubled back in-graph
                got, got_status = fused_run(arrays, s)
                want, want_status = pure_run(arrays, s)
                assert got_status == want_status == expected_status(cases[name], mode, s), name
                for a, b in zip(got, want):
                    assert_bitwise_equal(a, b)


def test_tf_function_uses_the_op(ops):
    @tf.function
    def step(x, y):
        return overflow.unscale_with_status([x, y], tf.constant(4.0), SAT)

    concrete = step.get_concrete_function(
        tf.TensorSpec([None], tf.float32), tf.TensorSpec([2, 2], tf.float32)
    )
    assert "NpuUnscaleAndCheck" in {op.type for op in concrete.graph.get_operations()}
    (u, v), status = step(tf.constant([8.0, -4.0]), tf.fill([2, 2], 65504.0 * 4.0))
    np.testing.assert_array_equal(u.numpy(), [2.0, -1.0])
    np.testing.assert_array_equal(v.numpy(), np.full((2, 2), 65504.0, np.float32))
    assert float(status) == 1.0
    _, status = step(tf.constant([8.0, -4.0]), tf.fill([2, 2], 1.0))
    assert float(status) == 0.0


def test_xla_compiled_functions_take_the_pure_tf_path(ops):
    # XLA cannot compile a custom op; under jit_compile the same call must still work.
    @tf.function(jit_compile=True)
    def step(x):
        (u,), status = overflow.unscale_with_status([x], tf.constant(4.0), SAT)
        return u, status

    concrete = step.get_concrete_function(tf.TensorSpec([3], tf.float32))
    assert "NpuUnscaleAndCheck" not in {op.type for op in concrete.graph.get_operations()}
    u, status = step(tf.constant([8.0, -4.0, 65504.0 * 4.0]))
    np.testing.assert_array_equal(u.numpy(), [2.0, -1.0, 65504.0])
    assert float(status) == 1.0


@pytest.mark.parametrize("mode", MODES)
def test_mixed_gradients_keep_structure_and_combine_statuses(ops, mode):
    dense = tf.constant([4.0, -8.0])
    half = tf.constant([2.0, 6.0], tf.float16)
    clean_rows = tf.IndexedSlices(tf.constant([[8.0]]), tf.constant([1]), tf.constant([3, 1]))
    bad_rows = tf.IndexedSlices(tf.constant([[np.nan]]), tf.constant([0]), tf.constant([3, 1]))
    out, status = overflow.unscale_with_status([dense, None, half, clean_rows], 2.0, mode)
    assert float(status) == 0.0
    np.testing.assert_array_equal(out[0].numpy(), [2.0, -4.0])
    assert out[1] is None
    assert out[2].dtype == tf.float16
    np.testing.assert_array_equal(out[2].numpy(), [1.0, 3.0])
    assert isinstance(out[3], tf.IndexedSlices)
    np.testing.assert_array_equal(out[3].values.numpy(), [[4.0]])
    np.testing.assert_array_equal(out[3].indices.numpy(), [1])
    # Overflow only outside the fused op (sparse rows, half precision) still counts.
    _, status = overflow.unscale_with_status([dense, bad_rows], 2.0, mode)
    assert float(status) == 1.0
    _, status = overflow.unscale_with_status([dense, tf.constant([np.inf], tf.float16)], 2.0, mode)
    assert float(status) == 1.0


def test_no_gradients_at_all():
    out, status = overflow.unscale_with_status([None], 2.0, SAT)
    assert out == [None] and float(status) == 0.0


def test_unresolved_or_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="resolved"):
        overflow.unscale_with_status([tf.ones([2])], 1.0, OverflowMode.AUTO)
    with pytest.raises(ValueError, match="overflow_mode"):
        overflow.unscale_with_status([tf.ones([2])], 1.0, "sometimes")


@pytest.mark.parametrize("mode", MODES)
def test_disable_switch_takes_the_pure_tf_path_with_the_same_results(mode, monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    assert kernels.fused_ops() is None
    g = tf.Graph()
    with g.as_default():
        feed = tf.compat.v1.placeholder(tf.float32, [None])
        out, status = overflow.unscale_with_status([feed], 8.0, mode)
        assert "NpuUnscaleAndCheck" not in {op.type for op in g.get_operations()}
        with tf.compat.v1.Session(graph=g) as sess:
            for values in ([8.0, -16.0], [8188.0 * 8.0], [np.nan, 1.0]):
                got, got_status = sess.run([out[0], status], {feed: values})
                arrays = [np.asarray(values, np.float32)]
                assert got_status == expected_status(arrays, mode, 8.0)
                assert_bitwise_equal(got, arrays[0] * np.float32(1 / 8.0))


def _fresh_process(script: str, **env_changes: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a new interpreter with the fused ops switched on and ``env_changes``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env_changes)
    env.pop(kernels.DISABLE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done


def test_build_failure_warns_once_and_falls_back(tmp_path):
    # A fresh process with an unusable compiler and an empty cache: the warning names the
    # reason and the pure-TF path still gives the right answer.
    script = textwrap.dedent(
        """
        import logging
        import tensorflow as tf
        from npu_lossscale.tf import kernels, overflow
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
        for _ in range(2):
            out, status = overflow.unscale_with_status([tf.constant([2.0, float("inf")])], 2.0,
                                                       "inf_nan")
            print("RESULT", out[0].numpy().tolist(), float(status))
        print("REASON", kernels.unavailable_reason())
        try:
            kernels.register_ops()
        except RuntimeError as error:
            print("REGISTER", error)
        """
    )
    done = _fresh_process(
        script, CXX=str(tmp_path / "no-such-compiler"), NPU_LOSSSCALE_CACHE=str(tmp_path / "cache")
    )
    warnings = [line for line in done.stderr.splitlines() if "fused CPU ops" in line]
    assert len(warnings) == 1, done.stderr
    assert "pure-TF" in warnings[0] and "no-such-compiler" in warnings[0]
    assert done.stdout.count("RESULT [1.0, inf] 1.0") == 2
    assert "REASON" in done.stdout and "no-such-compiler" in done.stdout
    register = [line for line in done.stdout.splitlines() if line.startswith("REGISTER")]
    assert len(register) == 1 and "no-such-compiler" in register[0], done.stdout
    assert "NPU_LOSSSCALE_FUSED=0" in register[0]


def test_an_ascend_host_says_so_at_info_level_not_as_a_warning(tmp_path):
    # An importable package named npu_device is what marks an Ascend host here (the graph goes to
    # the NPU, which cannot run a custom CPU op): the pure-TF path, and no warning about it.
    (tmp_path / "npu_device").mkdir()
    (tmp_path / "npu_device" / "__init__.py").write_text("")
    script = textwrap.dedent(
        """
        import logging
        import tensorflow as tf
        from npu_lossscale.tf import kernels, overflow
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        out, status = overflow.unscale_with_status([tf.constant([2.0, 70000.0])], 2.0,
                                                   "saturation")
        print("RESULT", out[0].numpy().tolist(), float(status))
        """
    )
    done = _fresh_process(script, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    lines = [line for line in done.stderr.splitlines() if "fused CPU ops" in line]
    assert len(lines) == 1 and lines[0].startswith("INFO"), done.stderr
    assert "Ascend adapter is installed" in lines[0]
    assert "RESULT [1.0, 35000.0] 1.0" in done.stdout


RESUME = """
import sys
import numpy as np
import tensorflow as tf
import npu_lossscale as nl

tf.compat.v1.disable_eager_execution()
prefix = sys.argv[1]
nl.register_ops()
saver = tf.compat.v1.train.import_meta_graph(prefix + ".meta")
(train_op,) = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
fetch = [f"fetch_{name}:0" for name in ("w", "scale", "skipped")]
with tf.compat.v1.Session() as sess:
    saver.restore(sess, prefix)
    sess.run(train_op)
    w, scale, skipped = sess.run(fetch)
    step = sess.run(tf.compat.v1.train.get_global_step())
    print("RESUMED", np.asarray(w, np.float32).view(np.uint32).tolist(), float(scale),
          int(skipped), int(step))
"""


def test_graph_saved_with_the_ops_resumes_in_a_fresh_process(ops, tmp_path):
    # The TF1 resume pattern: import_meta_graph in a new process, train op from TRAIN_OP. The
    # saved graph names both fused ops, so they must be registered there first (import alone
    # does not build them).
    import npu_lossscale as nl

    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [64], initializer=tf.ones_initializer())
        overflow_now = tf.compat.v1.placeholder_with_default(False, [])
        grad_scale = tf.where(overflow_now, float("inf"), 1.0)
        loss = tf.reduce_sum(w * w) * grad_scale
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.ExponentialUpdateLossScaleManager(2**10, 2, decr_every_n_nan_or_inf=1)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.01), manager)
        train_op = opt.minimize(loss, global_step=step)
        types = {op.type for op in graph.get_operations()}
        assert {"NpuUnscaleAndCheck", "NpuLossScaleUpdate"} <= types
        assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP) == [train_op]
        for name, value in [("w", w), ("scale", opt.loss_scale), ("skipped", opt.skipped_steps)]:
            tf.identity(value, name=f"fetch_{name}")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train_op)
            sess.run(train_op, {overflow_now: True})  # skipped: scale 2**10 -> 0.8 * 2**10
            sess.run(train_op)
            prefix = saver.save(sess, str(tmp_path / "model"), global_step=step)
            # What the resumed process must reproduce: one more step from the saved state.
            sess.run(train_op)
            want_w, want_scale, want_skipped, want_step = sess.run(
                [w, opt.loss_scale, opt.skipped_steps, step]
            )
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, str(script), prefix],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = [
        line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("RESUMED")
    ]
    want = (
        f"{np.asarray(want_w, np.float32).view(np.uint32).tolist()} {float(want_scale)} "
        f"{int(want_skipped)} {int(want_step)}"
    )
    assert resumed == [want]
    assert (float(want_scale), int(want_skipped), int(want_step)) == (
        float(np.float32(1638.4)),
        1,
        3,
    )


def test_first_use_inside_tf_function_prints_no_autograph_warnings(tmp_path):
    # The op is loaded while the function is traced; AutoGraph must leave the loader alone. The
    # script is a file: AutoGraph does not convert a function whose source it cannot read.
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
        import tensorflow as tf
        import npu_lossscale as nl
        w = tf.Variable([1.0])
        manager = nl.FixedLossScaleManager(8)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(tf.reduce_sum(w))
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, [w]))
            opt.apply_gradients(zip(grads, [w]))

        step()
        print("W", w.numpy().tolist())
        """
        )
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(kernels.DISABLE_ENV, None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "W [0.9]" in done.stdout.replace("0.8999999761581421", "0.9")
    assert "AutoGraph" not in done.stderr, done.stderr
