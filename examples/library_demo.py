"""Train a small fp16 model on CPU with dynamic loss scaling, once per NPU overflow mode.

The model computes in float16 (master weights stay float32), so the huge initial loss scale makes the
backward pass overflow for real, exactly as on an accelerator: the trace shows the skipped steps and
the scale settling to a value the gradients fit in.
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


def build_model(features: tf.Tensor, hidden: int) -> tf.Tensor:
    """Two dense layers computed in float16 from float32 master weights."""
    w1 = v1.get_variable("w1", [features.shape[1], hidden], initializer=v1.glorot_uniform_initializer())
    w2 = v1.get_variable("w2", [hidden, 1], initializer=v1.glorot_uniform_initializer())
    h = tf.nn.relu(tf.matmul(tf.cast(features, tf.float16), tf.cast(w1, tf.float16)))
    return tf.cast(tf.matmul(h, tf.cast(w2, tf.float16)), tf.float32)


def train(mode: str, steps: int, trace_every: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=(16, 1)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        x = v1.placeholder(tf.float32, [None, 16])
        y = v1.placeholder(tf.float32, [None, 1])
        loss = tf.reduce_mean(tf.square(build_model(x, 64) - y))
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
            last_skipped = 0
            for step in range(1, steps + 1):
                batch = rng.normal(size=(32, 16)).astype(np.float32)
                feed = {x: batch, y: batch @ true_w}
                loss_value, _ = sess.run([loss, train_op], feed)
                scale_value, skipped_value, gs = sess.run([scale, skipped, global_step])
                newly_skipped = skipped_value > last_skipped
                last_skipped = skipped_value
                if step % trace_every == 0 or step == 1 or (newly_skipped and step <= 60):
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
