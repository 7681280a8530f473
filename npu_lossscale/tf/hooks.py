"""A SessionRunHook that reports the loss scale, so users need not hand-write one.

The vendor guide has users write a hook that fetches 'loss_scale:0' by name, which breaks as soon
as a scope renames the tensor; this one takes the optimizer or manager itself. It reports the scale,
the number of skipped (overflowed) steps and the global step, through the "npu_lossscale" logger
and, optionally, as TensorBoard scalars.

TF users turn logging on with `tf.compat.v1.logging.set_verbosity(INFO)`, which configures only
TensorFlow's own logger; plain Python users call `logging.basicConfig(level=INFO)`. The hook's
lines must appear under either, once, so when nothing outside TensorFlow would print the
"npu_lossscale" logger's INFO lines, they go through TensorFlow's logger instead.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from npu_lossscale.tf.managers import LossScaleManager
from npu_lossscale.tf.optimizer import NPULossScaleOptimizer

SCALE_TAG = "npu_lossscale/loss_scale"
SKIPPED_TAG = "npu_lossscale/skipped_steps"


class LossScaleLoggingHook(tf.compat.v1.train.SessionRunHook):
    """Log loss scale, skipped steps and global step every ``every_n_steps`` session runs.

    Values are read with a separate ``session.run`` after the step, only on reporting steps, so
    they are the state after that step and cost nothing in between. ``summary_dir`` (or an existing
    ``summary_writer``) also writes them as scalars under ``npu_lossscale/``.
    """

    def __init__(
        self,
        optimizer_or_manager: NPULossScaleOptimizer | LossScaleManager,
        every_n_steps: int = 100,
        *,
        summary_dir: str | None = None,
        summary_writer: tf.compat.v1.summary.FileWriter | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if isinstance(optimizer_or_manager, NPULossScaleOptimizer):
            manager = optimizer_or_manager.loss_scale_manager
        elif isinstance(optimizer_or_manager, LossScaleManager):
            manager = optimizer_or_manager
        else:
            raise ValueError(
                "optimizer_or_manager must be an NPULossScaleOptimizer or a loss-scale manager; "
                f"got {optimizer_or_manager!r}"
            )
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps must be a positive integer; got {every_n_steps!r}")
        if summary_dir is not None and summary_writer is not None:
            raise ValueError("pass summary_dir or summary_writer, not both")
        self._manager = manager
        self._every_n_steps = every_n_steps
        self._summary_dir = summary_dir
        self._writer = summary_writer
        self._logger = logger
        self._fetches: dict[str, tf.Tensor] = {}
        self._runs = 0
        self._last_reported = 0

    def begin(self) -> None:
        self._fetches = {
            "loss_scale": tf.convert_to_tensor(self._manager.get_loss_scale()),
            "skipped_steps": tf.convert_to_tensor(self._manager.skipped_steps),
        }
        global_step = tf.compat.v1.train.get_global_step()
        if global_step is not None:
            self._fetches["global_step"] = tf.convert_to_tensor(global_step)
        if self._summary_dir is not None:
            self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)
        self._runs = 0
        self._last_reported = 0

    def after_run(self, run_context, run_values) -> None:
        self._runs += 1
        if self._runs % self._every_n_steps == 0:
            self._report(run_context.session)

    def end(self, session) -> None:
        if self._runs > self._last_reported:
            self._report(session)
        if self._writer is not None:
            self._writer.flush()

    def _output_logger(self) -> logging.Logger:
        """The logger given, else ours where Python logging would print it, else TensorFlow's."""
        if self._logger is not None:
            return self._logger
        ours = logging.getLogger("npu_lossscale")
        if ours.isEnabledFor(logging.INFO) and ours.hasHandlers():
            return ours
        return tf.get_logger()

    def _report(self, session) -> None:
        values = session.run(self._fetches)
        self._last_reported = self._runs
        scale = float(values["loss_scale"])
        skipped = int(values["skipped_steps"])
        step = int(values["global_step"]) if "global_step" in values else None
        self._output_logger().info(
            "loss scale %g, skipped steps %d, %s",
            scale,
            skipped,
            f"global step {step}" if step is not None else f"session run {self._runs}",
        )
        if self._writer is not None:
            summary = tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(tag=SCALE_TAG, simple_value=scale),
                    tf.compat.v1.Summary.Value(tag=SKIPPED_TAG, simple_value=float(skipped)),
                ]
            )
            self._writer.add_summary(summary, step if step is not None else self._runs)
