"""Per-step cost of the all-reduced overflow check against a local-only check, MirroredStrategy.

Both variants build the same model, optimizer and manager under a MirroredStrategy over two logical
CPU devices and differ only in the reducer: the default one sums the overflow flag over the
replicas (is_distributed=True), the baseline returns the replica's own flag unchanged (the check a
non-distributed optimizer makes). Steps of the two alternate in one run, so machine noise hits both
alike; the script prints the medians and their ratio.

Usage: python benchmarks/distributed_overhead.py [--steps N] [--width W]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402  (the log level must be set before TensorFlow loads)

from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer  # noqa: E402


class LocalOnly:
    """Baseline reducer: no communication, each replica keeps its own flag."""

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor


def _build(strategy: tf.distribute.Strategy, width: int, reducer: object):
    with strategy.scope():
        kernel = tf.Variable(tf.random.stateless_normal([width, width], seed=[1, 2]) * 0.01)
        manager = ExponentialUpdateLossScaleManager(2.0**10, 1000, overflow_mode="inf_nan")
        optimizer = NPULossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1e-3),
            manager,
            is_distributed=True,
            reducer=reducer,
        )
    inputs = tf.random.stateless_normal([64, width], seed=[3, 4])

    def replica_step() -> tf.Operation:
        hidden = tf.tanh(tf.matmul(inputs, kernel))
        loss = tf.reduce_mean(tf.square(tf.matmul(hidden, kernel, transpose_b=True) - inputs))
        return optimizer.minimize(loss, var_list=[kernel])

    @tf.function
    def step() -> None:
        strategy.run(replica_step)

    return step, manager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="timed steps per variant")
    parser.add_argument("--width", type=int, default=256, help="square weight matrix size")
    args = parser.parse_args()

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)

    variants = {
        "all-reduced check": _build(strategy, args.width, None),
        "local check": _build(strategy, args.width, LocalOnly()),
    }
    for step, _ in variants.values():  # trace and warm up outside the timing
        for _ in range(10):
            step()

    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for number in range(args.steps):
        # ABBA order: neither variant always runs right after the other's step.
        for name in order if number % 2 == 0 else reversed(order):
            step = variants[name][0]
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)

    for name, (_, manager) in variants.items():
        skipped = int(manager.skipped_steps.numpy())
        if skipped:
            raise SystemExit(f"{name}: {skipped} steps overflowed; not a like-for-like comparison")

    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"MirroredStrategy over {len(devices)} logical CPU devices, {args.width}x{args.width} "
        f"kernel, {args.steps} interleaved steps per variant"
    )
    for name, value in medians.items():
        print(f"  {name:18s} median {value * 1e3:8.3f} ms/step")
    ratio = medians["all-reduced check"] / medians["local check"]
    print(f"  ratio all-reduced / local: {ratio:.3f}")


if __name__ == "__main__":
    main()
