"""NPULossScaleOptimizer in TF1-style graphs: which steps are applied, and what a skip leaves alone.

Overflow is injected three ways: a loss multiplier ``k`` fed per step (inf, NaN, or a large finite
value whose *scaled* gradient passes 65504), the same through the embedding term only, and crafted
gradients (chip-saturated values from ``chip.saturate``) fed straight into ``apply_gradients``.
With x = [1, 2, 3, 4], the true gradient of ``sum(x @ w + b)`` w.r.t. ``w[i, j]`` is x[i] and
w.r.t. ``b`` is 1, so the scaled gradients are ``scale * k * x[i]``: derived by hand, not by the
code under test.
"""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import tensorflow as tf
from chip import saturate

import npu_lossscale as nl
from npu_lossscale.tf import kernels

# TF1 graphs with get_variable's default kind: reference variables on TF 1.15, resource on 2.x.
pytestmark = pytest.mark.stacks

SCALE = 1024.0
X = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
SATURATING_K = 100.0  # scaled gradient of w[3, :] = 1024 * 100 * 4 = 409600 >= 65504, finite


def build(mode: str) -> types.SimpleNamespace:
    graph = tf.Graph()
    with graph.as_default():
        k = tf.compat.v1.placeholder_with_default(1.0, [], name="k")
        k_emb = tf.compat.v1.placeholder_with_default(1.0, [], name="k_emb")
        init = tf.compat.v1.constant_initializer(0.1)
        w = tf.compat.v1.get_variable("w", [4, 3], initializer=init)
        b = tf.compat.v1.get_variable("b", [3], initializer=init)
        emb = tf.compat.v1.get_variable("emb", [10, 3], initializer=init)
        unused = tf.compat.v1.get_variable("unused", [2], initializer=init)
        dense_term = tf.reduce_sum(tf.matmul(tf.constant(X), w) + b)
        emb_term = tf.reduce_sum(tf.nn.embedding_lookup(emb, tf.constant([1, 1, 4])))
        loss = k * dense_term + k_emb * emb_term
        global_step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.FixedLossScaleManager(SCALE, overflow_mode=mode)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.01), manager)
        grads_and_vars = opt.compute_gradients(loss)
        train = opt.apply_gradients(grads_and_vars, global_step=global_step)
        minimize = opt.minimize(loss, global_step=global_step)

        present = [(g, v) for g, v in grads_and_vars if g is not None]
        clipped, _ = tf.clip_by_global_norm([g for g, _ in present], 1.0)
        clipped_norm = tf.linalg.global_norm(clipped)
        train_clipped = opt.apply_gradients(
            zip(clipped, [v for _, v in present]), global_step=global_step
        )

        feed_w = tf.compat.v1.placeholder(tf.float32, [4, 3])
        feed_b = tf.compat.v1.placeholder(tf.float32, [3])
        train_crafted = opt.apply_gradients([(feed_w, w), (feed_b, b)], global_step=global_step)

        tracked = [w, b, emb, unused, global_step, *opt.inner_optimizer.variables()]
        initializer = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    return types.SimpleNamespace(**locals())


@pytest.fixture(scope="module")
def graphs():
    built = {mode: build(mode) for mode in ("inf_nan", "saturation")}
    yield built
    for ns in built.values():
        ns.session.close()


def fresh(ns):
    """Re-initialise and take one clean step so Adam's slots and beta powers are non-trivial."""
    ns.session.run(ns.initializer)
    ns.session.run(ns.train)
    assert ns.session.run(ns.global_step) == 1
    return ns


def snapshot(ns) -> list[bytes]:
    return [np.asarray(value).tobytes() for value in ns.session.run(ns.tracked)]


def assert_skipped(ns, op, feed):
    before = snapshot(ns)
    skipped_before = ns.session.run(ns.opt.skipped_steps)
    ns.session.run(op, feed)
    assert snapshot(ns) == before, "a skipped step changed a variable, slot or the global step"
    assert ns.session.run(ns.opt.skipped_steps) == skipped_before + 1
    assert not ns.session.run(ns.opt.last_step_applied)


def assert_applied(ns, op, feed):
    step, w = ns.session.run([ns.global_step, ns.w])
    ns.session.run(op, feed)
    new_step, new_w = ns.session.run([ns.global_step, ns.w])
    assert new_step == step + 1
    assert not np.array_equal(new_w, w)
    assert ns.session.run(ns.opt.last_step_applied)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("bad_k", [np.inf, np.nan, -np.inf])
@pytest.mark.parametrize("term", ["k", "k_emb"])
def test_inf_and_nan_are_skipped_in_both_modes(graphs, mode, bad_k, term):
    ns = fresh(graphs[mode])
    assert_skipped(ns, ns.train, {getattr(ns, term): bad_k})
    assert_applied(ns, ns.train, {})


@pytest.mark.parametrize("term", ["k", "k_emb"])
def test_saturated_finite_gradients_are_applied_in_inf_nan_and_skipped_in_saturation(graphs, term):
    feed_inf_nan = {getattr(graphs["inf_nan"], term): SATURATING_K}
    feed_sat = {getattr(graphs["saturation"], term): SATURATING_K}
    assert_applied(fresh(graphs["inf_nan"]), graphs["inf_nan"].train, feed_inf_nan)
    assert_skipped(fresh(graphs["saturation"]), graphs["saturation"].train, feed_sat)


def test_just_below_the_saturation_threshold_is_applied(graphs):
    ns = fresh(graphs["saturation"])
    # Largest scaled gradient: 1024 * k * 4 < 65504  <=>  k < 15.99
    assert_applied(ns, ns.train, {ns.k: 15.9})


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_chip_saturated_gradients_fed_to_apply_gradients(graphs, mode):
    ns = fresh(graphs[mode])
    true_w = np.full([4, 3], 0.01, np.float32)
    true_w[2, 1] = 300.0  # 300 * 1024 overflows fp16: the chip returns 65504
    feed = {
        ns.feed_w: saturate(true_w * SCALE) / SCALE,
        ns.feed_b: saturate(np.full([3], 0.01, np.float32) * SCALE) / SCALE,
    }
    if mode == "inf_nan":
        assert_applied(ns, ns.train_crafted, feed)
    else:
        assert_skipped(ns, ns.train_crafted, feed)
    clean = {ns.feed_w: np.full([4, 3], 0.01, np.float32), ns.feed_b: np.zeros(3, np.float32)}
    assert_applied(ns, ns.train_crafted, clean)


def test_clipping_between_compute_and_apply_keeps_saturation_visible(graphs):
    ns = fresh(graphs["saturation"])
    assert ns.session.run(ns.clipped_norm, {ns.k: SATURATING_K}) <= 1.0 + 1e-6
    assert_skipped(ns, ns.train_clipped, {ns.k: SATURATING_K})
    assert_applied(ns, ns.train_clipped, {})


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_clipping_with_inf_is_skipped(graphs, mode):
    ns = fresh(graphs[mode])
    assert_skipped(ns, ns.train_clipped, {ns.k: np.inf})


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_minimize_applies_and_skips(graphs, mode):
    ns = fresh(graphs[mode])
    assert_skipped(ns, ns.minimize, {ns.k: np.nan})
    assert_applied(ns, ns.minimize, {})


def test_gradients_are_unscaled_none_kept_and_embeddings_sparse(graphs):
    ns = fresh(graphs["inf_nan"])
    by_var = {v.op.name: g for g, v in ns.grads_and_vars}
    assert by_var["unused"] is None
    assert isinstance(by_var["emb"], tf.IndexedSlices)
    w_grad, b_grad, emb_rows = ns.session.run(
        [by_var["w"], by_var["b"], by_var["emb"].values], {ns.k: 2.0}
    )
    np.testing.assert_array_equal(w_grad, np.repeat(2.0 * X.T, 3, axis=1))
    np.testing.assert_array_equal(b_grad, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(emb_rows, np.ones([3, 3]))
    unused_before = ns.session.run(ns.unused)
    ns.session.run(ns.train)
    np.testing.assert_array_equal(ns.session.run(ns.unused), unused_before)


def test_readable_state_and_variables(graphs):
    ns = fresh(graphs["saturation"])
    with ns.graph.as_default():  # loss_scale builds a read op in the default graph
        assert ns.session.run(ns.opt.loss_scale) == SCALE
        assert ns.session.run(ns.opt.get_loss_scale()) == SCALE
        names = {v.op.name for v in ns.opt.variables()}
    assert ns.session.run(ns.opt.skipped_steps) == 0
    assert {"loss_scale_skipped_steps", "last_step_applied"} <= names
    assert any(name.startswith("beta1_power") for name in names)
    assert any(name.endswith("w/Adam_1") for name in names)
    assert len(ns.tracked) == 4 + 1 + 2 * 3 + 2  # model, global step, Adam m/v, beta powers


def test_unknown_attributes_come_from_the_inner_optimizer(graphs):
    ns = graphs["inf_nan"]
    inner = ns.opt.inner_optimizer
    assert ns.opt._lr == inner._lr == 0.01
    assert ns.opt.get_slot_names() == ["m", "v"]
    assert ns.opt.get_slot(ns.w, "m") is inner.get_slot(ns.w, "m")
    assert ns.opt.get_name() == "NPULossScaleOptimizer"
    with pytest.raises(AttributeError, match="no_such_attribute"):
        ns.opt.no_such_attribute  # noqa: B018
    duplicate = copy.copy(ns.opt)
    assert duplicate._lr == 0.01
    blank = nl.NPULossScaleOptimizer.__new__(nl.NPULossScaleOptimizer)
    with pytest.raises(AttributeError):
        blank._lr  # noqa: B018 - no recursion before __init__ has run


def test_disabled_overflow_check_applies_even_inf():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
        k = tf.compat.v1.placeholder_with_default(1.0, [])
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.FixedLossScaleManager(SCALE, enable_overflow_check=False)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
        train = opt.minimize(k * tf.reduce_sum(w), global_step=step)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {k: np.inf})
            assert sess.run(step) == 1
            assert np.all(np.isinf(sess.run(w)))
            assert sess.run(opt.last_step_applied)
            assert sess.run(opt.skipped_steps) == 0


def test_dynamic_manager_lowers_the_scale_on_overflow():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [3], initializer=tf.compat.v1.ones_initializer())
        manager = nl.ExponentialUpdateLossScaleManager(
            2.0**20, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="saturation"
        )
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.1), manager)
        train = opt.minimize(tf.reduce_sum(w))  # gradient 1: saturates while scale >= 65504
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            scales = []
            for _ in range(6):
                sess.run(train)
                scales.append(float(sess.run(opt.loss_scale)))
            # 2**20 .. 2**16 saturate (>= 65504) and halve; 2**15 is clean.
            assert scales == [2.0**19, 2.0**18, 2.0**17, 2.0**16, 2.0**15, 2.0**15]
            assert sess.run(opt.skipped_steps) == 5


def test_train_op_collection_lists_the_whole_step_not_the_inner_one():
    # A graph resumed with import_meta_graph finds its train op in GraphKeys.TRAIN_OP, as the
    # bare optimizer leaves it there. The inner optimizer's own entry would apply steps but never
    # update the scale: running what the collection holds must lower it on an overflow.
    graph = tf.Graph()
    with graph.as_default():
        earlier = tf.no_op(name="listed_by_the_user")
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, earlier)
        w = tf.compat.v1.get_variable("w", [3], initializer=tf.compat.v1.ones_initializer())
        k = tf.compat.v1.placeholder_with_default(1.0, [])
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.ExponentialUpdateLossScaleManager(2.0**10, 1000, decr_every_n_nan_or_inf=1)
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.1), manager)
        train = opt.minimize(k * tf.reduce_sum(w), global_step=step)
        listed = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
        assert listed == [earlier, train]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(listed[-1], {k: np.inf})
            assert sess.run([opt.loss_scale, step]) == [np.float32(2.0**10 * 0.8), 0]
            sess.run(listed[-1])
            assert sess.run(step) == 1
            assert bool(sess.run(opt.last_step_applied))


def test_bad_arguments_are_rejected():
    graph = tf.Graph()
    with graph.as_default():
        inner = tf.compat.v1.train.AdamOptimizer(0.1)
        manager = nl.FixedLossScaleManager(8.0)
        with pytest.raises(ValueError, match="opt must be"):
            nl.NPULossScaleOptimizer("adam", manager)
        with pytest.raises(ValueError, match="loss_scale_manager must be"):
            nl.NPULossScaleOptimizer(inner, 1024)
        with pytest.raises(ValueError, match="is_distributed must be"):
            nl.NPULossScaleOptimizer(inner, manager, "yes")


@pytest.mark.parametrize("fused", ["1", "0"])
def test_gradient_clamped_to_65504_is_skipped_whatever_the_scale(monkeypatch, fused):
    """With a scale of 100, 65504 / 100 * 100 rounds to 65503.996: the rule has to look at the
    scaled value the chip produced, on the fused path and on the pure-TF one."""
    monkeypatch.setenv(kernels.DISABLE_ENV, fused)
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, 1.0])
        raw = tf.compat.v1.placeholder(tf.float32, [2])

        @tf.custom_gradient
        def chip_backward(x):
            # The backward pass of the scaled loss as the chip returns it: `raw`, whatever the
            # scale was.
            return tf.identity(x), lambda dy: raw

        manager = nl.FixedLossScaleManager(100, overflow_mode="saturation")
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), manager)
        train = opt.minimize(tf.reduce_sum(chip_backward(w)))
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        session.run(train, {raw: saturate([70000.0, 1.0])})  # [65504, 1]
        assert not session.run(opt.last_step_applied)
        np.testing.assert_array_equal(session.run(w), [1.0, 1.0])
        below = np.nextafter(np.float32(65504.0), np.float32(0.0))
        session.run(train, {raw: [below, 1.0]})
        assert session.run(opt.last_step_applied)
        assert session.run(w)[0] < 1.0 - 600.0
