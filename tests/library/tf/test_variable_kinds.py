"""The TF1 front-end with reference variables as well as resource variables, on every TF stack.

TF 1.15 creates reference variables by default (and ``disable_resource_variables()`` brings them
back on TF 2.x); TF 2.x graphs create resource variables. Scripts are ported from TF 1.15, so the
optimizer, the managers, the global-step increment, Saver/.meta checkpoints and the stuck-run guard
must behave the same with either kind, for the user's variables and for global_step. The kind is
set through the variable scope, as a script's own ``get_variable`` and
``get_or_create_global_step`` calls pick it up, and is checked on the created variables.

Expected values are derived by hand: with x = [1, 2, 4] the gradient of ``k * sum(w * x)`` is
``k * x``, so a clean SGD step with learning rate 0.5 subtracts ``0.5 * k * x``; an overflowed step
changes nothing. The scale follows ``update_rule_reference``, written apart from the library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from update_rule_reference import reference_run

import npu_lossscale as nl
from npu_lossscale.tf import kernels

pytestmark = pytest.mark.stacks

X = np.array([1.0, 2.0, 4.0], np.float32)
W0 = np.array([1.0, 2.0, 3.0], np.float32)
LR = 0.5
SATURATING_K = 100.0  # scaled gradient 256 * 100 * 4 >= 65504 at the scales used below
DYNAMIC = {
    "incr_every_n_steps": 2,
    "decr_every_n_nan_or_inf": 1,
    "incr_ratio": 2.0,
    "decr_ratio": 0.5,
}
KINDS = ["reference", "resource"]


def _is_resource(variable) -> bool:
    return variable.op.type == "VarHandleOp"


def build(kind: str, manager_kind: str, mode: str, **manager_kwargs):
    """A TF1 training graph whose variables (w, global_step) are of ``kind``."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.variable_scope("", use_resource=(kind == "resource")):
        k = tf.compat.v1.placeholder(tf.float32, [], name="k")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(W0))
        step = tf.compat.v1.train.get_or_create_global_step()
        assert _is_resource(w) == _is_resource(step) == (kind == "resource")
        if manager_kind == "fixed":
            manager = nl.FixedLossScaleManager(1024.0, overflow_mode=mode)
        else:
            manager = nl.ExponentialUpdateLossScaleManager(
                1024.0, overflow_mode=mode, **DYNAMIC, **manager_kwargs
            )
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), manager)
        train = opt.minimize(k * tf.reduce_sum(w * tf.constant(X)), global_step=step)
        init = tf.compat.v1.global_variables_initializer()
    return graph, train, init, w, step, opt, k


@pytest.mark.parametrize("manager_kind", ["fixed", "dynamic"])
@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("kind", KINDS)
def test_overflowed_steps_leave_weights_and_global_step_alone(kind, mode, manager_kind):
    graph, train, init, w, step, opt, k = build(kind, manager_kind, mode)
    ks = [1.0, np.inf, np.nan, 1.0, SATURATING_K, 1.0]
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        expected_w, expected_step, scale, finite_so_far = W0.copy(), 0, np.float32(1024.0), []
        for value in ks:
            max_scaled = np.float32(scale) * np.float32(value) * X.max()
            finite = bool(np.isfinite(max_scaled))
            if mode == "saturation":
                finite = finite and max_scaled < 65504.0
            sess.run(train, {k: value})
            if finite:
                expected_w = expected_w - np.float32(LR * value) * X
                expected_step += 1
            finite_so_far.append(finite)
            if manager_kind == "dynamic":
                scale = reference_run(1024.0, finite_so_far, **DYNAMIC)[-1].scale
            got_w, got_step, got_scale, applied, skipped = sess.run(
                [w, step, opt.loss_scale, opt.last_step_applied, opt.skipped_steps]
            )
            np.testing.assert_allclose(got_w, expected_w, rtol=1e-6)
            assert got_step == expected_step
            assert got_scale == scale
            assert bool(applied) == finite
            assert skipped == finite_so_far.count(False)
    # The schedule really exercised both outcomes under each mode.
    assert finite_so_far.count(False) == (3 if mode == "saturation" else 2)


@pytest.mark.parametrize("kind", KINDS)
def test_saver_meta_checkpoint_resumes_the_scale_and_the_step(kind, tmp_path):
    """A .meta graph written with the fused ops resumes after register_ops(), and training goes
    on from the restored scale, counters and global step."""
    graph, train, init, w, step, opt, k = build(kind, "dynamic", "inf_nan")
    ks_before, ks_after = [1.0, np.inf, 1.0], [1.0, np.inf]
    prefix = str(tmp_path / "model")
    with graph.as_default():
        saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for value in ks_before:
            sess.run(train, {k: value})
        saved_w = sess.run(w)
        saver.save(sess, prefix)
    nl.register_ops()
    resumed = tf.Graph()
    with resumed.as_default():
        restorer = tf.compat.v1.train.import_meta_graph(prefix + ".meta")
        (train_op,) = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
        with tf.compat.v1.Session(graph=resumed) as sess:
            restorer.restore(sess, prefix)
            restored = {v.op.name: v for v in tf.compat.v1.global_variables()}
            assert _is_resource(restored["w"]) == (kind == "resource")
            assert np.array_equal(sess.run(restored["w"]), saved_w)
            for value in ks_after:
                sess.run(train_op, {"k:0": value})
            got_scale, got_step = sess.run(["loss_scale:0", restored["global_step"]])
    finite = [bool(np.isfinite(v)) for v in ks_before + ks_after]
    assert got_scale == reference_run(1024.0, finite, **DYNAMIC)[-1].scale
    assert got_step == finite.count(True)


@pytest.mark.parametrize("kind", KINDS)
def test_stuck_guard_stops_the_run_in_a_graph(kind):
    graph, train, init, w, step, opt, k = build(
        kind, "dynamic", "inf_nan", min_loss_scale=1024.0, max_skipped_steps_at_floor=2
    )
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(train, {k: np.inf})
        with pytest.raises(tf.errors.InvalidArgumentError, match="2 consecutive training steps"):
            sess.run(train, {k: np.inf})


@pytest.mark.skipif(
    os.environ.get(kernels.DISABLE_ENV, "1") == "0", reason="fused ops disabled in this run"
)
def test_fused_ops_build_and_run_on_this_tensorflow():
    """The C++ ops compile against this TensorFlow's headers (its C++ standard, its int64) and
    the training graph uses them, with the results checked above."""
    assert kernels.fused_ops() is not None, kernels.unavailable_reason()
    graph, *_ = build("reference", "dynamic", "inf_nan")
    types = {op.type for op in graph.get_operations()}
    assert {"NpuUnscaleAndCheck", "NpuLossScaleUpdate"} <= types


MIRRORED_WORKER = Path(__file__).parent / "workers" / "stacks_mirrored.py"


def test_mirrored_replicas_skip_together_with_either_variable_kind(tmp_path):
    """is_distributed over tf.distribute (MirroredStrategy, two CPU devices, a TF1 graph):
    replica 0 overflows on steps 2 and 4, replica 1 never; both skip those steps, keep equal
    weights and one scale."""
    out = tmp_path / "mirrored.json"
    done = subprocess.run(
        [sys.executable, str(MIRRORED_WORKER), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = json.loads(out.read_text())["traces"]
    finite = [True, False, True, False, True]
    scales = [s.scale for s in reference_run(1024.0, finite, **DYNAMIC)]
    for kind in KINDS:
        expected_w, applied = W0.copy(), 0
        for i, record in enumerate(traces[kind]):
            if finite[i]:
                expected_w = expected_w - X  # two replicas' SGD steps, 0.5 * x each
                applied += 1
            assert record["w"][0] == record["w"][1] == expected_w.tolist(), (kind, i)
            assert record["step"] == applied, (kind, i)
            assert record["scale"] == scales[i], (kind, i)


@pytest.mark.parametrize("fused", ["fused", "pure-tf"])
@pytest.mark.parametrize("restored", [0.0, 1e-40, 1e-30, float("nan")])
def test_a_scale_restored_below_the_floor_goes_back_to_the_floor(
    restored, fused, tmp_path, monkeypatch, capfd
):
    """A checkpoint whose scale collapsed (0 after a NaN storm, a denormal, far below the floor)
    must not poison the weights: the next clean step applies the true gradient, from the floor,
    and says so on stderr."""
    if fused == "pure-tf":
        monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    prefix = str(tmp_path / "model")
    graph, train, init, w, step, opt, k = build("reference", "dynamic", "inf_nan")
    with graph.as_default():
        (scale_var,) = [
            v for v in tf.compat.v1.global_variables() if "current_loss_scale" in v.name
        ]
        collapse = scale_var.assign(restored)
        saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(train, {k: 1.0})  # one clean step: good steps 1
        sess.run(collapse)
        saved_w = sess.run(w)
        saver.save(sess, prefix)
    graph, train, init, w, step, opt, k = build("reference", "dynamic", "inf_nan")
    with graph.as_default():
        saver = tf.compat.v1.train.Saver()
    capfd.readouterr()
    with tf.compat.v1.Session(graph=graph) as sess:
        saver.restore(sess, prefix)
        sess.run(train, {k: 1.0})
        got_w, got_step, got_scale = sess.run([w, step, opt.loss_scale])
    np.testing.assert_allclose(got_w, saved_w - np.float32(LR) * X, rtol=1e-6)
    assert got_step == 2
    # From the floor (1) with one good step behind it, a clean step grows it (DYNAMIC: every 2).
    assert got_scale == 2.0
    assert "below min_loss_scale (1)" in capfd.readouterr().err
