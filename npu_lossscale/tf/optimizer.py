"""NPULossScaleOptimizer: loss scaling around any tf.compat.v1 optimizer, skipping overflowed steps.

Positional signature and behaviour follow the Ascend adapter's class of the same name, so a ported
script reads like the vendor's guide. What it adds: both overflow modes decided exactly off the
chip as well as on it, readable state (``loss_scale``, ``skipped_steps``, ``last_step_applied``),
and the TF2 custom-loop pair ``get_scaled_loss`` / ``get_unscaled_gradients``.

Readable state (tensors/variables, fetch them with ``sess.run`` or read them eagerly):

* ``loss_scale``: the current loss scale (float32 scalar tensor), from the manager.
* ``skipped_steps``: int64 variable, steps not applied because their gradients overflowed.
* ``last_step_applied``: bool variable, whether the latest ``apply_gradients`` applied its step.

``tf.train.Checkpoint(optimizer=opt)`` saves all of it together with the inner optimizer's slots
and variables, eagerly and in graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import tensorflow as tf

from npu_lossscale.modes import OverflowMode
from npu_lossscale.rule import check_bool
from npu_lossscale.tf import distributed, foreign_manager, gating, overflow
from npu_lossscale.tf.managers import LossScaleManager

_GATE_OP = tf.compat.v1.train.Optimizer.GATE_OP


def _scale_loss(loss: Any, get_scale: Callable[[], tf.Tensor]) -> Any:
    """``loss`` times the scale; a callable loss (eager ``minimize``) is wrapped, not called."""
    if callable(loss):
        return lambda: _scale_loss(loss(), get_scale)
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(get_scale(), loss.dtype)


_KERAS_HINT = (
    "for Keras 3 (tf.keras in TF 2.16+) use npu_lossscale.keras.LossScaleOptimizer, a Keras "
    "optimizer with the same managers, rule and overflow modes "
    "(LossScaleOptimizer.from_manager(keras_optimizer, manager))"
)


def _is_keras(obj: object) -> bool:
    """A Keras 3 object, told by its class's module so this module never imports Keras."""
    return any(cls.__module__.split(".")[0] == "keras" for cls in type(obj).__mro__)


def _refuse_keras_variables(variables: Any) -> None:
    """TF1 optimizers cannot update Keras 3 variables: they fail deep inside TensorFlow
    ("'Variable' object has no attribute '_unique_id'"). Say so at once, with the way out."""
    if variables is None or callable(variables):
        return
    for variable in tf.nest.flatten(variables):
        if _is_keras(variable):
            raise TypeError(
                f"NPULossScaleOptimizer cannot train the Keras 3 variable {variable.path!r}: "
                f"{_KERAS_HINT}"
            )


class _ManagersFlag:
    """Default of is_distributed: take the manager's (False unless the manager was built with
    is_distributed=True). A sentinel rather than None so that None stays a mistake, as before."""

    def __repr__(self) -> str:
        return "<the loss scale manager's is_distributed>"


_MANAGERS_FLAG = _ManagersFlag()


def _manager_hint(given: object) -> str:
    """What a script that passed something else most likely meant."""
    if type(given).__module__.startswith("npu_lossscale.torch"):
        return " (that is npu_lossscale.torch's manager, for GradScaler; use npu_lossscale's)"
    if given == "dynamic":
        return (
            " (for a dynamic scale pass ExponentialUpdateLossScaleManager(init_loss_scale=2**15, "
            "incr_every_n_steps=2000), as TF's 'dynamic' loss scale did)"
        )
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        return f" (for a fixed scale pass FixedLossScaleManager({given!r}))"
    return ""


class NPULossScaleOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps ``opt``: scales the loss, unscales the gradients, applies only clean steps.

    ``compute_gradients`` returns *unscaled* gradients, so clipping between it and
    ``apply_gradients`` sees the true values; the overflow status is taken from the backward pass
    there and found again in ``apply_gradients`` even for clipped gradients. ``apply_gradients``
    runs the inner optimizer -- and with it the ``global_step`` increment -- only when the step
    did not overflow, and always lets the manager update the scale.

    Attributes the wrapper does not define are read from the inner optimizer, as the vendor's
    class does.
    """

    def __init__(
        self,
        opt: tf.compat.v1.train.Optimizer,
        loss_scale_manager: LossScaleManager,
        is_distributed: bool | _ManagersFlag = _MANAGERS_FLAG,
        *,
        reducer: Any = None,
        name: str = "NPULossScaleOptimizer",
    ) -> None:
        if not isinstance(opt, tf.compat.v1.train.Optimizer):
            hint = f"; {_KERAS_HINT}" if _is_keras(opt) else ""
            raise ValueError(
                "opt must be a tf.compat.v1.train.Optimizer (e.g. tf.compat.v1.train."
                f"AdamOptimizer); got {opt!r}{hint}"
            )
        if not foreign_manager.is_complete(loss_scale_manager):
            # npu_lossscale.torch's managers have contrib's two method names too, over torch
            # tensors: never a TF graph's manager.
            torch_manager = type(loss_scale_manager).__module__.startswith("npu_lossscale.torch")
            if torch_manager or not foreign_manager.follows_contrib_contract(loss_scale_manager):
                raise ValueError(
                    "loss_scale_manager must be an npu_lossscale FixedLossScaleManager or "
                    "ExponentialUpdateLossScaleManager, or a manager with tf.contrib's "
                    "get_loss_scale() and update_loss_scale(finite_grads); got "
                    f"{loss_scale_manager!r}{_manager_hint(loss_scale_manager)}"
                )
            # Written to tf.contrib's contract only, as the vendor's optimizer accepts.
            loss_scale_manager = foreign_manager.ContribContractManager(loss_scale_manager)
        # By default the manager's flag. The optimizer then reduces once and hands the manager
        # the agreed flag (update_with_agreed_flag), so the manager never reduces it again.
        if is_distributed is _MANAGERS_FLAG:
            is_distributed = loss_scale_manager.is_distributed
        is_distributed = check_bool("is_distributed", is_distributed)
        if reducer is not None:
            distributed.check_reducer_argument(reducer)
        super().__init__(use_locking=False, name=name)
        self._opt = opt
        self._loss_scale_manager = loss_scale_manager
        self._is_distributed = is_distributed
        self._reducer = reducer
        self._stash = overflow.StatusStash()
        with tf.init_scope():
            self._last_step_applied = tf.compat.v1.Variable(
                True,
                dtype=tf.bool,
                trainable=False,
                name="last_step_applied",
                use_resource=True,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        # Checkpoint layout: the inner optimizer (with its slots, see __dir__) under
        # "base_optimizer", as TF's own MixedPrecisionLossScaleOptimizer has it; the manager's
        # state under "loss_scale_manager"; the latest step's outcome under "last_step_applied".
        self._track_trackable(opt, "base_optimizer")
        self._track_trackable(loss_scale_manager, "loss_scale_manager")
        self._track_trackable(self._last_step_applied, "last_step_applied")

    def __getattr__(self, attr: str) -> Any:
        # Only reached for attributes not found normally. Guard the names looked up before
        # __init__ has run (copy, pickle) and the tracking machinery's own, or this recurses.
        if attr.startswith("__") or attr.startswith("_self_") or attr == "_opt":
            raise AttributeError(attr)
        inner = self.__dict__.get("_opt")
        if inner is None:
            raise AttributeError(attr)
        return getattr(inner, attr)

    def __dir__(self) -> list[str]:
        # tf.train.Checkpoint takes every tracked object whose dir() lists "get_slot_names" for a
        # slot owner (tensorflow/python/checkpoint/util.py, serialize_slot_variables) and refuses
        # a slot variable that two owners return. get_slot_names and get_slot answer for the inner
        # optimizer (the vendor's API), whose slots the checkpoint already records under
        # "base_optimizer"; leaving the name out of dir() says the wrapper owns no slots of its
        # own, while the method stays callable.
        return [name for name in super().__dir__() if name != "get_slot_names"]

    # ----- readable state ---------------------------------------------------------------------

    @property
    def loss_scale_manager(self) -> LossScaleManager:
        return self._loss_scale_manager

    @property
    def inner_optimizer(self) -> tf.compat.v1.train.Optimizer:
        return self._opt

    @property
    def loss_scale(self) -> tf.Tensor:
        """Current loss scale, float32 scalar tensor."""
        return self._loss_scale_manager.get_loss_scale()

    @property
    def skipped_steps(self) -> tf.Variable:
        """int64 variable: steps skipped because their gradients overflowed."""
        return self._loss_scale_manager.skipped_steps

    @property
    def last_step_applied(self) -> tf.Variable:
        """bool variable: True iff the latest apply_gradients applied its step."""
        return self._last_step_applied

    def get_loss_scale(self) -> tf.Tensor:
        """Same as ``loss_scale``; the vendor FAQ reads the scale through this name."""
        return self.loss_scale

    # ----- gradients --------------------------------------------------------------------------

    def get_scaled_loss(self, loss: Any) -> Any:
        """``loss`` times the current loss scale (a callable is wrapped), for a GradientTape."""
        return _scale_loss(loss, self._loss_scale_manager.get_loss_scale)

    def get_unscaled_gradients(self, grads: Sequence[Any]) -> list[Any]:
        """Divide tape gradients of a scaled loss by the scale, noting their overflow status."""
        grads = list(grads)
        return self._unscale_and_stash(grads, self._loss_scale_manager.get_loss_scale())

    def compute_gradients(
        self,
        loss: Any,
        var_list: Any = None,
        gate_gradients: int = _GATE_OP,
        aggregation_method: Any = None,
        colocate_gradients_with_ops: bool = False,
        grad_loss: Any = None,
    ) -> list[tuple[Any, tf.Variable]]:
        """Gradients of ``loss * scale`` divided by the scale: true values, None kept as None."""
        _refuse_keras_variables(var_list)
        scale = self._loss_scale_manager.get_loss_scale()
        hardware = None if callable(loss) else self._hardware_float_status()
        scaled_loss = _scale_loss(loss, lambda: scale)
        if hardware is not None:
            with tf.control_dependencies([hardware.start()]):
                scaled_loss = tf.identity(scaled_loss)
        grads_and_vars = self._opt.compute_gradients(
            scaled_loss,
            var_list=var_list,
            gate_gradients=gate_gradients,
            aggregation_method=aggregation_method,
            colocate_gradients_with_ops=colocate_gradients_with_ops,
            grad_loss=grad_loss,
        )
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        unscaled = self._unscale_and_stash(grads, scale, hardware)
        return list(zip(unscaled, variables))

    def _hardware_float_status(self) -> overflow.HardwareFloatStatus | None:
        """The chip's own overflow register, used in saturation mode on an Ascend host only."""
        manager = self._loss_scale_manager
        if (
            not manager.enable_overflow_check
            or manager.overflow_mode is not OverflowMode.SATURATION
            or tf.executing_eagerly()
        ):
            return None
        gen_ops = overflow.npu_float_status_ops()
        return None if gen_ops is None else overflow.HardwareFloatStatus(gen_ops)

    def _unscale_and_stash(
        self,
        grads: list[Any],
        scale: tf.Tensor,
        hardware: overflow.HardwareFloatStatus | None = None,
    ) -> list[Any]:
        manager = self._loss_scale_manager
        if not manager.enable_overflow_check:
            return overflow.unscale(grads, scale)
        if hardware is not None:
            unscaled = overflow.unscale(grads, scale)
            status = hardware.status(grads)
        else:
            # One pass over each gradient: unscale and check together (fused op where it builds).
            unscaled, status = overflow.unscale_with_status(grads, scale, manager.overflow_mode)
        self._stash.put(unscaled, status)
        return unscaled

    # ----- applying ---------------------------------------------------------------------------

    def _local_overflow(self, grads: Sequence[Any]) -> tf.Tensor:
        """float32 scalar, > 0 iff this worker's backward pass (or the given grads) overflowed.

        Gradients returned by compute_gradients / get_unscaled_gradients carry the status of
        their backward pass. Tensors derived from them (clipped, averaged) are additionally
        checked for inf/NaN, which is all that can go wrong after the backward pass; gradients
        of unknown origin are checked under the manager's mode.
        """
        manager = self._loss_scale_manager
        if not manager.enable_overflow_check:
            return tf.constant(0.0, tf.float32)
        found = self._stash.find(grads)
        parts = list(found.statuses)
        if found.derived or found.foreign:
            scale = manager.get_loss_scale()
            if found.derived:
                parts.append(overflow.overflow_status(found.derived, OverflowMode.INF_NAN, scale))
            if found.foreign:
                parts.append(overflow.overflow_status(found.foreign, manager.overflow_mode, scale))
        if not parts:
            return tf.constant(0.0, tf.float32)
        return parts[0] if len(parts) == 1 else tf.add_n(parts)

    def _apply_if_clean(self, overflow_status: Any, apply_fn: Callable[[], Any]) -> Any:
        """Apply (``apply_fn``) only when ``overflow_status`` is 0; update scale and state."""
        status = tf.convert_to_tensor(overflow_status, dtype=tf.float32)
        # NaN != 0, so a NaN status (e.g. from a sum over workers) counts as an overflow.
        finite = tf.equal(status, 0.0)
        if self._loss_scale_manager.enable_overflow_check:
            applied = gating.apply_if(finite, apply_fn)
        else:
            # The vendor's enable_overflow_check=False: every step is applied.
            applied = apply_fn()
            finite = tf.constant(True)
        update = self._loss_scale_manager.update_with_agreed_flag(finite)
        record = self._last_step_applied.assign(finite)
        if tf.executing_eagerly():
            return None
        return tf.group(*[op for op in (applied, update, record) if op is not None])

    def apply_gradients(
        self,
        grads_and_vars: Sequence[tuple[Any, tf.Variable]],
        global_step: tf.Variable | None = None,
        name: str | None = None,
    ) -> Any:
        """Apply the gradients (and increment ``global_step``) only if the step is clean."""
        grads_and_vars = tuple(grads_and_vars)
        _refuse_keras_variables([v for _, v in grads_and_vars])
        if tf.executing_eagerly():
            return self._apply(grads_and_vars, global_step, name)
        # Every TF1 optimizer lists its train op in the TRAIN_OP collection, which is how a graph
        # resumed with import_meta_graph finds it again. The inner optimizer has listed its own
        # by now: gated, but without the scale update, so a resumed run would never change its
        # scale. The wrapper's op, the whole step, takes its place.
        listed = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        before = list(listed)
        train_op = self._apply(grads_and_vars, global_step, name)
        op = train_op.op if isinstance(train_op, tf.Tensor) else train_op
        listed[:] = [entry for entry in listed if any(entry is b for b in before)]
        if isinstance(op, tf.Operation) and not any(entry is op for entry in listed):
            listed.append(op)
        return train_op

    def _apply(
        self,
        grads_and_vars: tuple[tuple[Any, tf.Variable], ...],
        global_step: tf.Variable | None,
        name: str | None,
    ) -> Any:
        # Inside a strategy's replica function the decision has to be taken in cross-replica
        # context even for is_distributed=False (one replica), so that path goes there too.
        if self._is_distributed or distributed.in_strategy_replica_context():
            return distributed.apply_distributed(self, grads_and_vars, global_step, name)
        overflow_status = self._local_overflow([g for g, _ in grads_and_vars])
        return self._apply_if_clean(
            overflow_status, lambda: self._opt.apply_gradients(grads_and_vars, global_step, name)
        )

    # ----- the inner optimizer's bookkeeping --------------------------------------------------

    def get_slot(self, var: tf.Variable, name: str) -> tf.Variable | None:
        """The inner optimizer's slot: the wrapper has none of its own (see ``__dir__``)."""
        return self._opt.get_slot(var, name)

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's slot names: the wrapper has none of its own."""
        return self._opt.get_slot_names()

    def variables(self) -> list[tf.Variable]:
        """The inner optimizer's variables, the manager's and ``last_step_applied``."""
        return (
            list(self._opt.variables())
            + list(self._loss_scale_manager.variables)
            + [self._last_step_applied]
        )
