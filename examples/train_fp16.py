"""Train a small float16 regression model with dynamic loss scaling, written the GPU-era way.

This is the kind of TF1 script the migrator exists for: it uses `tf.contrib.mixed_precision`,
so it does not run on TensorFlow 2 (tf.contrib is gone) nor on an Ascend NPU as it is. Port it
first, then run it:

    npu-migrate --write examples/train_fp16.py
    python examples/train_fp16.py --steps 300 --trace-every 20

The forward and backward passes compute in float16 while the master weights stay float32. The
initial loss scale 2**32 is far too large for float16, so the first steps overflow for real: the
trace shows them skipped (global_step does not advance) and the scale halving until the scaled
gradients fit, after which the loss falls.
"""

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow.compat.v1 as tf

tf.get_logger().setLevel("ERROR")  # TensorFlow's deprecation notices would bury the trace
tf.disable_v2_behavior()

FEATURES = 16


def scale_text(scale):
    """Powers of two as 2^k, which is what a loss scale almost always is."""
    exponent = math.log2(scale) if scale > 0 else 0.5
    return f"2^{int(exponent)}" if exponent.is_integer() else f"{scale:g}"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument(
        "--trace-every",
        type=int,
        default=20,
        help="print step, loss, loss scale and skipped steps every N steps",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1 or args.trace_every < 1:
        parser.error("--steps and --trace-every must be at least 1")
    return args


def synthetic_data(rng, samples=4096):
    """y = x . w + noise, with a fixed random w the model has to recover."""
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    true_w = rng.standard_normal((FEATURES, 1)).astype(np.float32)
    y = x @ true_w + 0.01 * rng.standard_normal((samples, 1)).astype(np.float32)
    return x, y


def fp16_linear_model(x):
    """float32 master weights, float16 compute: the usual mixed-precision recipe."""
    w = tf.get_variable("w", [FEATURES, 1], tf.float32, tf.zeros_initializer())
    b = tf.get_variable("b", [1], tf.float32, tf.zeros_initializer())
    y16 = tf.matmul(tf.cast(x, tf.float16), tf.cast(w, tf.float16)) + tf.cast(b, tf.float16)
    return tf.cast(y16, tf.float32)


def main():
    args = parse_args()
    rng = np.random.default_rng(args.seed)
    data_x, data_y = synthetic_data(rng)
    tf.set_random_seed(args.seed)

    x = tf.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf.placeholder(tf.float32, [None, 1], name="y")
    loss = tf.reduce_mean(tf.square(fp16_linear_model(x) - y))
    global_step = tf.train.get_or_create_global_step()

    opt = tf.train.MomentumOptimizer(args.learning_rate, momentum=0.9)
    loss_scale_manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(
        init_loss_scale=2**32, incr_every_n_steps=100, decr_every_n_nan_or_inf=1, decr_ratio=0.5
    )
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, loss_scale_manager)
    train_op = opt.minimize(loss, global_step=global_step)
    loss_scale = loss_scale_manager.get_loss_scale()

    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(1, args.steps + 1):
            batch = rng.integers(0, len(data_x), args.batch_size)
            _, loss_value = sess.run([train_op, loss], {x: data_x[batch], y: data_y[batch]})
            if step % args.trace_every == 0 or step in (1, args.steps):
                scale, applied = sess.run([loss_scale, global_step])
                print(
                    f"step {step:5d}  loss {loss_value:10.4g}  loss scale {scale_text(scale):>6}  "
                    f"skipped {step - applied:4d}",
                    flush=True,
                )
        final_loss = sess.run(loss, {x: data_x, y: data_y})
        scale, applied = sess.run([loss_scale, global_step])
    print(
        f"done: {args.steps} steps, {args.steps - applied} skipped, final loss {final_loss:.4g}, "
        f"loss scale {scale_text(scale)}"
    )


if __name__ == "__main__":
    main()
