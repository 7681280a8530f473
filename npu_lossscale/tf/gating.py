"""Run a step's update ops only when a predicate holds, as cheaply as the graph allows.

``tf.cond`` is the general tool, but in a TF1 graph it is lowered to one Switch per tensor the
branch captures: for an optimizer that is every variable, every slot and every gradient, dozens
of executor nodes on the critical path between the overflow decision and the first update. A
classic graph has a cheaper exact gate: TensorFlow's executor marks a node *dead*, and does not
run it, when any of its inputs, control inputs included, comes from a dead node. So one Switch on
the predicate, made a control input of every op the update creates, skips all of them; a Merge
of the two Switch outputs gives a live op to return either way.

That is only sound when every op the update runs that writes state depends on the gate, so the
ops just built are checked, and one that escapes the control dependency (built under
``tf.init_scope`` or ``tf.control_dependencies(None)``) gets the gate as a control input, as
``tf.compat.v1.cond`` does for its branch ops. The gate is also used only where the
executor semantics above are the whole story: a plain ``tf.Graph`` outside any v1 control-flow
context, distribution strategy or XLA compilation. Everywhere else -- eagerly,
``tf.function``, replicas -- ``tf.cond`` (or Python, when the predicate is known) decides.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from npu_lossscale.tf import kernels

_MERGE_OPS = ("Merge", "RefMerge")
# Stateful only in that they create or read state: harmless on a skipped step.
_READ_ONLY_OPS = (
    "VarHandleOp",
    "VariableV2",
    "ReadVariableOp",
    "ResourceGather",
    "VarIsInitializedOp",
    "IsVariableInitialized",
)


def apply_if(pred: tf.Tensor, apply_fn: Callable[[], Any]) -> tf.Operation | None:
    """Run ``apply_fn``'s ops iff the boolean scalar ``pred`` is true; None when run eagerly."""
    if tf.executing_eagerly():
        if bool(pred):
            apply_fn()
        return None
    static = tf.get_static_value(pred)
    if static is not None:
        return tf.group(apply_fn()) if bool(static) else tf.no_op()
    if classic_graph():
        return _switch_gate(pred, apply_fn)
    return tf.cond(pred, lambda: tf.group(apply_fn()), tf.no_op)


def classic_graph() -> bool:
    """Whether ops built now go into a plain TF1 graph run by the classic executor as they are:
    no function graph, v1 control-flow context, distribution strategy or XLA compilation."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return (
        type(graph) is tf.Graph
        and graph._get_control_flow_context() is None  # inside a v1 while_loop or cond
        and not tf.distribute.has_strategy()
        and not kernels.in_xla_context()
    )


def _switch_gate(pred: tf.Tensor, apply_fn: Callable[[], Any]) -> tf.Operation:
    """The ops of ``apply_fn``, run only when ``pred`` is true; returns an op live either way."""
    graph = pred.graph
    off, on = tf.raw_ops.Switch(data=pred, pred=pred, name="skip_gate")
    gate = tf.identity(on, name="apply_gate")
    first_new = len(graph.get_operations())
    with tf.control_dependencies([gate]):
        applied = tf.group(apply_fn())
    for op in _escaping_writers(graph.get_operations()[first_new:], gate.op, applied):
        # Built where the gate's control dependency did not reach: tie it to the gate too.
        op._add_control_input(gate.op)
    with tf.control_dependencies([applied]):
        done = tf.identity(on, name="applied")
    skipped = tf.identity(off, name="skipped")
    decided, _ = tf.raw_ops.Merge(inputs=[skipped, done], name="step_decided")
    return decided.op


def _escaping_writers(
    new_ops: list[tf.Operation], gate: tf.Operation, result: tf.Operation
) -> list[tf.Operation]:
    """Stateful ops among ``new_ops`` that ``result`` runs but ``gate`` would not stop.

    Ops are visited in creation order, so each op's inputs are decided before the op itself.
    Ops ``result`` does not need (a variable's initializer built on the way) never run with it;
    ops that only create or read state (a variable handle made under ``tf.init_scope``) may run.
    """
    gated: dict[tf.Operation, bool] = {}
    for op in new_ops:
        sources = [t.op for t in op.inputs] + list(op.control_inputs)
        reached = [src is gate or gated.get(src, False) for src in sources]
        # A Merge is live as soon as one input is: it is gated only if all of them are.
        gated[op] = all(reached) if op.type in _MERGE_OPS else any(reached)
    escaping = []
    needed = {result}
    for op in reversed(new_ops):
        if op not in needed:
            continue
        if _writes_state(op) and not gated[op] and op.type not in _READ_ONLY_OPS:
            escaping.append(op)
        needed.update(t.op for t in op.inputs)
        needed.update(op.control_inputs)
    return escaping


def _writes_state(op: tf.Operation) -> bool:
    """Stateful ops, and ops taking a reference variable as a ref input (Assign, AssignAdd, the
    Apply* and Scatter* ops on TF1 variables), which TensorFlow does not mark stateful."""
    return op.op_def.is_stateful or any(arg.is_ref for arg in op.op_def.input_arg)
