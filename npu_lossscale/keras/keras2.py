"""`LossScaleOptimizer` for Keras 2 (TF 2.6-2.15's ``tf.keras``, ``tf_keras``): Keras 2's own
class with the NPU's decision and rule.

Keras 2's ``LossScaleOptimizer`` already does what a Keras 2 script relies on: the signature
``(inner_optimizer, dynamic, initial_scale, dynamic_growth_steps)``, hyperparameters delegated to
the inner optimizer, ``minimize``/``get_gradients`` scaling and unscaling, gradients aggregated
across replicas before the decision, ``iterations`` advancing on a skipped step, checkpoints that
carry the scale. So these classes subclass it (both of tf_keras's: one for the classic
``optimizers.legacy`` optimizers, one for the newer ones) and change only what differs on an
Ascend NPU: the state object that decides and moves the scale (``keras2_state``), the unscaling
that turns a saturated element into inf (``overflow.unscale_with_statuses``: the fused CPU op where
it is built, whose per-gradient verdicts the state then reuses), and the keyword-only extras.
"""

from __future__ import annotations

import importlib
from typing import Any

import tensorflow as tf

from npu_lossscale.keras import keras2_state
from npu_lossscale.keras.checks import ARGUMENT_NAMES, check_keras2_inner, extras_config
from npu_lossscale.keras.overflow import unscale_with_statuses
from npu_lossscale.keras.select import keras2
from npu_lossscale.modes import OverflowMode, resolve_overflow_mode
from npu_lossscale.rule import DynamicRule, check_optional_bool, manager_keywords
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager

_keras = keras2()
_stock = importlib.import_module(_keras.mixed_precision.LossScaleOptimizer.__module__)
_State = keras2_state.state_class(_stock._DynamicLossScaleState)
_DEFAULT_INITIAL_SCALE = 2.0**15
_DEFAULT_GROWTH_STEPS = 2000
_no_tracking = tf.__internal__.tracking.no_automatic_dependency_tracking


def _whole(value: object) -> object:
    """Keras 2 takes ``dynamic_growth_steps=2.0`` (it calls int() on it): so does this class."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class _NPULossScaling:
    """What our Keras 2 classes add to Keras 2's: placed first in their bases."""

    def __init__(
        self,
        inner_optimizer: Any,
        dynamic: bool = True,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        *,
        overflow_mode: Any = "auto",
        is_distributed: bool | None = None,
        decr_every_n_nan_or_inf: int = 1,
        decr_ratio: float = 0.5,
        incr_ratio: float = 2.0,
        min_loss_scale: float = 1.0,
        max_loss_scale: float | None = None,
        max_skipped_steps_at_floor: int | None = None,
    ) -> None:
        check_keras2_inner(inner_optimizer, _keras)
        if not isinstance(dynamic, bool):
            # Keras 2's own check and type: TF 2.3's LossScaleOptimizer(opt, "dynamic") and
            # LossScaleOptimizer(opt, 128) land here.
            raise TypeError(
                '"dynamic" argument to LossScaleOptimizer.__init__ must be a bool, but got: '
                f"{dynamic!r} (TF 2.3's LossScaleOptimizer(opt, loss_scale) is "
                "LossScaleOptimizer(opt) for 'dynamic' and LossScaleOptimizer(opt, dynamic=False, "
                "initial_scale=N) for a number)"
            )
        if not dynamic and initial_scale is None:
            raise ValueError('"initial_scale" must be specified if "dynamic" is False')
        if not dynamic and dynamic_growth_steps is not None:
            raise ValueError(
                '"dynamic_growth_steps" must be None if "dynamic" is False, but got: '
                f"{dynamic_growth_steps}"
            )
        init, rule = DynamicRule.validated(
            _DEFAULT_INITIAL_SCALE if initial_scale is None else _whole(initial_scale),
            _DEFAULT_GROWTH_STEPS if dynamic_growth_steps is None else _whole(dynamic_growth_steps),
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
        # Keras 2's constructor checks nesting, double wrapping and the strategy, and sets up the
        # delegation; asked for a fixed scale it creates no state of its own, which ours replaces.
        super().__init__(inner_optimizer, False, init, None)  # type: ignore[call-arg]
        self._set_up(_State(init, rule, dynamic, is_distributed), requested_mode)

    @_no_tracking
    def _set_up(self, state: Any, requested_mode: str) -> None:
        """Our attributes, set as Keras 2 sets its own (no automatic checkpoint dependencies:
        the state is tracked under Keras 2's name, "loss_scale", and only when dynamic)."""
        self._rule = state.rule
        self._requested_mode = requested_mode
        self.overflow_mode = resolve_overflow_mode(requested_mode)
        state.overflow_mode_name = self.overflow_mode.value
        self._loss_scale = state
        if state.dynamic:
            self._track_trackable(state, "loss_scale")

    # -- Keras 2's readable state, from our state object -------------------------------------

    @property
    def dynamic(self) -> bool:
        return self._loss_scale.dynamic

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale, a float32 scalar tensor."""
        return self._loss_scale()

    @property
    def dynamic_counter(self) -> tf.Variable | None:
        return self._loss_scale.counter if self.dynamic else None

    @property
    def initial_scale(self) -> float:
        return self._loss_scale.initial_loss_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        return self._loss_scale.growth_steps if self.dynamic else None

    @property
    def is_distributed(self) -> bool | None:
        return self._loss_scale.is_distributed

    @property
    def skipped_steps(self) -> tf.Tensor:
        """int64 count of overflowed steps, i.e. steps the inner optimizer did not apply."""
        return tf.convert_to_tensor(self._loss_scale.skipped)

    def get_unscaled_gradients(self, grads: Any) -> list:
        """Divide by the scale; in SATURATION mode an element whose scaled magnitude reached
        65504 comes back as inf, so the inf/NaN check in apply_gradients finds it wherever the
        gradients went in between."""
        self._gradients_have_been_unscaled = True  # tf_keras's warning bookkeeping
        scale = self.loss_scale
        unscaled, statuses = unscale_with_statuses(list(grads), scale, self.overflow_mode)
        self._loss_scale.remember(unscaled, statuses, scale)
        return unscaled

    def get_config(self) -> dict:
        config = super().get_config()  # type: ignore[misc]
        rule = self._rule
        config.update(
            extras_config(
                dict(
                    overflow_mode=self._requested_mode,
                    is_distributed=self.is_distributed,
                    decr_every_n_nan_or_inf=rule.decr_every_n_nan_or_inf,
                    decr_ratio=rule.decr_ratio,
                    incr_ratio=rule.incr_ratio,
                    min_loss_scale=rule.min_loss_scale,
                    max_loss_scale=rule.max_loss_scale,
                    max_skipped_steps_at_floor=rule.max_skipped_steps_at_floor,
                )
            )
        )
        return config

    @classmethod
    def from_manager(
        cls,
        inner_optimizer: Any,
        manager: Any,
        *,
        is_distributed: bool | None = None,
    ) -> Any:
        """The optimizer a ported TF1 script gets: the manager's scale, rule and overflow mode
        (read once, eagerly; the optimizer's own variables hold the state from then on)."""
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
                scale = float(tf.keras.backend.get_value(manager.get_loss_scale()))
        elif not manager.enable_overflow_check:
            raise ValueError(
                "manager: a FixedLossScaleManager with enable_overflow_check=False never skips "
                "a step, which this optimizer always does on overflow; scale the loss yourself "
                "with the plain optimizer instead"
            )
        else:
            rule, scale = None, manager._loss_scale_value
        return cls(
            inner_optimizer,
            initial_scale=scale,
            overflow_mode=manager.overflow_mode.value,
            is_distributed=is_distributed,
            **manager_keywords(rule, ARGUMENT_NAMES),
        )


_DOC = """Dynamic (or fixed) loss scaling for Keras 2 with the NPU's overflow modes.

    Drop-in for Keras 2's ``tf.keras.mixed_precision.LossScaleOptimizer`` (TF 2.6.5, tf_keras):
    ``LossScaleOptimizer(inner_optimizer, dynamic=True, initial_scale=None,
    dynamic_growth_steps=None)``, ``get_scaled_loss``/``get_unscaled_gradients``, ``loss_scale``,
    ``dynamic_counter``, hyperparameters delegated to the inner optimizer, ``minimize``. Keras 2's
    behaviour where ours does not say otherwise: ``iterations`` advances on a skipped step.
    Differences: an overflowed step is skipped with ``dynamic=False`` too; the overflow check
    follows ``overflow_mode``; the scale never falls below ``min_loss_scale``. Keyword-only
    extras as the Keras 3 class: ``overflow_mode``, ``is_distributed``,
    ``decr_every_n_nan_or_inf``, ``decr_ratio``, ``incr_ratio``, ``min_loss_scale``,
    ``max_loss_scale``, ``max_skipped_steps_at_floor``; ``from_manager(inner, manager)``.
    """

_serializable = _keras.utils.register_keras_serializable(package="npu_lossscale")
_StockV3 = getattr(_stock, "LossScaleOptimizerV3", None)

if _StockV3 is None:  # Keras 2.6-2.10: one class, for the classic optimizers

    @_serializable
    class LossScaleOptimizer(_NPULossScaling, _stock.LossScaleOptimizer):
        __doc__ = _DOC

else:  # tf_keras / Keras 2.11+: one public name, a class per kind of inner optimizer

    class _PickByInner(type(_stock.BaseLossScaleOptimizer)):  # type: ignore[misc]
        """As Keras 2's own metaclass: the public name builds the class for the inner one."""

        def __call__(cls, inner_optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if cls is LossScaleOptimizer:
                check_keras2_inner(inner_optimizer, _keras)
                legacy = isinstance(inner_optimizer, _stock.optimizer_v2.OptimizerV2)
                cls = LossScaleOptimizerV2 if legacy else LossScaleOptimizerV3
            return type.__call__(cls, inner_optimizer, *args, **kwargs)

    class LossScaleOptimizer(_stock.BaseLossScaleOptimizer, metaclass=_PickByInner):
        __doc__ = _DOC
        from_manager = classmethod(_NPULossScaling.from_manager.__func__)

    class LossScaleOptimizerV2(_NPULossScaling, _stock.LossScaleOptimizer, LossScaleOptimizer):
        """Ours over Keras 2's classic optimizers (``optimizers.legacy``)."""

    # Keras 2's name for its class over the classic optimizers: errors and configs read as there.
    LossScaleOptimizerV2.__name__ = "LossScaleOptimizer"
    LossScaleOptimizerV2 = _serializable(LossScaleOptimizerV2)

    @_serializable
    class LossScaleOptimizerV3(_NPULossScaling, _StockV3, LossScaleOptimizer):
        """Ours over tf_keras's newer optimizers (``tf_keras.optimizers.Adam`` and the rest)."""


__all__ = ["LossScaleOptimizer"]
