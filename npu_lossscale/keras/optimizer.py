"""`LossScaleOptimizer` for Keras 3: Keras's own wrapper with the NPU's decision and rule.

Keras's `keras.mixed_precision.LossScaleOptimizer` already has the right shape: it delegates
variables and slots to the inner optimizer, keeps its scale and step counter as optimizer
variables (so `model.save` carries them) and applies or skips through one `cond`. What differs
on an Ascend NPU is what counts as an overflow (saturation mode clamps instead of producing inf),
how the scale moves (the Ascend adapter's hysteresis, floor, ceiling and stuck-run guard), and
that every replica must take the same decision. So this class subclasses Keras's and replaces
exactly those three: the decision (`overflow.agreed_finite`), the rule (`next_rule_state`, the
TF managers' own), and the distributed apply, where the flag is summed before anyone branches.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.utils import tracking

from npu_lossscale.keras.overflow import agreed_finite
from npu_lossscale.modes import OverflowMode, resolve_overflow_mode
from npu_lossscale.rule import DynamicRule, check_bool
from npu_lossscale.tf import distributed
from npu_lossscale.tf.managers import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    grown_scale,
    next_rule_state,
    shrunk_scale,
)

# The Keras spellings of the rule's arguments, so that an error names what the user wrote.
_NAMES = {"init_loss_scale": "initial_scale", "incr_every_n_steps": "dynamic_growth_steps"}


def _check_inner(inner_optimizer: object) -> None:
    if isinstance(inner_optimizer, keras.optimizers.Optimizer):
        return
    hint = ""
    if isinstance(inner_optimizer, tf.compat.v1.train.Optimizer):
        hint = (
            " (a tf.compat.v1 optimizer: wrap it in npu_lossscale.NPULossScaleOptimizer instead, "
            "or build a Keras optimizer such as keras.optimizers.SGD)"
        )
    raise ValueError(
        f"inner_optimizer must be a keras.optimizers.Optimizer; got {inner_optimizer!r}{hint}"
    )


def _check_is_distributed(value: object) -> bool | None:
    return None if value is None else check_bool("is_distributed", value)


@keras.saving.register_keras_serializable(package="npu_lossscale")
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic (or fixed) loss scaling for Keras 3 with the NPU's overflow modes.

    Drop-in for `keras.mixed_precision.LossScaleOptimizer` (Keras 3) and for the tf_keras 2
    spellings (`dynamic=`, `initial_scale=`, `get_scaled_loss`, `get_unscaled_gradients`).
    Defaults are Keras's rule (halve on every overflow, double after `dynamic_growth_steps`
    clean steps) with a floor of `min_loss_scale`; the keyword-only extras give the Ascend
    adapter's rule, and `from_manager` takes it from an npu_lossscale TF manager.

    `dynamic=False` keeps `initial_scale` fixed, and an overflowed step is still skipped (the
    NPU adapter's FixedLossScaleManager): on a saturating chip an unchecked fixed scale would
    apply clamped gradients silently. An overflowed step applies nothing -- weights, the inner
    optimizer's slots and `iterations` stay as they were -- and counts in `skipped_steps`.
    """

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int = 2000,
        *,
        dynamic: bool = True,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool | None = None,
        decr_every_n_nan_or_inf: int = 1,
        decr_ratio: float = 0.5,
        incr_ratio: float = 2.0,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        max_skipped_steps_at_floor: int | None = None,
        **kwargs: Any,
    ) -> None:
        _check_inner(inner_optimizer)
        dynamic = check_bool("dynamic", dynamic)
        init, rule = DynamicRule.validated(
            initial_scale,
            dynamic_growth_steps,
            decr_every_n_nan_or_inf,
            incr_ratio,
            decr_ratio,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            max_skipped_steps_at_floor=max_skipped_steps_at_floor,
            names=_NAMES,
        )
        is_distributed = _check_is_distributed(is_distributed)
        requested_mode = OverflowMode.parse(overflow_mode).value
        super().__init__(
            inner_optimizer,
            initial_scale=init,
            dynamic_growth_steps=rule.incr_every_n_steps,
            **kwargs,
        )
        self.dynamic = dynamic
        self._rule = rule
        self.is_distributed = is_distributed
        self._requested_mode = requested_mode
        self.overflow_mode = resolve_overflow_mode(overflow_mode)
        # Set by get_unscaled_gradients (tf_keras loops unscale before apply_gradients), read by
        # the next apply in the same thread: MirroredStrategy traces each replica in its own.
        self._unscaled = threading.local()

    @classmethod
    def from_manager(
        cls,
        inner_optimizer: keras.optimizers.Optimizer,
        manager: FixedLossScaleManager | ExponentialUpdateLossScaleManager,
        *,
        is_distributed: bool | None = None,
    ) -> LossScaleOptimizer:
        """The optimizer a ported TF1 script gets: the manager's scale, rule and overflow mode.

        The manager is read once, eagerly, and not driven afterwards (the optimizer's own
        variables hold the state, so it is saved with the model and the flag is summed only
        here, never a second time by the manager). `is_distributed` is the manager's unless
        given; a manager's False means "the manager does not reduce", which leaves the Keras
        default (reduce exactly when a strategy has several replicas).
        """
        if is_distributed is None and getattr(manager, "is_distributed", False):
            is_distributed = True
        mode = manager.overflow_mode.value
        if isinstance(manager, ExponentialUpdateLossScaleManager):
            rule = manager._rule
            with tf.init_scope():
                scale = float(manager.get_loss_scale())
            return cls(
                inner_optimizer,
                scale,
                rule.incr_every_n_steps,
                overflow_mode=mode,
                is_distributed=is_distributed,
                decr_every_n_nan_or_inf=rule.decr_every_n_nan_or_inf,
                decr_ratio=rule.decr_ratio,
                incr_ratio=rule.incr_ratio,
                min_loss_scale=rule.min_loss_scale,
                max_loss_scale=rule.max_loss_scale,
                max_skipped_steps_at_floor=rule.max_skipped_steps_at_floor,
            )
        if isinstance(manager, FixedLossScaleManager):
            if not manager.enable_overflow_check:
                raise ValueError(
                    "manager: a FixedLossScaleManager with enable_overflow_check=False never skips "
                    "a step; in Keras set loss_scale_factor on the inner optimizer instead"
                )
            return cls(
                inner_optimizer,
                manager._loss_scale_value,
                dynamic=False,
                overflow_mode=mode,
                is_distributed=is_distributed,
            )
        raise ValueError(
            "manager must be an npu_lossscale FixedLossScaleManager or "
            f"ExponentialUpdateLossScaleManager; got {manager!r}"
        )

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list: list[Any]) -> None:
        # Keras's two variables under Keras's names (step_counter is the good-step count), then
        # the rest of the rule's state; all are saved with the model.
        def counter(name: str, dtype: str = "int32") -> keras.Variable:
            return self.add_variable(
                shape=(), dtype=dtype, initializer="zeros", aggregation="none", name=name
            )

        self.step_counter = counter("step_counter")
        self.dynamic_scale = self.add_variable(
            shape=(),
            dtype="float32",
            initializer=keras.initializers.Constant(self.initial_scale),
            aggregation="none",
            name="dynamic_scale",
        )
        self.bad_steps = counter("bad_steps")
        self.skips_at_floor = counter("skips_at_floor", "int64")
        self._skipped = counter("skipped_steps", "int64")
        self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    # -- readable state ---------------------------------------------------------------------

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (tf_keras's name for it), a float32 scalar."""
        if self.built:
            return tf.convert_to_tensor(self.dynamic_scale.value)
        return tf.constant(self.initial_scale, tf.float32)

    @property
    def dynamic_counter(self) -> keras.Variable | None:
        """tf_keras's name: clean steps since the scale last changed."""
        return self.step_counter if self.built else None

    @property
    def skipped_steps(self) -> tf.Tensor:
        """int64 count of overflowed steps, i.e. steps the inner optimizer did not apply."""
        if self.built:
            return tf.convert_to_tensor(self._skipped.value)
        return tf.constant(0, tf.int64)

    # -- the tf_keras custom-loop spellings ----------------------------------------------------

    def get_scaled_loss(self, loss: Any) -> Any:
        if callable(loss):
            return lambda: self.scale_loss(loss())
        return self.scale_loss(loss)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divide by the scale, as tf_keras did; the next apply_gradients then knows its
        gradients are unscaled and neither divides again nor misjudges saturation."""
        scale = self.loss_scale
        self._unscaled.pending = True
        return [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]

    # -- one step -----------------------------------------------------------------------------

    def _tf_apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            raise ValueError("apply() must be called in a replica context.")
        grads_unscaled = getattr(self._unscaled, "pending", False)
        self._unscaled.pending = False
        scale_of_grads = self.loss_scale if grads_unscaled else 1.0
        finite = agreed_finite(grads, self.overflow_mode, scale_of_grads, self.is_distributed)
        context = distributed._strategy_replica_context()
        if context is None:
            self._apply_or_skip(finite, grads, trainable_variables, grads_unscaled)
            return

        # The inner optimizer sums the gradients with a merge_call, which a cond in replica
        # context cannot contain; so branch once in cross-replica context, as Keras does, on a
        # flag that is already the same on every replica. The gradients travel as merge_call
        # arguments, which makes them per-replica values: each replica applies its own.
        def cross_replica(
            strategy: tf.distribute.Strategy, finite: Any, grads: Any, variables: Any
        ) -> None:
            agreed = strategy.experimental_local_results(finite)[0]

            def apply_on_every_replica() -> None:
                strategy.extended.call_for_each_replica(
                    self._apply_inner, args=(grads, variables, grads_unscaled)
                )
                self._update_scale(finite=True)

            tf.cond(agreed, apply_on_every_replica, lambda: self._update_scale(finite=False))

        context.merge_call(cross_replica, args=(finite, grads, trainable_variables))

    def _common_apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        self._tf_apply(grads, trainable_variables)

    def _apply_or_skip(
        self, finite: tf.Tensor, grads: list[Any], variables: Any, grads_unscaled: bool
    ) -> None:
        def apply() -> None:
            self._apply_inner(grads, variables, grads_unscaled)
            self._update_scale(finite=True)

        tf.cond(finite, apply, lambda: self._update_scale(finite=False))

    def _apply_inner(self, grads: list[Any], variables: Any, grads_unscaled: bool) -> None:
        if not grads_unscaled:
            scale = tf.convert_to_tensor(self.dynamic_scale.value)
            targets = variables or self._trainable_variables
            grads = [
                g
                if g is None or self._overwrite_variable_with_gradient(v)
                else g / tf.cast(scale, g.dtype)
                for g, v in zip(grads, targets)
            ]
        self.inner_optimizer.apply(grads, trainable_variables=variables)

    def _update_scale(self, finite: bool) -> None:
        """Move the scale by the rule, count the skip, and stop a run stuck at the floor.

        Called inside the apply or the skip branch, where ``finite`` is known: only that side of
        the rule is built, which keeps the per-step graph about as small as Keras's own.
        """
        if not finite:
            self._skipped.assign_add(tf.constant(1, tf.int64))
        if not self.dynamic:
            return
        # With the defaults (back off on every overflow, no stuck guard) the bad-step count is
        # always 0 and the floor count unused: neither is read nor written then.
        read = tf.convert_to_tensor
        track_bad = self._rule.decr_every_n_nan_or_inf > 1
        track_floor = self._rule.max_skipped_steps_at_floor is not None

        def move() -> tf.Tensor:
            scale, good, bad, at_floor = next_rule_state(
                self._rule,
                finite,
                read(self.dynamic_scale.value),
                read(self.step_counter.value),
                read(self.bad_steps.value) if track_bad else tf.constant(0, tf.int32),
                read(self.skips_at_floor.value) if track_floor else tf.constant(0, tf.int64),
            )
            self.dynamic_scale.assign(scale)
            self.step_counter.assign(good)
            if track_bad:
                self.bad_steps.assign(bad)
            if track_floor:
                self.skips_at_floor.assign(at_floor)
            return at_floor

        if finite:
            # Most clean steps only count (the rule's good += 1, nothing else moves); the scale
            # moves on the step that grows it. Keras's own optimizer branches alike. Both sides
            # are written out for the side already known: tf.cond is lowered to switch/merge, and
            # every node of the branch not taken still costs the executor a little each step.
            if track_floor:
                self.skips_at_floor.assign(tf.constant(0, tf.int64))
            growing = read(self.step_counter.value) + 1 >= self._rule.incr_every_n_steps

            def grow() -> None:
                self.dynamic_scale.assign(grown_scale(self._rule, read(self.dynamic_scale.value)))
                self.step_counter.assign(tf.constant(0, tf.int32))
                if track_bad:
                    self.bad_steps.assign(tf.constant(0, tf.int32))

            def count() -> None:
                self.step_counter.assign_add(1)

            tf.cond(growing, grow, count)
            return
        if not (track_bad or track_floor):
            # Back off on every overflow (the default): the rule's shrink side alone.
            self.dynamic_scale.assign(shrunk_scale(self._rule, read(self.dynamic_scale.value)))
            self.step_counter.assign(tf.constant(0, tf.int32))
            return
        at_floor = move()
        limit = self._rule.max_skipped_steps_at_floor
        if limit is None:
            return
        message = self._rule.stuck_message(self.overflow_mode.value)
        if tf.executing_eagerly():
            if int(at_floor) >= limit:
                raise tf.errors.InvalidArgumentError(None, None, message)
        else:
            tf.debugging.Assert(at_floor < limit, [message], name="loss_scale_stuck_guard")

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            dynamic=self.dynamic,
            overflow_mode=self._requested_mode,
            is_distributed=self.is_distributed,
            decr_every_n_nan_or_inf=self._rule.decr_every_n_nan_or_inf,
            decr_ratio=self._rule.decr_ratio,
            incr_ratio=self._rule.incr_ratio,
            min_loss_scale=self._rule.min_loss_scale,
            max_loss_scale=self._rule.max_loss_scale,
            max_skipped_steps_at_floor=self._rule.max_skipped_steps_at_floor,
        )
        return config
