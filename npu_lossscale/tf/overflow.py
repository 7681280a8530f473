"""Decide whether a step's gradients overflowed, exactly, at the cost of about one read per element.

The rule per overflow mode (``OverflowMode``):

* INF_NAN: the step overflowed iff some gradient element is inf or NaN.
* SATURATION: the chip clamps an overflowing fp16 result to +-65504 instead of producing inf, so
  additionally an element overflowed iff its *scaled* magnitude reached that value. The backward
  pass's gradients are tested as it produced them, still scaled (``|g| >= 65504``); gradients
  that only exist unscaled (handed to apply_gradients from elsewhere) as
  ``float32(|g_unscaled| * loss_scale) >= 65504``.

Why not ``reduce_all(is_finite(g))`` per variable, as TensorFlow does: that writes a boolean tensor
per variable and reads it again, and saturation would need a second pass for ``max(|g|)``. Instead
one cheap reduction -- half the sum of squares (``l2_loss``, one vectorised read) added over all
gradients -- rules overflow out on almost every step:

* inf or NaN anywhere makes the sum inf or NaN, so a finite sum proves INF_NAN-clean;
* the sum of non-negative terms is never smaller than any of its terms (round-to-nearest is
  monotonic), so ``sum(g**2) < (65504 / scale)**2`` proves that no element reaches the saturation
  threshold, with a relative margin of 2**-20 that absorbs float32 rounding.

Only when that test cannot rule overflow out (a real overflow, or a sum of huge finite values that
overflowed float32) does an exact per-element check run, inside a ``tf.cond``; so the answer is
always the exact one above, and the common clean step pays one read per element.

Unscaling is itself a pass over every element, though, so ``unscale_with_status`` does both in a
single pass with a fused CPU op (``npu_lossscale.tf.kernels``, compiled on first use) when it can,
and falls back to ``unscale`` followed by ``overflow_status`` otherwise, with identical results.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Callable, NamedTuple, Union

import tensorflow as tf

from npu_lossscale.modes import FP16_SATURATION_VALUE, OverflowMode
from npu_lossscale.tf import kernels

Gradient = Union[tf.Tensor, tf.IndexedSlices, None]

# Relative slack on the saturation fast test: covers the float32 rounding of |g|*scale, of g**2
# and of the threshold itself (a few ulps of 2**-24 each).
_SATURATION_MARGIN = 1.0 - 2.0**-20
# Below this threshold/scale ratio the squares of qualifying elements could reach the denormal
# range, which TensorFlow flushes to zero on CPU; the fast test is then skipped (exact path only).
_SMALLEST_SAFE_RATIO = 1e-15


def gradient_values(grad: tf.Tensor | tf.IndexedSlices) -> tf.Tensor:
    """The dense tensor holding a gradient's elements (an IndexedSlices' rows)."""
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def map_values(grad: Gradient, fn: Callable[[tf.Tensor], tf.Tensor]) -> Gradient:
    """Apply ``fn`` to a gradient's elements, keeping None and IndexedSlices structure."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def unscale(grads: Sequence[Gradient], loss_scale: tf.Tensor) -> list[Gradient]:
    """Divide every gradient by the loss scale (as a multiply by one reciprocal).

    Half-precision gradients are unscaled in float32 and cast back: 1/scale itself underflows in
    fp16 for scales above 2**24.
    """
    reciprocal = tf.math.reciprocal(tf.cast(loss_scale, tf.float32))

    def _unscale(values: tf.Tensor) -> tf.Tensor:
        if values.dtype in (tf.float32, tf.float64):
            return values * tf.cast(reciprocal, values.dtype)
        return tf.cast(tf.cast(values, tf.float32) * reciprocal, values.dtype)

    return [map_values(g, _unscale) for g in grads]


def _as_float32(values: tf.Tensor) -> tf.Tensor:
    return values if values.dtype == tf.float32 else tf.cast(values, tf.float32)


def _exact_status(values: list[tf.Tensor], mode: OverflowMode, loss_scale: tf.Tensor) -> tf.Tensor:
    """The per-element rule, used only when the fast test could not rule overflow out."""
    all_finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in values]))
    overflowed = tf.logical_not(all_finite)
    if mode is OverflowMode.SATURATION:
        max_abs = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(v)) for v in values]))
        saturated = max_abs * loss_scale >= FP16_SATURATION_VALUE
        overflowed = tf.logical_or(overflowed, saturated)
    return tf.cast(overflowed, tf.float32)


def _fast_clean(half_sum_sq: tf.Tensor, mode: OverflowMode, loss_scale: tf.Tensor) -> tf.Tensor:
    """True proves the step clean; False only means "look closer"."""
    if mode is OverflowMode.INF_NAN:
        return tf.math.is_finite(half_sum_sq)
    ratio = FP16_SATURATION_VALUE / loss_scale
    bound = 0.5 * ratio * ratio * _SATURATION_MARGIN
    # NaN compares False, so a NaN sum takes the exact path.
    return tf.logical_and(ratio >= _SMALLEST_SAFE_RATIO, half_sum_sq < bound)


def _cond(pred: tf.Tensor, true_fn: Callable, false_fn: Callable) -> tf.Tensor:
    """tf.cond that runs only the needed branch in Python when pred is already known (eager)."""
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    return tf.cond(pred, true_fn, false_fn)


def overflow_status(
    grads: Sequence[Gradient], mode: OverflowMode, loss_scale: tf.Tensor | float
) -> tf.Tensor:
    """float32 scalar, 1.0 if the gradients overflowed under ``mode``, else 0.0.

    ``loss_scale`` is the scale the gradients were divided by (1 for gradients still scaled);
    only SATURATION uses it. A float32 scalar rather than a bool so that workers can all-reduce
    it with a plain sum.
    """
    mode = OverflowMode(mode)
    if mode is OverflowMode.AUTO:
        raise ValueError("overflow_status needs a resolved overflow mode; got OverflowMode.AUTO")
    values = [_as_float32(gradient_values(g)) for g in grads if g is not None]
    if not values:
        return tf.constant(0.0, tf.float32)
    scale = tf.cast(loss_scale, tf.float32)
    half_sum_sq = tf.add_n([tf.nn.l2_loss(v) for v in values])
    return _cond(
        _fast_clean(half_sum_sq, mode, scale),
        lambda: tf.constant(0.0, tf.float32),
        lambda: _exact_status(values, mode, scale),
    )


def fused_candidate(grad: Gradient) -> bool:
    """Whether the fused op takes this gradient: a dense float32 tensor."""
    return isinstance(grad, tf.Tensor) and grad.dtype == tf.float32


def unscale_with_status(
    grads: Sequence[Gradient], loss_scale: tf.Tensor | float, mode: OverflowMode | str
) -> tuple[list[Gradient], tf.Tensor]:
    """``unscale`` and the backward pass's overflow status, in one pass where possible.

    Saturation is decided on the *scaled* gradients, as the backward pass produced them: that is
    what the chip saturates, and a value clamped to 65504 does not always come back as 65504 from
    ``unscaled * scale`` (with a scale of 100 it is 65503.996). The scale is at least 1, so the
    unscaled values are inf or NaN exactly when the scaled ones are, and either may be asked.

    Dense float32 gradients go through the fused CPU op (``npu_lossscale.tf.kernels``), which reads
    each element once instead of twice; the others (IndexedSlices, half precision) and every
    gradient when the op is unavailable or XLA compiles the graph take the pure-TF path. Values
    and status are identical.
    """
    mode = OverflowMode.parse(mode)
    if mode is OverflowMode.AUTO:
        raise ValueError(
            "unscale_with_status needs a resolved overflow mode; got OverflowMode.AUTO"
        )
    wanted = any(fused_candidate(g) for g in grads) and not kernels.in_xla_context()
    ops = kernels.fused_ops() if wanted else None
    if ops is None:
        unscaled = unscale(grads, loss_scale)
        return unscaled, _pass_status(grads, unscaled, mode, loss_scale)
    scale = tf.cast(loss_scale, tf.float32)
    saturation = mode is OverflowMode.SATURATION
    # Gradients the op does not take (IndexedSlices, half precision) go the pure-TF way.
    rest = [None if fused_candidate(g) else g for g in grads]
    result = unscale(rest, scale)
    statuses = []
    if any(g is not None for g in rest):
        statuses.append(_pass_status(rest, result, mode, scale))
    for i, grad in enumerate(grads):
        if fused_candidate(grad):
            result[i], status = ops.npu_unscale_and_check(grad, scale, saturation=saturation)
            statuses.append(status)
    status = statuses[0] if len(statuses) == 1 else tf.reduce_max(tf.stack(statuses))
    return result, status


def _pass_status(
    scaled: Sequence[Gradient],
    unscaled: Sequence[Gradient],
    mode: OverflowMode,
    loss_scale: tf.Tensor | float,
) -> tf.Tensor:
    """A backward pass's status on the pure-TF path. Saturation needs the scaled values (see
    ``unscale_with_status``); inf/NaN is the same question for either, and asking it of the
    unscaled ones leaves the scaled gradient a single consumer, the multiply, which can then
    write in place."""
    if mode is OverflowMode.SATURATION:
        return overflow_status(scaled, mode, 1.0)
    return overflow_status([u for u in unscaled if u is not None], mode, loss_scale)


# How far back apply_gradients looks for the gradients compute_gradients returned, when it was
# handed tensors derived from them (clipping, casting, summing): a bound on graph-building time
# only, generous for any clipping or averaging chain.
_MAX_OPS_SEARCHED = 10_000


def _ref(tensor: tf.Tensor) -> object:
    """A hashable reference to an eager tensor: ``Tensor.ref()``, ``experimental_ref()`` on
    TF 1.15."""
    ref = getattr(tensor, "ref", None) or tensor.experimental_ref
    return ref()


class StashLookup(NamedTuple):
    """What is known about a list of gradients handed to apply_gradients."""

    statuses: list[tf.Tensor]  # backward-pass statuses of the compute_gradients calls found
    derived: list[Gradient]  # computed from those calls' gradients (clipped, averaged, ...)
    foreign: list[Gradient]  # not traceable to any compute_gradients call


class StatusStash:
    """Remembers each backward pass's overflow status, keyed by the gradients it returned.

    The status belongs to the backward pass (on the chip it is a register read after backprop),
    so apply_gradients must find it again from whatever gradients it is handed: the returned ones
    themselves, or tensors the user derived from them in between (clipping by global norm shrinks
    a saturated value below the threshold, and only the backward pass still knows it saturated).

    In a graph the table maps tensor *names* (unique per graph) to status tensor names, per graph
    and weakly keyed, so it holds no tensor and dies with its graph; threads building replicas of
    one graph (MirroredStrategy) each find their own tensors.

    Eagerly there is no graph to trace derived tensors through, only time: every backward pass
    since the last apply_gradients is pending, and the next apply_gradients takes them all
    (``find`` consumes them). Its gradients are then taken to come from those passes -- clipped,
    or summed over micro-batches, where a saturated element can shrink or cancel out -- so their
    statuses count, and gradients that are not the very tensors the latest pass returned are
    checked again for inf/NaN, as derived gradients are in a graph. Pending passes are kept per
    thread, as an eager strategy runs each replica in a thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._eager = threading.local()

    def put(self, grads: Sequence[Gradient], status: tf.Tensor) -> None:
        values = [gradient_values(g) for g in grads if g is not None]
        if tf.executing_eagerly():
            # Only the latest pass's tensors are kept (for the exact match), so a loop that never
            # calls apply_gradients holds one step's gradients, not all of them.
            pending = getattr(self._eager, "pending", None)
            if pending is not None:
                status = tf.maximum(pending[1], status)
            self._eager.pending = (frozenset(_ref(v) for v in values), status)
            return
        with self._lock:
            table = self._tables.setdefault(status.graph, {})
            for value in values:
                table[value.name] = status.name

    def find(self, grads: Sequence[Gradient]) -> StashLookup:
        """The statuses ``grads`` answer to; eagerly this also takes the pending passes."""
        present = [g for g in grads if g is not None]
        if tf.executing_eagerly():
            return self._find_eager(present)
        graph = tf.compat.v1.get_default_graph()
        with self._lock:
            table = dict(self._tables.get(graph, {}))
        search = _AncestorSearch(table)
        status_names: dict[str, None] = {}
        derived: list[Gradient] = []
        foreign: list[Gradient] = []
        for grad in present:
            value = gradient_values(grad)
            if value.graph is not graph:
                foreign.append(grad)
                continue
            if value.name in table:
                status_names[table[value.name]] = None
                continue
            found = sorted(search.statuses(value))
            status_names.update(dict.fromkeys(found))
            (derived if found else foreign).append(grad)
        statuses = [graph.get_tensor_by_name(name) for name in status_names]
        return StashLookup(statuses, derived, foreign)

    def _find_eager(self, present: list[Gradient]) -> StashLookup:
        pending = getattr(self._eager, "pending", None)
        self._eager.pending = None
        if pending is None:
            return StashLookup([], [], present)
        keys, status = pending
        if all(_ref(gradient_values(g)) in keys for g in present):
            return StashLookup([status], [], [])
        # Made from the pending passes (clipped, summed over micro-batches), as in a graph: their
        # statuses already hold every saturation, and only inf/NaN can arise afterwards. Checking
        # a sum of clean micro-batches under the saturation rule would skip clean steps.
        return StashLookup([status], present, [])


class _AncestorSearch:
    """Which stashed gradients a tensor was computed from, memoised across one lookup.

    Iterative depth-first search over op inputs, stopping at stashed gradients; ops on a cycle
    (v1 while loops) or beyond the search budget count as leading nowhere, which only makes a
    gradient count as foreign and so checked on its own -- never a missed overflow.
    """

    def __init__(self, table: dict[str, str]) -> None:
        self._table = table
        self._memo: dict[str, frozenset] = {}
        self._budget = _MAX_OPS_SEARCHED

    def statuses(self, tensor: tf.Tensor) -> frozenset:
        if tensor.name in self._table:
            return frozenset([self._table[tensor.name]])
        self._visit(tensor.op)
        return self._memo.get(tensor.op.name, frozenset())

    def _visit(self, root: tf.Operation) -> None:
        on_stack: set[str] = set()
        stack = [(root, False)]
        while stack:
            op, inputs_done = stack.pop()
            if op.name in self._memo:
                continue
            if inputs_done:
                found: set[str] = set()
                for tensor in op.inputs:
                    if tensor.name in self._table:
                        found.add(self._table[tensor.name])
                    else:
                        found |= self._memo.get(tensor.op.name, frozenset())
                self._memo[op.name] = frozenset(found)
                continue
            if op.name in on_stack or self._budget <= 0:
                continue
            self._budget -= 1
            on_stack.add(op.name)
            stack.append((op, True))
            for tensor in op.inputs:
                if tensor.name not in self._table and tensor.op.name not in self._memo:
                    stack.append((tensor.op, False))


def npu_float_status_ops():
    """The Ascend adapter's generated NPU ops module, or None off an Ascend host.

    Imported lazily and never required: only ``npu_bridge`` provides the hardware float-status
    register ops (alloc / get / clear), which report a saturation-mode overflow directly.
    """
    try:
        from npu_bridge.helper import helper  # Ascend hosts only
    except Exception:  # absent or broken adapter: fall back to the software rule
        return None
    try:
        return helper.get_gen_ops()
    except Exception:
        return None


class HardwareFloatStatus:
    """Read-and-clear of the NPU's float-status register around one backward pass.

    Untestable off an Ascend host (no npu_bridge here), so deliberately small: ``start()`` before
    the backward pass allocates (and so clears) the register; ``status(grads)`` reads it once the
    gradients exist, schedules the clear, and returns 1.0/0.0 like ``overflow_status``.
    """

    def __init__(self, gen_ops) -> None:
        self._ops = gen_ops
        self._buffer: tf.Tensor | None = None

    def start(self) -> tf.Tensor:
        self._buffer = self._ops.npu_alloc_float_status()
        return self._buffer

    def status(self, grads: Sequence[Gradient]) -> tf.Tensor:
        if self._buffer is None:
            raise RuntimeError("HardwareFloatStatus.status() called before start()")
        produced = [gradient_values(g) for g in grads if g is not None]
        with tf.control_dependencies(produced):
            register = self._ops.npu_get_float_status(self._buffer)
        overflowed = tf.cast(tf.reduce_sum(register) > 0, tf.float32)
        with tf.control_dependencies([overflowed]):
            cleared = self._ops.npu_clear_float_status(register)
        with tf.control_dependencies([cleared]):
            return tf.identity(overflowed)
