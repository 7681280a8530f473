"""The update rule on TensorFlow tensors, for every TF-based front-end.

The TF1 managers (``managers.py``) and both Keras optimizers hold the rule's state in their own
variables but move it with these functions, so the three run one device-side rule, tested against
``npu_lossscale.rule.DynamicRule.step``: ``next_rule_state`` branch-free in TensorFlow ops,
``grown_scale`` and ``shrunk_scale`` for callers that branch themselves, and ``fused_update`` the
same step as the one fused CPU op (``kernels/loss_scale_update.cc``) where it is built.
"""

from __future__ import annotations

import math
from types import ModuleType

import tensorflow as tf

from npu_lossscale.rule import DynamicRule


def grown_scale(rule: DynamicRule, scale: tf.Tensor) -> tf.Tensor:
    """The scale after a growing step: times incr_ratio, clamped to max_loss_scale, or kept when
    the product leaves the float32 range."""
    grown = scale * tf.constant(rule.incr_ratio, tf.float32)
    if rule.max_loss_scale is None:
        return tf.where(tf.math.is_finite(grown), grown, scale)
    return tf.minimum(grown, tf.constant(rule.max_loss_scale, tf.float32))


def shrunk_scale(rule: DynamicRule, scale: tf.Tensor) -> tf.Tensor:
    """The scale after a shrinking step: times decr_ratio, never below min_loss_scale."""
    floor = tf.constant(rule.min_loss_scale, tf.float32)
    return tf.maximum(floor, scale * tf.constant(rule.decr_ratio, tf.float32))


def next_rule_state(
    rule: DynamicRule,
    finite: tf.Tensor | bool,
    scale: tf.Tensor,
    good: tf.Tensor,
    bad: tf.Tensor,
    at_floor: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """DynamicRule.step on device tensors: (scale, good, bad, skips at floor) after one step.

    Branch-free (tf.where only) because it runs every step, in TF1 graphs, eagerly, inside
    tf.function and in a replica or cross-replica context alike; the TF managers and the Keras
    optimizer both assign its results to their own variables. ``finite`` may be a Python bool
    where the caller already branched (the Keras optimizer, inside its apply/skip cond): then
    only that side's ops are built. max_loss_scale clamps increases to the cap (the scale
    reaches it exactly) rather than refusing the step that would pass it.
    """
    zero = tf.zeros_like(good)
    no_floor_skips = tf.zeros_like(at_floor)
    floor = tf.constant(rule.min_loss_scale, tf.float32)

    def after_clean() -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        grow = good + 1 >= rule.incr_every_n_steps
        grown = grown_scale(rule, scale)
        return (
            tf.where(grow, grown, scale),
            tf.where(grow, zero, good + 1),
            tf.where(grow, zero, bad),
        )

    def after_overflow() -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        shrink = bad + 1 >= rule.decr_every_n_nan_or_inf
        shrunk = shrunk_scale(rule, scale)
        return tf.where(shrink, shrunk, scale), zero, tf.where(shrink, zero, bad + 1)

    def floor_skips() -> tf.Tensor:  # after an overflow: one more if it ran at the floor
        return tf.where(scale <= floor, at_floor + 1, no_floor_skips)

    if isinstance(finite, bool):
        new_scale, new_good, new_bad = after_clean() if finite else after_overflow()
        new_at_floor = no_floor_skips if finite else floor_skips()
    else:
        clean, overflowed = after_clean(), after_overflow()
        new_scale, new_good, new_bad = (tf.where(finite, c, o) for c, o in zip(clean, overflowed))
        new_at_floor = tf.where(finite, no_floor_skips, floor_skips())
    return new_scale, new_good, new_bad, new_at_floor


def fused_update(
    ops: ModuleType,
    rule: DynamicRule,
    finite: tf.Tensor,
    *,
    loss_scale: tf.Variable,
    good_steps: tf.Variable,
    bad_steps: tf.Variable,
    skipped_steps: tf.Variable,
    skips_at_floor: tf.Variable,
) -> tf.Tensor:
    """One step of the rule as the fused op ``NpuLossScaleUpdate`` (``ops`` is the loaded
    library, kernels.fused_ops()): it assigns the five variables and returns the new count of
    skips at the floor. Each variable goes to the op's input of its name, never by position, so
    no reordering of a caller's variables can swap two counters."""
    return ops.npu_loss_scale_update(
        finite=finite,
        loss_scale=loss_scale.handle,
        good_steps=good_steps.handle,
        bad_steps=bad_steps.handle,
        skipped_steps=skipped_steps.handle,
        skips_at_floor=skips_at_floor.handle,
        incr_every_n_steps=rule.incr_every_n_steps,
        decr_every_n_nan_or_inf=rule.decr_every_n_nan_or_inf,
        incr_ratio=rule.incr_ratio,
        decr_ratio=rule.decr_ratio,
        min_loss_scale=rule.min_loss_scale,
        max_loss_scale=math.inf if rule.max_loss_scale is None else rule.max_loss_scale,
    )
