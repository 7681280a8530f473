"""Loss-scale managers written to tf.contrib's contract, made usable by NPULossScaleOptimizer.

tf.contrib.mixed_precision (and the Ascend adapter copied from it) asks only two methods of a
manager: ``get_loss_scale()`` and ``update_loss_scale(finite_grads)``. Scripts carry their own
managers written to that contract, either subclassing ``LossScaleManager`` without calling its
``__init__`` (contrib's base class had none) or duck-typed. The optimizer needs more than that:
an overflow mode, the is_distributed flag, a skipped-step count, checkpointable state. This
wrapper supplies those with the vendor's defaults (overflow check on, mode resolved as "auto",
not distributed) and leaves the scale and its update to the user's manager; every attribute it
does not define is the user's manager's.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from npu_lossscale.modes import OverflowMode, resolve_overflow_mode
from npu_lossscale.tf import managers


def follows_contrib_contract(manager: object) -> bool:
    """Whether ``manager`` has contrib's two methods."""
    return all(
        callable(getattr(manager, name, None)) for name in ("get_loss_scale", "update_loss_scale")
    )


def is_complete(manager: object) -> bool:
    """One of ours, set up by LossScaleManager.__init__ (a subclass may have skipped it)."""
    return isinstance(manager, managers.LossScaleManager) and "_skipped_steps" in vars(manager)


class ContribContractManager(tf.Module):
    """What NPULossScaleOptimizer needs from a manager, around one that has only contrib's
    ``get_loss_scale`` / ``update_loss_scale``."""

    def __init__(self, user_manager: Any) -> None:
        super().__init__(name="ContribContractManager")
        self._user_manager = user_manager
        self.is_distributed = False
        self.enable_overflow_check = True
        self.overflow_mode: OverflowMode = resolve_overflow_mode("auto")
        self._skipped_steps = managers.state_variable(0, tf.int64, managers.SKIPPED_STEPS_VAR_NAME)

    def __getattr__(self, attr: str) -> Any:
        # Reached only for what this class lacks; guard the names used before __init__ ran.
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.__dict__["_user_manager"], attr)

    @property
    def user_manager(self) -> Any:
        return self._user_manager

    def get_loss_scale(self) -> tf.Tensor:
        return tf.cast(tf.convert_to_tensor(self._user_manager.get_loss_scale()), tf.float32)

    def __call__(self) -> tf.Tensor:
        return self.get_loss_scale()

    def update_with_agreed_flag(self, finite: tf.Tensor) -> tf.Operation | None:
        """The user's update with the step's flag, and the skipped-step count."""
        update = self._user_manager.update_loss_scale(finite)
        counted = self._skipped_steps.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        if tf.executing_eagerly():
            return None
        return tf.group(*[op for op in (update, counted) if op is not None])

    @property
    def skipped_steps(self) -> tf.Variable:
        return self._skipped_steps

    @property
    def variables(self) -> list[tf.Variable]:
        return [self._skipped_steps]
