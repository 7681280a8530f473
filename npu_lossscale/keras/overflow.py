"""The Keras optimizer's skip-or-apply decision: one overflow check, agreed by every replica.

Both modes decide exactly as the TF1 front-end (npu_lossscale.tf.overflow): INF_NAN is its very
check (one fused sum of squares rules a clean step out; only a suspicious one pays the exact
per-element test). SATURATION is judged on the gradients as the backward pass produced them,
still scaled, where that is what arrives (model.fit, Keras 3 custom loops); gradients a
tf_keras-style loop already unscaled are judged as float32(|g| * scale), as the TF1 side does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from npu_lossscale.modes import FP16_SATURATION_VALUE, OverflowMode
from npu_lossscale.tf import distributed
from npu_lossscale.tf.overflow import gradient_values, overflow_status


def _strategy_replicas() -> int:
    """Replicas of the tf.distribute strategy this step runs under (1 when there is none)."""
    context = distributed._strategy_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def saturation_status(grads: Sequence[Any], scale_of_grads: tf.Tensor | float) -> tf.Tensor:
    """float32 1.0 when some element is inf/NaN or float32(|g| * scale_of_grads) >= 65504.

    The TF1 check's fast test (sum of squares below (65504/scale)**2) almost never passes for
    gradients that are still scaled, so its exact fallback would run every step. Here the exact
    answer costs two reductions and no branch: the sum of squares is finite exactly when every
    element is finite and below about 1.8e19 (so an element that breaks it saturates anyway),
    and then the largest magnitude decides.
    """
    values = [gradient_values(g) for g in grads if g is not None]
    if not values:
        return tf.constant(0.0, tf.float32)
    values = [v if v.dtype == tf.float32 else tf.cast(v, tf.float32) for v in values]
    sum_sq = tf.add_n([tf.nn.l2_loss(v) for v in values])
    max_abs = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(v)) for v in values]))
    saturated = max_abs * tf.cast(scale_of_grads, tf.float32) >= FP16_SATURATION_VALUE
    overflowed = tf.logical_or(tf.logical_not(tf.math.is_finite(sum_sq)), saturated)
    return tf.cast(overflowed, tf.float32)


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


def agreed_finite(
    grads: Sequence[Any],
    mode: OverflowMode,
    scale_of_grads: tf.Tensor | float,
    is_distributed: bool | None,
) -> tf.Tensor:
    """Boolean scalar: True when no replica/worker saw an overflow in its gradients.

    ``scale_of_grads`` is what the gradients were divided by already (1.0 for scaled ones).
    The local status is a float32 0/1 so that engines sum it; every replica gets the same sum
    and so takes the same branch, which keeps the collectives inside the branch safe.
    """
    if mode is OverflowMode.SATURATION:
        status = saturation_status(grads, scale_of_grads)
    else:
        status = overflow_status(list(grads), mode, scale_of_grads)
    if should_reduce(is_distributed):
        status = distributed.resolve_reducer(None).all_reduce_sum(status)
    return tf.equal(status, 0.0)
