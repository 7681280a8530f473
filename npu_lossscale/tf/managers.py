"""Loss-scale managers: hold the loss scale and decide how it moves after each training step.

Names and positional signatures follow the Ascend TensorFlow adapter (and
tf.contrib.mixed_precision before it), and so does what a script can reach by name: the scale as
the float tensor 'loss_scale:0', the counters as the variables good_steps and bad_steps. Every
extra is keyword-only and off by default. The rule itself, on tensors, is ``rule_ops``'s, which
the Keras optimizers share.
"""

from __future__ import annotations

import abc
import logging
import sys
from typing import Callable

import tensorflow as tf

from npu_lossscale.modes import OverflowMode, resolve_overflow_mode
from npu_lossscale.rule import DynamicRule, check_bool, check_scale
from npu_lossscale.tf import distributed, gating, kernels, rule_ops

# Graph names. 'loss_scale:0' is what the vendor FAQ's logging hook (and NVIDIA's BERT) fetches,
# and there it is a float: tf.contrib's scale was a reference variable of that name. Ours is a
# resource variable, whose own op yields a handle, so the variable takes TensorFlow's name for it
# (tf.train.experimental.DynamicLossScale's) and a read of it takes the name "loss_scale".
# "good_steps" and "bad_steps" (int32) are tf.contrib's names, kept so that a checkpoint written by
# the original GPU script maps onto the ported one name for name, the scale aside.
SCALE_TENSOR_NAME = "loss_scale"
SCALE_VAR_NAME = "current_loss_scale"
GOOD_STEPS_VAR_NAME = "good_steps"
BAD_STEPS_VAR_NAME = "bad_steps"
SKIPPED_STEPS_VAR_NAME = "loss_scale_skipped_steps"
FLOOR_SKIPS_VAR_NAME = "loss_scale_skips_at_floor"

logger = logging.getLogger("npu_lossscale")


def state_variable(initial_value: object, dtype: tf.DType, name: str) -> tf.Variable:
    """Create a non-trainable resource variable that is safe wherever the manager is built.

    tf.init_scope drops any enclosing tf.control_dependencies (the vendor warns that building the
    manager inside one misorders the graph) and lifts creation out of a tf.function. Resource
    variables, not TF1 reference variables, because TF2's functional tf.cond/while_loop (used
    in tf.compat.v1 graphs too) cannot assign to reference variables inside a branch, and on
    Ascend the train op usually runs inside such a loop (iterations_per_loop). Asked for
    explicitly, since TF 1.15's graphs (and ``disable_resource_variables()``) default to
    reference variables.
    """
    with tf.init_scope():
        variable = tf.compat.v1.Variable(
            initial_value,
            dtype=dtype,
            trainable=False,
            name=name,
            use_resource=True,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    return variable


def _scale_tensor_for_fetching(
    scale: Callable[[], tf.Tensor] | float,
) -> tf.Tensor | None:
    """In a graph, the scale's value under the name 'loss_scale:0' that vendor scripts fetch.

    Built once, at the top level of the graph the state lives in, and returned by get_loss_scale
    wherever that is equivalent (_reusable_here), so the step's loss scaling and unscaling use
    this very read: fetched alongside a train op built there, it is the scale that step used.
    A read costs nothing unless something runs it. None when running eagerly (no names to
    fetch by, and an eager read is a value, not an op to reuse). ``scale`` is the fixed
    manager's value or the dynamic manager's read of its variable.
    """
    with tf.init_scope():
        if tf.executing_eagerly():
            return None
        if isinstance(scale, float):
            return tf.constant(scale, dtype=tf.float32, name=SCALE_TENSOR_NAME)
        return tf.identity(scale(), name=SCALE_TENSOR_NAME)


def _reusable_here(shared: tf.Tensor | None) -> bool:
    """Whether ops built now may use ``shared``, a top-level read of the scale, as their read.

    tf.contrib's get_loss_scale returned its variable, so scripts call it freely, the vendor's
    guide once per training step; a new read op per call grows the graph every step and fails
    once MonitoredTrainingSession has finalized it. The shared read is only equivalent to a new
    one at the top level of the same classic graph. A v1 while_loop body, or a function graph
    (tf.function, TF2 cond and while bodies), would take it as an input computed once outside,
    stale after the first iteration; a replica under a distribution strategy reads its own copy
    of the variable; and under tf.control_dependencies a new read would wait for them, where
    the shared one does not.
    """
    if shared is None or not gating.classic_graph():
        return False
    graph = tf.compat.v1.get_default_graph()
    return graph is shared.graph and not graph._current_control_dependencies()


def _below_floor_message(scale: object, floor: float) -> str:
    return (
        f"npu_lossscale: the restored loss scale {scale} is below min_loss_scale ({floor:g}), "
        "as a scale becomes after a NaN storm in a tool without a floor; training goes on "
        f"from the floor, {floor:g}"
    )


class LossScaleManager(tf.Module, abc.ABC):
    """Common base: a loss scale to multiply the loss by, and a hook called once per step.

    A tf.Module so that tf.train.Checkpoint tracks the state; in graph mode the variables are also
    in GLOBAL_VARIABLES so tf.compat.v1.train.Saver saves them.
    """

    overflow_mode: OverflowMode
    enable_overflow_check: bool

    def __init__(self, overflow_mode: OverflowMode | str, is_distributed: object = False) -> None:
        super().__init__(name=type(self).__name__)
        self.is_distributed = check_bool("is_distributed", is_distributed)
        self.overflow_mode = resolve_overflow_mode(overflow_mode)
        self._skipped_steps = state_variable(0, tf.int64, SKIPPED_STEPS_VAR_NAME)

    @abc.abstractmethod
    def get_loss_scale(self) -> tf.Tensor:
        """The current loss scale, a float32 scalar tensor."""

    def __call__(self) -> tf.Tensor:
        """The current loss scale, as TensorFlow's LossScale objects give it when called: scripts
        log `loss_scaler()` (NVIDIA's BERT does), and a ported one must keep working."""
        return self.get_loss_scale()

    def update_loss_scale(self, finite_grads: tf.Tensor | bool) -> tf.Operation | None:
        """Record one step whose gradients were finite or not, as a script driving the manager
        itself reports it (the vendor FAQ's loop). With ``is_distributed`` the flag is summed
        over all workers first (tf.distribute, Horovod or HCCL, as the optimizer does), so every
        worker moves its scale the same way.

        Graph mode returns the op to run with the train op; eagerly the update happens now.
        """
        finite = _as_finite_flag(finite_grads)
        if self.is_distributed:
            overflowed = tf.cast(tf.logical_not(finite), tf.float32)
            summed = distributed.resolve_reducer(None).all_reduce_sum(overflowed)
            finite = tf.equal(summed, 0.0)
        return self.update_with_agreed_flag(finite)

    def update_with_agreed_flag(self, finite: tf.Tensor) -> tf.Operation | None:
        """Record one step whose flag every worker already agrees on (never reduced again):
        what NPULossScaleOptimizer calls after its own reduction.

        Ours override it. A subclass written to tf.contrib's contract overrides only
        ``update_loss_scale``, which then gets the agreed flag.
        """
        if type(self).update_loss_scale is LossScaleManager.update_loss_scale:
            raise NotImplementedError(
                f"{type(self).__name__} must implement update_loss_scale(finite_grads) "
                "(tf.contrib's contract) or update_with_agreed_flag(finite)"
            )
        return self.update_loss_scale(finite)

    @property
    def skipped_steps(self) -> tf.Variable:
        """int64 count of steps reported as overflowed, i.e. not applied by the optimizer."""
        return self._skipped_steps

    @property
    def variables(self) -> list[tf.Variable]:
        return [self._skipped_steps]

    def _count_skip(self, finite: tf.Tensor) -> tf.Tensor:
        """New value of the skipped-step counter (not yet assigned)."""
        return self._skipped_steps.read_value() + tf.cast(tf.logical_not(finite), tf.int64)


def _as_finite_flag(finite_grads: tf.Tensor | bool) -> tf.Tensor:
    flag = tf.convert_to_tensor(finite_grads)
    if flag.dtype != tf.bool:
        raise ValueError(f"finite_grads must be a boolean scalar; got dtype {flag.dtype.name}")
    return tf.reshape(flag, [])


class FixedLossScaleManager(LossScaleManager):
    """Constant loss scale; overflowed steps are still skipped (and counted) when checked.

    The scale is a constant, not a variable, on purpose: a restored checkpoint must not override
    a loss_scale the user has just changed on the command line.
    """

    def __init__(
        self,
        loss_scale: float,
        enable_overflow_check: bool = True,
        *,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool = False,
    ) -> None:
        self._loss_scale_value = check_scale("loss_scale", loss_scale)
        check_overflow = check_bool("enable_overflow_check", enable_overflow_check)
        super().__init__(overflow_mode, is_distributed)
        self.enable_overflow_check = check_overflow
        self._graph_scale = _scale_tensor_for_fetching(self._loss_scale_value)

    def get_loss_scale(self) -> tf.Tensor:
        if _reusable_here(self._graph_scale):
            return self._graph_scale
        return tf.constant(self._loss_scale_value, dtype=tf.float32)

    def get_enable_overflow_check(self) -> bool:
        """Whether overflowed steps are skipped, under the Ascend adapter's name for it."""
        return self.enable_overflow_check

    def update_with_agreed_flag(self, finite: tf.Tensor) -> tf.Operation | None:
        finite = _as_finite_flag(finite)
        return tf.group(self._skipped_steps.assign(self._count_skip(finite)))


class ExponentialUpdateLossScaleManager(LossScaleManager):
    """Dynamic loss scale: shrink after overflows, grow after a run of clean steps.

    The update is branch-free (tf.where plus one assign per variable) because it runs every step;
    it works in TF1 graphs, eagerly and inside tf.function. max_loss_scale clamps increases to
    the cap (the scale reaches it exactly) rather than refusing the step that would pass it.

    max_skipped_steps_at_floor turns a silently stuck run into an error: when that many
    consecutive steps overflow even at min_loss_scale, lowering the scale cannot help, so the
    cause is NaN/inf in the data or model, or a diverging learning rate.
    """

    def __init__(
        self,
        init_loss_scale: float,
        incr_every_n_steps: int,
        decr_every_n_nan_or_inf: int = 2,
        incr_ratio: float = 2,
        decr_ratio: float = 0.8,
        *,
        overflow_mode: OverflowMode | str = "auto",
        is_distributed: bool = False,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        max_skipped_steps_at_floor: int | None = None,
    ) -> None:
        init, self._rule = DynamicRule.validated(
            init_loss_scale,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            incr_ratio,
            decr_ratio,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            max_skipped_steps_at_floor=max_skipped_steps_at_floor,
        )
        super().__init__(overflow_mode, is_distributed)
        self.enable_overflow_check = True
        self._loss_scale = state_variable(init, tf.float32, SCALE_VAR_NAME)
        self._good_steps = state_variable(0, tf.int32, GOOD_STEPS_VAR_NAME)
        self._bad_steps = state_variable(0, tf.int32, BAD_STEPS_VAR_NAME)
        self._skips_at_floor = state_variable(0, tf.int64, FLOOR_SKIPS_VAR_NAME)
        self._graph_scale = _scale_tensor_for_fetching(self._scale_read)

    @property
    def variables(self) -> list[tf.Variable]:
        return [
            self._loss_scale,
            self._good_steps,
            self._bad_steps,
            self._skipped_steps,
            self._skips_at_floor,
        ]

    @property
    def rule(self) -> DynamicRule:
        """The validated update rule (what the Keras front-end's from_manager takes over)."""
        return self._rule

    @property
    def min_loss_scale(self) -> float:
        return self._rule.min_loss_scale

    @property
    def max_loss_scale(self) -> float | None:
        return self._rule.max_loss_scale

    def get_loss_scale(self) -> tf.Tensor:
        """The scale; in a TF1 graph one read per graph where that is safe (_reusable_here).

        Sharing that read between the loss scaling, the unscaling and any fetch is sound: all
        of them run before this step's update, which reads and writes the variable itself and
        is ordered after them through the overflow flag, so they all see the same value. A
        restored checkpoint is seen too: the read reads the variable every time it runs.
        """
        if _reusable_here(self._graph_scale):
            return self._graph_scale
        return self._scale_read()

    def _scale_read(self) -> tf.Tensor:
        """The scale variable's value, raised to min_loss_scale where it is below (or NaN).

        The rule never takes the scale below the floor, but a checkpoint can: another tool's
        scale that collapsed to 0 after a NaN storm, or 1e-40. Scaling by it would poison the
        weights (1/0 and 1/1e-40 are inf in float32) and a scale of 1e-30 would take years of
        clean steps to grow back, so such a value counts as the floor -- this step's loss is
        scaled by the floor, the update stores the rule's next value from there -- and a
        warning says so (``_restored_scale_warning``). A read op, not a one-off fix at restore
        time, because a TF1 Saver restores by running assign ops nothing else sees.
        """
        raw = self._loss_scale.read_value()
        floor = tf.constant(self._rule.min_loss_scale, tf.float32)
        if tf.executing_eagerly() and not bool(raw >= floor):
            logger.warning(_below_floor_message(float(raw), self._rule.min_loss_scale))
        # NaN compares False, so a NaN scale is replaced too.
        return tf.where(raw >= floor, raw, floor)

    def _restored_scale_warning(self) -> tf.Operation | None:
        """In a graph, an op that prints the warning on a step that found the variable below
        the floor (eagerly ``_scale_read`` logs it)."""
        if tf.executing_eagerly():
            return None
        raw = self._loss_scale.read_value()
        floor = self._rule.min_loss_scale

        def warn() -> tf.Operation:
            return tf.print(_below_floor_message("", floor), raw, output_stream=sys.stderr)

        return tf.cond(raw >= floor, tf.no_op, warn)

    def update_with_agreed_flag(self, finite: tf.Tensor) -> tf.Operation | None:
        finite = _as_finite_flag(finite)
        ops = kernels.fused_ops() if gating.classic_graph() else None
        # Reads the variable before this step's update writes it (see _scale_read).
        warning = self._restored_scale_warning()
        if ops is not None:
            # One graph node instead of about forty (kernels/loss_scale_update.cc), same result,
            # including the floor for a scale restored below it.
            with tf.control_dependencies([] if warning is None else [warning]):
                new_at_floor = rule_ops.fused_update(
                    ops,
                    self._rule,
                    finite,
                    loss_scale=self._loss_scale,
                    good_steps=self._good_steps,
                    bad_steps=self._bad_steps,
                    skipped_steps=self._skipped_steps,
                    skips_at_floor=self._skips_at_floor,
                )
            guard = self._stuck_guard(new_at_floor)
            return tf.group(new_at_floor.op, *([] if guard is None else [guard]))
        # Read every variable once; all assigns wait for all new values so no read sees a write.
        new_scale, new_good, new_bad, new_at_floor = rule_ops.next_rule_state(
            self._rule,
            finite,
            self._scale_read(),
            self._good_steps.read_value(),
            self._bad_steps.read_value(),
            self._skips_at_floor.read_value(),
        )
        new_skipped = self._count_skip(finite)

        new_values = [new_scale, new_good, new_bad, new_at_floor, new_skipped]
        with tf.control_dependencies(new_values + ([] if warning is None else [warning])):
            updates = [
                self._loss_scale.assign(new_scale),
                self._good_steps.assign(new_good),
                self._bad_steps.assign(new_bad),
                self._skips_at_floor.assign(new_at_floor),
                self._skipped_steps.assign(new_skipped),
            ]
        guard = self._stuck_guard(new_at_floor)
        if guard is not None:
            updates.append(guard)
        return tf.group(*updates)

    def _stuck_message(self) -> str:
        return self._rule.stuck_message(self.overflow_mode.value)

    def _stuck_guard(self, new_at_floor: tf.Tensor) -> tf.Operation | None:
        limit = self._rule.max_skipped_steps_at_floor
        if limit is None:
            return None
        if tf.executing_eagerly():
            if int(new_at_floor.numpy()) >= limit:
                raise tf.errors.InvalidArgumentError(None, None, self._stuck_message())
            return None
        return tf.debugging.Assert(
            new_at_floor < limit, [self._stuck_message()], name="loss_scale_stuck_guard"
        )
