"""Train a small fp16 model on CPU with dynamic loss scaling, once per NPU overflow mode.

The model computes in float16 (master weights stay float32), so the huge initial loss scale makes
the backward pass overflow for real, as on an accelerator: the trace shows the skipped steps and the
scale settling to a value the gradients fit in. For the saturation-mode run every float16 result
saturates to +-65504 instead of becoming inf, as on a first-generation Atlas chip, so the gradients
stay finite and only the saturation check can see the overflow.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from npu_lossscale import (  # noqa: E402
    ExponentialUpdateLossScaleManager,
    NPULossScaleOptimizer,
)

v1 = tf.compat.v1


FP16_MAX = 65504.0


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


def train(mode: str, steps: int, trace_every: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=(16, 1)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 16])
        y = v1.placeholder(tf.float32, [None, 1])
        prediction = build_model(x, 64, saturating=mode == "saturation")
        loss = tf.reduce_mean(tf.square(prediction - y))
        manager = ExponentialUpdateLossScaleManager(
            init_loss_scale=2**32,
            incr_every_n_steps=100,
            decr_every_n_nan_or_inf=2,
            decr_ratio=0.5,
            overflow_mode=mode,
        )
        optimizer = NPULossScaleOptimizer(v1.train.AdamOptimizer(1e-2), manager)
        global_step = v1.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss, global_step=global_step)
        scale = manager.get_loss_scale()
        skipped = manager.skipped_steps
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            print(f"\n== overflow mode: {manager.overflow_mode.value} ==")
            print(f"{'step':>5} {'loss':>10} {'loss scale':>14} {'skipped':>8} {'global_step':>12}")
            last_skipped, last_scale = 0, None
            for step in range(1, steps + 1):
                batch = rng.normal(size=(32, 16)).astype(np.float32)
                feed = {x: batch, y: batch @ true_w}
                loss_value, _ = sess.run([loss, train_op], feed)
                scale_value, skipped_value, gs = sess.run([scale, skipped, global_step])
                newly_skipped = skipped_value > last_skipped
                scale_changed = scale_value != last_scale
                last_skipped, last_scale = skipped_value, scale_value
                if step % trace_every == 0 or scale_changed:
                    mark = "  <- overflow, step skipped" if newly_skipped else ""
                    print(f"{step:>5} {loss_value:>10.4f} {scale_value:>14.6g} {skipped_value:>8d}"
                          f" {gs:>12d}{mark}")
            print(f"done: {steps} steps, {last_skipped} skipped, final loss scale {scale_value:g},"
                  f" global_step {gs} (advanced only on applied steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--trace-every", type=int, default=25)
    args = parser.parse_args()
    for mode in ("inf_nan", "saturation"):
        train(mode, args.steps, args.trace_every)


if __name__ == "__main__":
    main()
