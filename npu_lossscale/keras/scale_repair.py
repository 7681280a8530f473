"""A restored loss scale that cannot be used goes back to the floor, with a warning.

A checkpoint can hold a scale no run of this library would reach: a stock Keras run whose scale
collapsed to 0 after a storm of NaN steps (stock Keras 3 has no floor), a denormal such as 1e-40,
a value below this run's ``min_loss_scale``, or inf. Multiplying the loss by 0 and the gradients
by 1/0 makes NaN of every weight on the next clean step, and a scale of 1e-30 keeps the gradients
underflowing for a hundred growth periods. The scale is judged where the rule reads it anyway,
so the check costs a scalar comparison a step and no extra branch on a normal run.
"""

from __future__ import annotations

import logging
import sys

import tensorflow as tf

from npu_lossscale.rule import FLOAT32_MAX
from npu_lossscale.tf import kernels

logger = logging.getLogger("npu_lossscale")


def usable(scale: tf.Tensor, floor: float) -> tf.Tensor:
    """Boolean scalar: the scale lies in [floor, float32 max] (False for NaN and inf)."""
    return tf.logical_and(scale >= floor, scale <= FLOAT32_MAX)


def _message(who: str, floor: float) -> str:
    return (
        f"npu_lossscale: {who}: the loss scale read from its variable is not usable (below "
        f"min_loss_scale={floor:g}, not finite, or 0 as a collapsed stock Keras run can save it); "
        f"it is reset to the floor {floor:g}. A checkpoint restored from such a run is the usual "
        "cause; its weights are not touched by the step that found it."
    )


def warn_and_reset(variable: tf.Variable, scale: tf.Tensor, floor: float, who: str) -> tf.Tensor:
    """Inside the branch taken when ``scale`` is not usable: log, set the floor, return it.

    Eagerly the warning goes to the npu_lossscale logger; traced, through tf.print to stderr,
    since a Python logger would fire once at trace time instead of when it happens; in an XLA
    compiled step (which cannot print) the scale is reset without a message.
    """
    if tf.executing_eagerly():
        logger.warning("%s (it was %s)", _message(who, floor), float(scale))
        printed = tf.no_op()
    elif kernels.in_xla_context():  # XLA cannot compile a print: the reset alone
        printed = tf.no_op()
    else:
        printed = tf.print(
            "WARNING", _message(who, floor), "(it was", scale, ")", output_stream=sys.stderr
        )
    with tf.control_dependencies([printed]):
        assigned = variable.assign(tf.constant(floor, tf.float32))
    with tf.control_dependencies([assigned]):
        return tf.constant(floor, tf.float32)
