"""`LossScaleOptimizer` for Keras 3: Keras's own wrapper with the NPU's decision and rule.

Keras's `keras.mixed_precision.LossScaleOptimizer` already has the right shape: it delegates
variables and slots to the inner optimizer, keeps its scale and step counter as optimizer
variables (so `model.save` carries them) and applies or skips through one `cond`. What differs
on an Ascend NPU is what counts as an overflow (saturation mode clamps instead of producing inf),
how the scale moves (the Ascend adapter's hysteresis, floor, ceiling and stuck-run guard), and
that every replica must take the same decision. So this class subclasses Keras's and replaces
exactly those three: the decision (`overflow.agreed_finite`), the rule (`tf.rule_ops`, the TF
managers' own), and the distributed apply, where the flag is summed before anyone branches.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.utils import tracking

from npu_lossscale.keras import scale_repair
from npu_lossscale.keras.checks import ARGUMENT_NAMES, extras_config, keras3_inner_error
from npu_lossscale.keras.overflow import agreed_finite, local_finite, unscale, unscale_and_check
from npu_lossscale.modes import OverflowMode, resolve_overflow_mode
from npu_lossscale.rule import DynamicRule, check_bool, check_optional_bool, manager_keywords
from npu_lossscale.tf import distributed
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager
from npu_lossscale.tf.rule_ops import grown_scale, next_rule_state, shrunk_scale

logger = logging.getLogger("npu_lossscale")

_WHO = "npu_lossscale.keras.LossScaleOptimizer"


def _check_inner(inner_optimizer: object) -> None:
    if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "inner_optimizer is already a loss-scale optimizer "
            f"({type(inner_optimizer).__module__}.{type(inner_optimizer).__name__}): wrapping it "
            "again would scale the loss twice while only the outer scale is divided out and "
            "moved. Wrap the plain optimizer once, e.g. LossScaleOptimizer(keras.optimizers.SGD())"
        )
    if isinstance(inner_optimizer, keras.optimizers.Optimizer):
        return
    raise ValueError(keras3_inner_error(inner_optimizer))


def _check_positional_order(initial_scale: object, kwargs: dict[str, Any]) -> None:
    """A bool where the scale goes is tf_keras 2's order, (inner, dynamic, initial_scale, ...);
    "dynamic" there, or a `loss_scale=` keyword, is TF 2.1-2.3's experimental class."""
    if (isinstance(initial_scale, str) and initial_scale == "dynamic") or "loss_scale" in kwargs:
        given = kwargs.get("loss_scale", initial_scale)
        raise ValueError(
            f"loss_scale={given!r} is TF 2.1-2.3's experimental LossScaleOptimizer(opt, "
            'loss_scale); here "dynamic" is the default (LossScaleOptimizer(opt)) and a number '
            "N is LossScaleOptimizer(opt, initial_scale=N, dynamic=False)"
        )
    if isinstance(initial_scale, bool):
        raise ValueError(
            f"initial_scale must be a number; got {initial_scale!r}. This looks like tf_keras 2's "
            "positional order LossScaleOptimizer(opt, dynamic, initial_scale, "
            "dynamic_growth_steps); npu_lossscale.keras takes Keras 3's order "
            "LossScaleOptimizer(inner_optimizer, initial_scale, dynamic_growth_steps) and "
            f"dynamic only by keyword: write LossScaleOptimizer(opt, dynamic={initial_scale!r}, "
            "initial_scale=...)"
        )


def _traced_graph() -> tf.Graph | None:
    """The function being traced (a FuncGraph), or None when running eagerly."""
    if tf.executing_eagerly():
        return None
    return tf.compat.v1.get_default_graph()


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
        _check_positional_order(initial_scale, kwargs)
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
            dynamic=dynamic,
            names=ARGUMENT_NAMES,
        )
        is_distributed = check_optional_bool("is_distributed", is_distributed)
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
        # True once get_unscaled_gradients ran (at trace time): from then on every gradient
        # apply_gradients receives is taken as unscaled, as tf_keras 2's optimizer takes them.
        # A per-optimizer fact, not a per-call one: the unscaling and the apply may be traced in
        # different tf.functions, threads (one per replica) or traces of one function.
        self._caller_unscales = False
        self._applied_scaled = False  # an apply divided by the scale itself (a warning's cue)
        self._warned_mixed = False  # the scale_loss-after-get_unscaled_gradients warning
        # traced functions that call scale_loss / get_unscaled_gradients themselves
        self._graphs_scaling: weakref.WeakSet = weakref.WeakSet()
        self._graphs_unscaling: weakref.WeakSet = weakref.WeakSet()
        self._create_rule_variables()

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
        if not isinstance(manager, (ExponentialUpdateLossScaleManager, FixedLossScaleManager)):
            raise ValueError(
                "manager must be an npu_lossscale FixedLossScaleManager or "
                f"ExponentialUpdateLossScaleManager; got {manager!r} (for Keras's own defaults "
                "leave it out: LossScaleOptimizer(inner_optimizer))"
            )
        if is_distributed is None and getattr(manager, "is_distributed", False):
            is_distributed = True
        if isinstance(manager, ExponentialUpdateLossScaleManager):
            rule = manager.rule
            with tf.init_scope():
                scale = float(manager.get_loss_scale())
        elif not manager.enable_overflow_check:
            raise ValueError(
                "manager: a FixedLossScaleManager with enable_overflow_check=False never skips "
                "a step; in Keras set loss_scale_factor on the inner optimizer instead"
            )
        else:
            rule, scale = None, manager._loss_scale_value
        return cls(
            inner_optimizer,
            scale,
            overflow_mode=manager.overflow_mode.value,
            is_distributed=is_distributed,
            **manager_keywords(rule, ARGUMENT_NAMES),
        )

    @tracking.no_automatic_dependency_tracking
    def _create_rule_variables(self) -> None:
        """The scale and the rule's counters, created with the optimizer, as Keras creates its
        ``iterations``: a tf.function that scales the loss before the first apply then reads the
        variable, not the initial scale frozen in as a constant.

        Keras's two variables come first, under Keras's names and dtypes (``step_counter``, the
        good-step count, is int64 as Keras's "int" is on TensorFlow), so a checkpoint written
        with keras.mixed_precision.LossScaleOptimizer restores into this class.
        """

        def counter(name: str) -> keras.Variable:
            return self.add_variable(
                shape=(), dtype="int64", initializer="zeros", aggregation="none", name=name
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
        self.skips_at_floor = counter("skips_at_floor")
        self._skipped = counter("skipped_steps")

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list: list[Any]) -> None:
        self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    # -- readable state ---------------------------------------------------------------------

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (tf_keras's name for it), a float32 scalar."""
        return tf.convert_to_tensor(self.dynamic_scale.value)

    @property
    def dynamic_counter(self) -> keras.Variable:
        """tf_keras's name: clean steps since the scale last changed."""
        return self.step_counter

    @property
    def skipped_steps(self) -> tf.Tensor:
        """int64 count of overflowed steps, i.e. steps the inner optimizer did not apply."""
        return tf.convert_to_tensor(self._skipped.value)

    # -- the tf_keras custom-loop spellings ----------------------------------------------------

    def scale_loss(self, loss: Any) -> Any:
        """``loss`` times the current scale: always the variable, which exists before build.

        Keras 3's name, which model.fit calls and whose gradients nobody unscales: once
        get_unscaled_gradients has made "the caller unscales" this optimizer's contract, those
        gradients would be applied still scaled, so that is said (once) where it can be seen.
        """
        graph = _traced_graph()
        if graph is not None:
            self._graphs_scaling.add(graph)
        elif self._caller_unscales and not self._warned_mixed:
            self._warned_mixed = True
            logger.warning(
                "npu_lossscale.keras.LossScaleOptimizer: scale_loss (which model.fit calls) "
                "is used eagerly on an optimizer whose get_unscaled_gradients was called "
                "before, so apply takes its gradients as unscaled: gradients that reach it "
                "without get_unscaled_gradients are applied still multiplied by the scale. Use "
                "one optimizer per kind of loop."
            )
        return self._scaled(loss)

    def _scaled(self, loss: Any) -> Any:
        return keras.ops.multiply(loss, self.dynamic_scale)

    def get_scaled_loss(self, loss: Any) -> Any:
        if callable(loss):
            return lambda: self._scaled(loss())
        return self._scaled(loss)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divide by the scale, as tf_keras did, and from now on take every gradient
        apply_gradients receives as unscaled (tf_keras's contract): it never divides again.

        Saturation is judged here, on the scaled values; a saturated element comes back as inf,
        so the inf/NaN check apply_gradients then runs finds it wherever the gradients went in
        between (another tf.function, a sum over micro-batches, a subset per apply).
        """
        if not self._caller_unscales and self._applied_scaled:
            logger.warning(
                "npu_lossscale.keras.LossScaleOptimizer: get_unscaled_gradients was called after "
                "this optimizer already applied scaled gradients (model.fit or a scale_loss "
                "loop). From now on apply_gradients takes its gradients as unscaled; a train "
                "function traced before still divides them. Use one optimizer per kind of loop."
            )
        self._caller_unscales = True
        graph = _traced_graph()
        if graph is not None:
            self._graphs_unscaling.add(graph)
        return unscale(list(grads), self.loss_scale, self.overflow_mode)

    # -- one step -----------------------------------------------------------------------------

    def _gradients_come_unscaled(self) -> bool:
        """Whether apply is handed gradients the caller divided already. Within one traced
        function its own calls decide: get_unscaled_gradients there means yes, scale_loss alone
        (model.fit's train step, a Keras 3 loop) means no; elsewhere (eager steps, an apply
        traced apart from the unscaling) the optimizer's sticky fact does."""
        graph = _traced_graph()
        if graph is not None and graph in self._graphs_unscaling:
            return True
        if graph is not None and graph in self._graphs_scaling:
            return False
        return self._caller_unscales

    def _tf_apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            raise ValueError("apply() must be called in a replica context.")
        grads_unscaled = self._gradients_come_unscaled()
        scale = tf.convert_to_tensor(self.dynamic_scale.value)
        self._applied_scaled = self._applied_scaled or not grads_unscaled
        if grads_unscaled:
            # They carry a saturated element as inf (see get_unscaled_gradients).
            finite = local_finite(grads, OverflowMode.INF_NAN)
        else:
            targets = (
                self._trainable_variables if trainable_variables is None else trainable_variables
            )
            divide = [not self._overwrite_variable_with_gradient(v) for v in targets]
            grads, finite = unscale_and_check(grads, divide, scale, self.overflow_mode)
        # A restored scale that cannot be used (0 or a denormal, which the check of the scaled
        # values lets through while unscaling makes NaN; below the floor; inf): the step is
        # skipped, and the rule's overflow side puts the scale back to the floor (scale_repair).
        finite = tf.logical_and(finite, scale_repair.usable(scale, self._rule.min_loss_scale))
        finite = agreed_finite(finite, self.is_distributed)
        context = distributed.strategy_replica_context()
        if context is None:
            self._apply_or_skip(finite, grads, trainable_variables)
            return
        self._check_created_in_scope(context.strategy)

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
                    self.inner_optimizer.apply, args=(grads, variables)
                )
                self._update_scale(finite=True)

            tf.cond(agreed, apply_on_every_replica, lambda: self._update_scale(finite=False))

        context.merge_call(cross_replica, args=(finite, grads, trainable_variables))

    def _check_created_in_scope(self, strategy: tf.distribute.Strategy) -> None:
        """Variables made outside the strategy's scope are one copy that every replica updates
        (the scale would move once per replica per step): refused with the way out."""
        if not strategy.extended.variable_created_in_scope(self.dynamic_scale.value):
            raise ValueError(
                "npu_lossscale.keras.LossScaleOptimizer was created outside the scope of the "
                f"{type(strategy).__name__} it now runs under, so its loss scale and counters are "
                "not replicated. Create the optimizer inside `with strategy.scope():`, as Keras "
                "asks for models and optimizers."
            )

    def _common_apply(self, grads: list[Any], trainable_variables: list[Any] | None = None) -> None:
        self._tf_apply(grads, trainable_variables)

    def _apply_or_skip(self, finite: tf.Tensor, grads: list[Any], variables: Any) -> None:
        def apply() -> None:
            self.inner_optimizer.apply(grads, trainable_variables=variables)
            self._update_scale(finite=True)

        tf.cond(finite, apply, lambda: self._update_scale(finite=False))

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

        stored = read(self.dynamic_scale.value)

        def repaired() -> tf.Tensor:
            # _tf_apply skips every step whose scale is unusable, so only this overflow side
            # can meet one: it goes back to the floor (scale_repair), with a warning.
            floor = self._rule.min_loss_scale
            return tf.cond(
                scale_repair.usable(stored, floor),
                lambda: tf.identity(stored),
                lambda: scale_repair.warn_and_reset(self.dynamic_scale, stored, floor, _WHO),
            )

        def move() -> tf.Tensor:
            scale, good, bad, at_floor = next_rule_state(
                self._rule,
                finite,
                repaired(),
                read(self.step_counter.value),
                read(self.bad_steps.value) if track_bad else tf.constant(0, tf.int64),
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
                self.dynamic_scale.assign(grown_scale(self._rule, stored))
                self.step_counter.assign(tf.constant(0, tf.int64))
                if track_bad:
                    self.bad_steps.assign(tf.constant(0, tf.int64))

            def count() -> None:
                self.step_counter.assign_add(tf.constant(1, tf.int64))

            tf.cond(growing, grow, count)
            return
        if not (track_bad or track_floor):
            # Back off on every overflow (the default): the rule's shrink side alone.
            self.dynamic_scale.assign(shrunk_scale(self._rule, repaired()))
            self.step_counter.assign(tf.constant(0, tf.int64))
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
            extras_config(
                dict(
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
            )
        )
        return config
