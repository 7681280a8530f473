"""The Keras optimizer's skip-or-apply decision: one overflow check, agreed by every replica.

The check itself is the TF1 front-end's (npu_lossscale.tf.overflow.overflow_status): one fused
reduction over all gradients rules a clean step out cheaply, and only a suspicious one pays the
exact per-element test, so both front-ends decide every step identically. Saturation is judged on
the gradients as the backward pass produced them, still scaled, where that is what arrives
(model.fit, Keras 3 custom loops); gradients a tf_keras-style loop already unscaled are judged as
float32(|g| * scale), as the TF1 side does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf import distributed
from npu_lossscale.tf.overflow import overflow_status


def _strategy_replicas() -> int:
    """Replicas of the tf.distribute strategy this step runs under (1 when there is none)."""
    context = distributed._strategy_replica_context()
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
    status = overflow_status(list(grads), mode, scale_of_grads)
    if should_reduce(is_distributed):
        status = distributed.resolve_reducer(None).all_reduce_sum(status)
    return tf.equal(status, 0.0)
