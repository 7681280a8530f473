"""The Keras optimizer's skip-or-apply decision: one overflow check, agreed by every replica.

Both modes decide exactly what the TF1 front-end (npu_lossscale.tf.overflow) decides: INF_NAN,
any inf/NaN element; SATURATION, also any element whose scaled magnitude reaches 65504. Saturation
is judged on the gradients as the backward pass produced them, still scaled: that is what arrives
in model.fit and Keras 3 custom loops. A tf_keras-style loop unscales them itself first, through
``unscale``, which judges the scaled values there and hands a saturated element on as inf (sign
kept), as IEEE hardware would have produced it; the gradients apply_gradients then receives are
judged by the INF_NAN rule, which decides the same. Judging them after the division instead
cannot be exact: with a scale of 100, 65504 comes back from ``g / 100 * 100`` as 65503.996, and
gradients summed or clipped after unscaling no longer say what the backward pass saturated.

The check is built the way Keras builds its own (one boolean reduction per gradient, then one
over those), not as the TF1 side's sum of squares plus an exact fallback: on gradients that are
still scaled that fast test almost never passes in saturation mode, and in a Keras train function
the branch costs more than the pass it saves. One comparison per element decides both rules:
NaN and inf fail ``|g| < threshold`` just as a saturated value does. On CPU, where the TF1
front-end's fused op is built, that op does the check and the unscaling in one pass instead
(``unscale_and_check``), with the same decision and values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from npu_lossscale.modes import FP16_SATURATION_VALUE, OverflowMode
from npu_lossscale.tf import distributed, kernels
from npu_lossscale.tf.overflow import fused_candidate, gradient_values, map_values


def local_finite(grads: Sequence[Any], mode: OverflowMode) -> tf.Tensor:
    """Boolean scalar: True when this replica's (still scaled) gradients did not overflow."""
    values = [gradient_values(g) for g in grads if g is not None]
    if not values:
        return tf.constant(True)
    per_gradient = []
    for value in values:
        if mode is OverflowMode.INF_NAN:
            per_gradient.append(tf.reduce_all(tf.math.is_finite(value)))
            continue
        magnitude = tf.abs(value if value.dtype == tf.float32 else tf.cast(value, tf.float32))
        per_gradient.append(tf.reduce_all(magnitude < FP16_SATURATION_VALUE))
    return tf.reduce_all(tf.stack(per_gradient))


def unscale_and_check(
    grads: Sequence[Any], divide: Sequence[bool], scale: tf.Tensor, mode: OverflowMode
) -> tuple[list[Any], tf.Tensor]:
    """The still-scaled gradients unscaled (where ``divide`` says so), and the boolean scalar
    ``local_finite`` gives for them: both before the skip-or-apply branch, which then applies
    what it is handed.

    Dense float32 gradients go through the TF1 front-end's fused CPU op where it is built
    (``npu_lossscale.tf.kernels``): one node per gradient that reads each element once for both
    jobs, where Keras's own optimizer runs three (is_finite, reduce, divide) and reads the
    gradient twice. The op applies ``local_finite``'s rule to the scaled values and multiplies
    by the reciprocal of the scale; the pure path here does the same, so the two agree bit for
    bit (Keras divides, which can differ in the last bit at scales that are not powers of two).
    """
    # A variable list of another length is Keras's to report, in the inner apply.
    divide = [*divide, *[True] * (len(grads) - len(divide))]
    wanted = [bool(d) and g is not None for g, d in zip(grads, divide)]
    fusable = [w and fused_candidate(g) for g, w in zip(grads, wanted)]
    # Without the op the pure path costs what Keras's own check does: nothing to warn about.
    ops = kernels.fused_ops(warn=False) if any(fusable) and not kernels.in_xla_context() else None
    reciprocal = tf.math.reciprocal(tf.cast(scale, tf.float32))

    def multiply(values: tf.Tensor) -> tf.Tensor:
        if values.dtype == tf.float32:
            return values * reciprocal
        if values.dtype == tf.float64:  # the op never takes these: divided at their precision
            return values / tf.cast(scale, tf.float64)
        return tf.cast(tf.cast(values, tf.float32) * reciprocal, values.dtype)

    result: list[Any] = []
    statuses = []
    checked_here = []
    for grad, unscale_it, fused in zip(grads, wanted, fusable):
        if ops is not None and fused:
            unscaled, status = ops.npu_unscale_and_check(
                grad, scale, saturation=mode is OverflowMode.SATURATION
            )
            result.append(unscaled)
            statuses.append(status)
            continue
        unscaled = map_values(grad, multiply) if unscale_it else grad
        result.append(unscaled)
        if grad is not None:
            # inf/NaN is the same question of either (the scale is at least 1); asked of the
            # unscaled values it leaves the multiply the scaled gradient's only reader, so it
            # can write in place. Saturation is a question about the scaled values.
            checked_here.append(grad if mode is OverflowMode.SATURATION else unscaled)
    if not statuses:
        return result, local_finite(checked_here, mode)
    clean = tf.equal(statuses[0] if len(statuses) == 1 else tf.add_n(statuses), 0.0)
    if checked_here:
        clean = tf.logical_and(clean, local_finite(checked_here, mode))
    return result, clean


def unscale(grads: Sequence[Any], scale: tf.Tensor, mode: OverflowMode) -> list[Any]:
    """The gradients divided by ``scale``; in SATURATION mode a saturated element becomes inf.

    An element whose scaled magnitude reached 65504 (or was inf/NaN already) comes back as
    +-inf (NaN stays NaN), so that whatever the caller does with the gradients before
    apply_gradients -- pass them to another tf.function, sum micro-batches, apply a subset --
    the overflow travels with them and an inf/NaN check finds it. Float32 and half-precision
    gradients are multiplied by the float32 reciprocal of the scale (half precision cast back:
    the scale itself may not fit in float16), as Keras 2's own class and the fused op do, so the
    two paths of ``unscale_with_statuses`` agree bit for bit; float64 ones are divided.
    """
    saturation = mode is OverflowMode.SATURATION
    reciprocal = tf.math.reciprocal(tf.cast(scale, tf.float32))

    def divide(values: tf.Tensor) -> tf.Tensor:
        if values.dtype == tf.float64:
            wide, unscaled = values, values / tf.cast(scale, tf.float64)
        else:
            wide = values if values.dtype == tf.float32 else tf.cast(values, tf.float32)
            unscaled = wide * reciprocal
        if saturation:
            saturated = tf.logical_not(tf.abs(wide) < FP16_SATURATION_VALUE)
            unscaled = tf.where(saturated, wide * float("inf"), unscaled)
        return unscaled if unscaled.dtype == values.dtype else tf.cast(unscaled, values.dtype)

    return [map_values(g, divide) for g in grads]


def unscale_with_statuses(
    grads: Sequence[Any], scale: tf.Tensor, mode: OverflowMode
) -> tuple[list[Any], list[Any]]:
    """``unscale``'s gradients, and for each the overflow status found on the way (a float32
    scalar, 0 when that gradient is clean under ``mode``; None where nothing was checked).

    Dense float32 gradients go through the fused CPU op where it is built: one pass that
    unscales and checks, where ``unscale`` alone makes five in SATURATION mode (abs, compare,
    not, multiply, select) and the inf/NaN check of apply_gradients reads the result again. The
    op marks nothing, so when some gradient saturated, one branch redoes those gradients the
    per-element way (``unscale``): the values handed back are ``unscale``'s in every case. The
    statuses let apply_gradients skip its own check of these very tensors (``decided``).
    """
    grads = list(grads)
    fusable = [fused_candidate(g) for g in grads]
    ops = kernels.fused_ops(warn=False) if any(fusable) and not kernels.in_xla_context() else None
    if ops is None:
        return unscale(grads, scale, mode), [None] * len(grads)
    saturation = mode is OverflowMode.SATURATION
    scale32 = tf.cast(scale, tf.float32)
    result = unscale([None if f else g for g, f in zip(grads, fusable)], scale, mode)
    statuses: list[Any] = [None] * len(grads)
    fused = [i for i, f in enumerate(fusable) if f]
    for i in fused:
        result[i], statuses[i] = ops.npu_unscale_and_check(grads[i], scale32, saturation=saturation)
    if saturation:  # inf and NaN pass through the multiply; a saturated finite value does not
        clean = tf.equal(tf.add_n([statuses[i] for i in fused]), 0.0)
        marked = tf.cond(
            clean,
            lambda: tuple(result[i] for i in fused),
            lambda: tuple(unscale([grads[i] for i in fused], scale, mode)),
        )
        for i, value in zip(fused, marked):
            result[i] = value
    return result, statuses


def decided(grads: Sequence[Any], known: dict[Any, tf.Tensor]) -> tuple[list[tf.Tensor], list[Any]]:
    """The statuses ``known`` holds for these very gradient tensors, and the gradients it does
    not know (to be checked as usual). A gradient changed after unscaling is a new tensor, so
    only what ``unscale_with_statuses`` handed out, untouched, is taken on its word."""
    statuses, unknown = [], []
    for grad in grads:
        status = known.get(grad.ref()) if isinstance(grad, tf.Tensor) else None
        if status is None:
            unknown.append(grad)
        else:
            statuses.append(status)
    return statuses, unknown


def _strategy_replicas() -> int:
    """Replicas of the tf.distribute strategy this step runs under (1 when there is none)."""
    context = distributed.strategy_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def should_reduce(is_distributed: bool | None) -> bool:
    """Whether to sum the flag over workers: None means "when a strategy has several replicas".

    False under a strategy with several replicas would let each replica decide alone, their
    weights drift apart, and the next collective hang or mix stale values: refused, as the TF1
    optimizer refuses it.
    """
    replicas = _strategy_replicas()
    if is_distributed is None:
        return replicas > 1
    if not is_distributed and replicas > 1:
        raise ValueError(
            "npu_lossscale.keras.LossScaleOptimizer(is_distributed=False) is running under a "
            f"tf.distribute strategy with {replicas} replicas: each replica would decide on its "
            "own whether to skip a step. Leave is_distributed=None (or pass True)."
        )
    return bool(is_distributed)


def agreed_finite(finite: tf.Tensor, is_distributed: bool | None) -> tf.Tensor:
    """Boolean scalar: True when no replica/worker saw an overflow (``finite`` is this one's).

    Workers sum a float32 0/1 overflow status; every replica gets the same sum and so takes the
    same branch, which keeps the collectives inside the branch safe.
    """
    if not should_reduce(is_distributed):
        return finite
    status = tf.cast(tf.logical_not(finite), tf.float32)
    try:
        reducer = distributed.resolve_reducer(None)
    except distributed.NoDistributedEngineError as error:
        raise no_engine_error() from error
    return tf.equal(reducer.all_reduce_sum(status), 0.0)


def no_engine_error() -> distributed.NoDistributedEngineError:
    """is_distributed=True with nothing to sum over, in the Keras class's own terms (the TF1
    optimizer's message names that class and a reducer= argument the Keras classes lack)."""
    return distributed.NoDistributedEngineError(
        "npu_lossscale.keras.LossScaleOptimizer(is_distributed=True): no distributed engine is "
        "active where apply_gradients runs. It looks for a tf.distribute replica context "
        "(model.fit, or strategy.run in a custom loop, with the model and optimizer built under "
        "strategy.scope()), then Horovod (horovod.tensorflow imported and hvd.init() called), "
        "then the Ascend HCCL adapter (npu_bridge). Train under one of these, or leave "
        "is_distributed=None (the default: sum over a strategy's replicas when there are "
        "several) for one worker."
    )
