"""The Switch gate that skips an overflowed step in TF1 graphs (npu_lossscale.tf.gating).

Each case drives NPULossScaleOptimizer in a plain tf.Graph, where the gate replaces tf.cond, with
inner optimizers that build their updates in awkward ways, and checks by value that a skipped step
changes nothing and an applied one changes what it should. The loss is ``k * sum(w)``, so the
gradient of every element of ``w`` is ``k``: an inf ``k`` overflows, ``k = 1`` does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl


class _CountingSGD(tf.compat.v1.train.GradientDescentOptimizer):
    """SGD that also counts its applies, with the counter update built outside any control scope."""

    def __init__(self) -> None:
        super().__init__(0.5)
        self.counter = tf.compat.v1.get_variable(
            "apply_count", [], tf.int64, tf.zeros_initializer(), trainable=False
        )

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        with tf.control_dependencies(None):
            bump = self.counter.assign_add(1)
        return tf.group(super().apply_gradients(grads_and_vars, global_step, name), bump)


class _RefCountingSGD(_CountingSGD):
    """The same with a reference variable (TF1 scripts): its AssignAdd takes the variable as a ref
    input and is not marked stateful, yet writes state."""

    def __init__(self) -> None:
        tf.compat.v1.train.GradientDescentOptimizer.__init__(self, 0.5)
        self.counter = tf.compat.v1.get_variable(
            "apply_count", [], tf.int64, tf.zeros_initializer(), trainable=False, use_resource=False
        )

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        with tf.control_dependencies(None):
            bump = tf.compat.v1.assign_add(self.counter, 1)
        return tf.group(
            tf.compat.v1.train.GradientDescentOptimizer.apply_gradients(
                self, grads_and_vars, global_step, name
            ),
            bump,
        )


class _CondSGD(tf.compat.v1.train.GradientDescentOptimizer):
    """SGD whose update sits in its own tf.cond (lowered to Switch/Merge inside the gate)."""

    def __init__(self) -> None:
        super().__init__(0.5)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        enabled = tf.constant(True)
        return tf.cond(
            enabled,
            lambda: tf.group(super(_CondSGD, self).apply_gradients(grads_and_vars, global_step)),
            tf.no_op,
        )


def _build(make_inner):
    graph = tf.Graph()
    with graph.as_default():
        k = tf.compat.v1.placeholder_with_default(1.0, [], name="k")
        w = tf.compat.v1.get_variable("w", [3], initializer=tf.ones_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        inner = make_inner()
        manager = nl.FixedLossScaleManager(8.0, overflow_mode="inf_nan")
        opt = nl.NPULossScaleOptimizer(inner, manager)
        train = opt.minimize(k * tf.reduce_sum(w), global_step=step)
        with tf.control_dependencies([train]):
            step_after = tf.identity(step.read_value())
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
    return graph, session, k, w, step, inner, train, step_after


@pytest.mark.parametrize(
    "make_inner",
    [_CountingSGD, _RefCountingSGD, _CondSGD, lambda: tf.compat.v1.train.AdamOptimizer(0.1)],
)
def test_skipped_step_changes_nothing_and_applied_step_applies(make_inner):
    graph, session, k, w, step, inner, train, step_after = _build(make_inner)
    state = [w, step, *inner.variables()]
    if isinstance(inner, _CountingSGD):
        state.append(inner.counter)
    before = [np.asarray(v).tobytes() for v in session.run(state)]
    assert session.run(step_after, {k: np.inf}) == 0  # a fetch after the train op still runs
    assert [np.asarray(v).tobytes() for v in session.run(state)] == before
    assert session.run(step_after, {k: 1.0}) == 1
    assert not np.array_equal(session.run(w), np.ones(3, np.float32))
    if isinstance(inner, _CountingSGD):
        assert session.run(inner.counter) == 1
    assert session.run(step_after, {k: np.nan}) == 1
    session.close()


def test_plain_graph_uses_one_switch_not_a_functional_cond():
    graph, session, *_ = _build(lambda: tf.compat.v1.train.AdamOptimizer(0.1))
    types = [op.type for op in graph.get_operations()]
    assert types.count("Switch") == 1
    assert "If" not in types and "StatelessIf" not in types
    session.close()


def test_tf_function_graph_keeps_tf_cond():
    w = tf.Variable(tf.ones([3]))
    opt = nl.NPULossScaleOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.5),
        nl.FixedLossScaleManager(8.0, overflow_mode="inf_nan"),
    )

    @tf.function
    def step(k):
        with tf.GradientTape() as tape:
            loss = opt.get_scaled_loss(k * tf.reduce_sum(w))
        grads = opt.get_unscaled_gradients(tape.gradient(loss, [w]))
        opt.apply_gradients(zip(grads, [w]))

    graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    types = [op.type for op in graph.get_operations()]
    assert "Switch" not in types
    assert "If" in types or "StatelessIf" in types
    step(tf.constant(np.inf))
    np.testing.assert_array_equal(w.numpy(), np.ones(3, np.float32))
    step(tf.constant(1.0))
    np.testing.assert_array_equal(w.numpy(), np.full(3, 0.5, np.float32))
