"""The loss-scale state of the Keras 2 optimizer: Keras 2's own state object, our decision and rule.

Keras 2's ``LossScaleOptimizer`` keeps its scale in a ``_DynamicLossScaleState``, a trackable
whose ``update(grads)`` returns ``(update_op, should_apply)``, and every path of Keras 2's
``apply_gradients`` (plain, merge_call under a strategy, legacy graph mode) asks exactly that
object whether to apply. So the NPU's decision enters there: this subclass keeps Keras 2's
variables under Keras 2's names (``current_loss_scale``, ``good_steps``, so stock checkpoints
restore into it), and replaces ``update`` with the shared rule (npu_lossscale.rule, as the TF
managers run it), the overflow check of ``npu_lossscale.keras.overflow``, the cross-replica
agreement and the stuck-run guard. A fixed scale gets one too (not tracked, as Keras 2 keeps no
state for it): the library never applies an overflowed step, fixed or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from npu_lossscale.keras import scale_repair
from npu_lossscale.keras.overflow import agreed_finite, decided, local_finite
from npu_lossscale.modes import OverflowMode
from npu_lossscale.rule import DynamicRule
from npu_lossscale.tf.rule_ops import next_rule_state

WHO = "npu_lossscale.keras.LossScaleOptimizer (Keras 2)"


def state_class(stock_state: type) -> type:
    """Our state class over the Keras 2 release's ``_DynamicLossScaleState``."""

    class NPULossScaleState(stock_state):  # type: ignore[misc, valid-type]
        """Scale, counters and the skip-or-apply decision for one Keras 2 LossScaleOptimizer."""

        def __init__(
            self,
            initial_scale: float,
            rule: DynamicRule,
            dynamic: bool,
            is_distributed: bool | None,
        ) -> None:
            # Keras 2's __init__ would make only its two variables; the bookkeeping it sets up
            # (the per-graph weight dict) is rebuilt here, the variables through its _add_weight.
            tf.__internal__.tracking.Trackable.__init__(self)
            self._initial_loss_scale = float(initial_scale)
            self._growth_steps = rule.incr_every_n_steps
            self._multiplier = rule.incr_ratio
            self._weights = {}
            self.rule = rule
            self.dynamic = dynamic
            self.is_distributed = is_distributed
            self._track_bad = dynamic and rule.decr_every_n_nan_or_inf > 1
            self._track_floor = dynamic and rule.max_skipped_steps_at_floor is not None
            if dynamic:
                self._current_loss_scale = self._add_weight(
                    name="current_loss_scale", dtype=tf.float32, initial_value=float(initial_scale)
                )
                self._counter = self._add_weight(name="good_steps", dtype=tf.int64, initial_value=0)
            if self._track_bad:
                self._bad = self._add_weight(name="bad_steps", dtype=tf.int64, initial_value=0)
            if self._track_floor:
                self._at_floor = self._add_weight(
                    name="skips_at_floor", dtype=tf.int64, initial_value=0
                )
            self._skipped = self._add_weight(name="skipped_steps", dtype=tf.int64, initial_value=0)
            self._known: dict[Any, tf.Tensor] = {}
            self._known_scale: Any = None

        def __call__(self) -> tf.Tensor:
            if not self.dynamic:
                return tf.constant(self._initial_loss_scale, tf.float32)
            return tf.convert_to_tensor(self._current_loss_scale)

        @property
        def skipped(self) -> tf.Variable:
            return self._skipped

        def remember(self, grads: Sequence[Any], statuses: Sequence[Any], scale: Any) -> None:
            """What get_unscaled_gradients found while unscaling (``overflow.
            unscale_with_statuses``): the overflow status of each gradient tensor it handed out,
            and the scale it divided by. Only the latest call's are kept."""
            self._known = {g.ref(): s for g, s in zip(grads, statuses) if s is not None}
            self._known_scale = scale

        def _local_finite(self, grads: Sequence[Any]) -> tf.Tensor:
            # The gradients are unscaled: get_unscaled_gradients has turned every element that
            # saturated (SATURATION mode) into inf, so the inf/NaN rule decides both modes. For
            # the tensors it handed out untouched, it has asked that question already.
            statuses, unknown = decided(grads, self._known)
            if not statuses:
                return local_finite(unknown, OverflowMode.INF_NAN)
            known = [g for g in grads if isinstance(g, tf.Tensor) and g.ref() in self._known]
            # Below 1 (a restored or broken scale, repaired by this update) unscaling can turn a
            # finite gradient into inf, which the status, read before unscaling, cannot show.
            finite = tf.cond(
                self._known_scale >= 1.0,
                lambda: tf.equal(tf.add_n(statuses), 0.0),
                lambda: local_finite(known, OverflowMode.INF_NAN),
            )
            if unknown:
                finite = tf.logical_and(finite, local_finite(unknown, OverflowMode.INF_NAN))
            return finite

        def _agreed_finite(self, grads: Sequence[Any]) -> tf.Tensor:
            return agreed_finite(self._local_finite(grads), self.is_distributed)

        def update(self, grads: Any) -> tuple[Any, tf.Tensor]:
            """(update op, should_apply), where Keras 2's own state returns them."""
            grads = tf.nest.flatten(grads)
            if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
                # Keras 2 calls this inside its merge_call: ask every replica, and take the
                # first answer, which agreed_finite has made everyone's.
                strategy = tf.distribute.get_strategy()
                per_replica = strategy.extended.call_for_each_replica(
                    self._agreed_finite, args=(grads,)
                )
                finite = strategy.experimental_local_results(per_replica)[0]
            else:
                finite = self._agreed_finite(grads)
            self._known, self._known_scale = {}, None
            update_op = tf.cond(finite, lambda: self._after(True), lambda: self._after(False))
            return update_op, finite

        def _after(self, finite: bool) -> Any:
            """The state change after a clean (``finite``) or overflowed step, as one op."""
            ops = [] if finite else [self._skipped.assign_add(1, read_value=False)]
            if self.dynamic:
                ops.extend(self._move(finite))
            return tf.group(*ops)

        def _move(self, finite: bool) -> list:
            rule = self.rule
            read = tf.convert_to_tensor
            stored = read(self._current_loss_scale)
            fine = scale_repair.usable(stored, rule.min_loss_scale)
            repaired = tf.cond(
                fine,
                lambda: stored,
                lambda: scale_repair.warn_and_reset(
                    self._current_loss_scale, stored, rule.min_loss_scale, WHO
                ),
            )
            zero = tf.constant(0, tf.int64)
            scale, good, bad, at_floor = next_rule_state(
                rule,
                finite,
                read(repaired),
                read(self._counter),
                read(self._bad) if self._track_bad else zero,
                read(self._at_floor) if self._track_floor else zero,
            )
            ops = [
                self._current_loss_scale.assign(scale, read_value=False),
                self._counter.assign(good, read_value=False),
            ]
            if self._track_bad:
                ops.append(self._bad.assign(bad, read_value=False))
            if not self._track_floor:
                return ops
            ops.append(self._at_floor.assign(at_floor, read_value=False))
            limit = rule.max_skipped_steps_at_floor
            message = rule.stuck_message(self.overflow_mode_name)
            if tf.executing_eagerly():
                if int(at_floor) >= limit:
                    raise tf.errors.InvalidArgumentError(None, None, message)
            else:
                ops.append(
                    tf.debugging.Assert(at_floor < limit, [message], name="loss_scale_stuck_guard")
                )
            return ops

    return NPULossScaleState
