"""Why the overflow mode matters: one fp16 model, a saturating chip, the right and the wrong mode.

The model computes in float16 (master weights stay float32) from a loss scale of 2^32, far too
large, so its backward pass overflows for real. On a first-generation Atlas chip (saturation mode)
an overflowing float16 result is clamped to +-65504 instead of becoming inf; this demo reproduces
that on the CPU by clamping every float16 result. Three runs:

- a saturating chip with overflow_mode="saturation": the matching mode sees every overflow;
- the same chip with overflow_mode="inf_nan": the wrong mode sees no inf, so it applies every
  overflowed step and never lowers the scale;
- an IEEE device (inf/NaN, like a GPU or an Atlas A2) with overflow_mode="inf_nan": matching again.

Each run also counts the true overflows (a scaled gradient that reached 65504 or is not finite) so
the table can say how many each mode caught. A PNG of loss and loss scale per step is written too.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the demo's tables, not TensorFlow's log
# TF 2.21 prints its oneDNN notice (and, without AVX-512, a DT_HALF fallback warning) before its log
# level applies; the demo's small fp16 model gains nothing from oneDNN, so it is simply off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from npu_lossscale import (  # noqa: E402
    ExponentialUpdateLossScaleManager,
    NPULossScaleOptimizer,
)
from npu_lossscale.tf import kernels  # noqa: E402

v1 = tf.compat.v1
FP16_MAX = 65504.0


def format_scale(scale: float) -> str:
    """Loss scales one way throughout: powers of two as 2^k, anything else as a plain number."""
    exponent = math.log2(scale) if scale > 0 else math.nan
    if exponent == int(exponent):
        return f"2^{int(exponent)}"
    return f"{scale:.6g}"


def clamp(values: tf.Tensor) -> tf.Tensor:
    return tf.clip_by_value(values, -FP16_MAX, FP16_MAX)


@tf.custom_gradient
def saturate(values: tf.Tensor) -> tf.Tensor:
    """Identity that saturates its result and its gradient, as the chip does after every op."""
    return clamp(values), lambda upstream: clamp(upstream)


def build_model(features: tf.Tensor, hidden: int, saturating: bool) -> tf.Tensor:
    """Two dense layers computed in float16 from float32 master weights."""
    sat = saturate if saturating else tf.identity
    init = v1.glorot_uniform_initializer()
    w1 = v1.get_variable("w1", [features.shape[1], hidden], initializer=init)
    w2 = v1.get_variable("w2", [hidden, 1], initializer=init)
    x16, w1_16, w2_16 = (sat(tf.cast(t, tf.float16)) for t in (features, w1, w2))
    h = sat(tf.nn.relu(sat(tf.matmul(x16, w1_16))))
    return tf.cast(sat(tf.matmul(h, w2_16)), tf.float32)


@dataclass
class Run:
    """One training run's settings and what it recorded per step."""

    title: str
    chip: str  # "saturation" or "inf_nan": what the simulated device does on overflow
    mode: str  # the overflow_mode given to the manager
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    overflows: int = 0  # true overflows, whatever the mode saw
    skipped: int = 0
    global_step: int = 0


def train(run: Run, steps: int, trace_every: int, seed: int = 0) -> Run:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=(16, 1)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 16])
        y = v1.placeholder(tf.float32, [None, 1])
        prediction = build_model(x, 64, saturating=run.chip == "saturation")
        loss = tf.reduce_mean(tf.square(prediction - y))
        manager = ExponentialUpdateLossScaleManager(
            init_loss_scale=2**32,
            incr_every_n_steps=100,
            decr_every_n_nan_or_inf=2,
            decr_ratio=0.5,
            overflow_mode=run.mode,
        )
        optimizer = NPULossScaleOptimizer(v1.train.MomentumOptimizer(0.01, 0.9), manager)
        global_step = v1.train.get_or_create_global_step()
        scale = manager.get_loss_scale()
        # The truth, independent of the mode: did any scaled gradient overflow this step?
        scaled_grads = tf.gradients(loss * scale, v1.trainable_variables())
        overflowed = tf.reduce_any(
            [tf.reduce_any(~tf.math.is_finite(g) | (tf.abs(g) >= FP16_MAX)) for g in scaled_grads]
        )
        with tf.control_dependencies([overflowed]):
            train_op = optimizer.minimize(loss, global_step=global_step)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            print(f"\n== {run.title} ==")
            print(f"{'step':>5} {'loss':>12} {'loss scale':>11} {'skipped':>8} {'global_step':>12}")
            last_skipped, last_scale = 0, None
            for step in range(1, steps + 1):
                batch = rng.normal(size=(32, 16)).astype(np.float32)
                loss_value, truth, _ = sess.run(
                    [loss, overflowed, train_op], {x: batch, y: batch @ true_w}
                )
                scale_value, skipped_value, gs = sess.run(
                    [scale, manager.skipped_steps, global_step]
                )
                run.losses.append(float(loss_value))
                run.scales.append(float(scale_value))
                run.overflows += int(truth)
                newly_skipped = skipped_value > last_skipped
                scale_changed = scale_value != last_scale
                unseen = truth and not newly_skipped
                if step % trace_every == 0 or scale_changed or (unseen and step <= 3):
                    if newly_skipped:
                        mark = "  <- overflow, step skipped"
                    elif truth:
                        mark = "  <- overflow NOT seen, step applied"
                    else:
                        mark = ""
                    print(
                        f"{step:>5} {loss_value:>12.4g} {format_scale(scale_value):>11}"
                        f" {skipped_value:>8d} {gs:>12d}{mark}"
                    )
                last_skipped, last_scale = skipped_value, scale_value
            run.skipped, run.global_step = int(last_skipped), int(gs)
    return run


def summarize(runs: list[Run]) -> None:
    # Two counts side by side: steps whose gradients overflowed, and how many the scaler skipped.
    print(
        f"\n{'run':<48} {'overflowed':>10}  {'skipped':>7}  {'final scale':>11}  {'final loss':>10}"
    )
    for run in runs:
        print(
            f"{run.title:<48} {run.overflows:>10d}  {run.skipped:>7d}"
            f"  {format_scale(run.scales[-1]):>11}  {run.losses[-1]:>10.4g}"
        )
    right, wrong = runs[0], runs[1]
    print(
        f"On a saturating chip the matching mode caught {right.skipped} of {right.overflows} "
        f"overflows; the wrong mode caught {wrong.skipped} of {wrong.overflows}, applied the "
        f"clamped gradients, never lowered the scale, and ended at loss {wrong.losses[-1]:.4g} "
        f"instead of {right.losses[-1]:.4g}."
    )


def plot(runs: list[Run], path: Path) -> bool:
    """Draw the runs into `path`; False (and one line saying so) without matplotlib, which only
    this picture needs: the tables above are the demo."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        print("No plot: matplotlib is not installed (`pip install matplotlib` to draw one).")
        return False

    matplotlib.use("Agg")  # a file, never a window
    from matplotlib import pyplot

    figure, (loss_axes, scale_axes) = pyplot.subplots(2, 1, figsize=(9, 7), sharex=True)
    # The two matching runs coincide: a wide pale line under a thin dashed one shows both.
    styles = [
        dict(color="tab:blue", linewidth=4, alpha=0.5),
        dict(color="tab:red", linewidth=1.2),
        dict(color="black", linewidth=1, linestyle="--"),
    ]
    for run, style in zip(runs, styles):
        steps = range(1, len(run.losses) + 1)
        loss_axes.plot(steps, run.losses, label=run.title, **style)
        scale_axes.plot(steps, run.scales, label=run.title, **style)
    loss_axes.set_yscale("log")
    loss_axes.set_ylabel("loss")
    loss_axes.legend(fontsize=8)
    scale_axes.set_yscale("log", base=2)
    scale_axes.set_ylabel("loss scale")
    scale_axes.set_xlabel("step")
    figure.suptitle("npu_lossscale: the overflow mode must match the device")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--trace-every", type=int, default=50)
    parser.add_argument("--plot", type=Path, default=Path("build") / "demo" / "loss_scale.png")
    args = parser.parse_args()
    if not kernels.built():
        print("Compiling the fused CPU ops once (about 15 s; cached afterwards)...", flush=True)
        kernels.register_ops()
    runs = [
        Run("saturating chip, overflow_mode='saturation'", chip="saturation", mode="saturation"),
        Run("saturating chip, overflow_mode='inf_nan' (wrong)", chip="saturation", mode="inf_nan"),
        Run("IEEE device, overflow_mode='inf_nan'", chip="inf_nan", mode="inf_nan"),
    ]
    for run in runs:
        train(run, args.steps, args.trace_every)
    summarize(runs)
    if plot(runs, args.plot):
        print(f"Loss and loss scale per step: {args.plot}")


if __name__ == "__main__":
    main()
