"""MirroredStrategy over two logical CPUs: the Keras optimizer and the TF managers, one replica
overflowing. Dumps what every replica holds after each step as JSON.

A subprocess because logical devices must be configured before TensorFlow initialises its
devices, which another test module in the pytest process may already have done; one process runs
every scenario so TensorFlow is imported once. Usage: keras_mirrored_worker.py OUT.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402  (after the device set-up, which nothing may precede)

from npu_lossscale.keras import LossScaleOptimizer  # noqa: E402
from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager  # noqa: E402

DEVICES = [device.name for device in tf.config.list_logical_devices("CPU")]
X = np.random.default_rng(0).random((8, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((8, 1), dtype=np.float32)


def _per_replica(strategy: tf.distribute.Strategy, value: Any) -> list:
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(value)]


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])


def _observe(strategy: tf.distribute.Strategy, model: keras.Model, opt: Any) -> dict:
    return {
        "weights": [_per_replica(strategy, v.value) for v in model.weights],
        "slots": [_per_replica(strategy, v.value) for v in opt.inner_optimizer.variables],
        "scale": _per_replica(strategy, opt.dynamic_scale.value),
        "skipped": _per_replica(strategy, opt._skipped.value),
        "iterations": _per_replica(strategy, opt.iterations.value),
    }


def fit_scenario(mode: str, poisoned_replica: int) -> list[dict]:
    """model.fit, batch 8 split 4 + 4: an inf in one half overflows one replica only."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = _model()
        opt = LossScaleOptimizer(keras.optimizers.Adam(1e-2), 2.0**10, 1000, overflow_mode=mode)
        model.compile(optimizer=opt, loss="mse")
    # Saturation: finite, but that replica's scaled gradients pass 65504.
    poisoned = X.copy()
    poisoned[4 * poisoned_replica, :] = 70000.0 if mode == "saturation" else np.inf
    seen = []
    for x in (X, poisoned, X):
        model.fit(x, Y, batch_size=8, shuffle=False, verbose=0)
        seen.append(_observe(strategy, model, opt))
    # The same first step with the bare inner optimizer: the scale is a power of two, so the
    # clean step must land on exactly these weights (each replica's own gradients, summed).
    with strategy.scope():
        bare = _model()
        bare.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    bare.fit(X, Y, batch_size=8, shuffle=False, verbose=0)
    seen[0]["bare_weights"] = [_per_replica(strategy, v.value) for v in bare.weights]
    return seen


def custom_loop_scenario(poisoned_replica: int) -> list[dict]:
    """strategy.run of a tf.function step; the replica with the given id sees inf. Each
    replica trains on its own half of the batch, so a mix-up of gradients would show."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = _model()
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), 2.0**10, 1000)
        model.build((None, 4))
        opt.build(model.trainable_variables)

    def replica_step(poison: tf.Tensor) -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        half = tf.reshape(tf.gather(tf.reshape(tf.constant(X), [2, 4, 4]), replica), [4, 4])
        target = tf.reshape(tf.gather(tf.reshape(tf.constant(Y), [2, 4, 1]), replica), [4, 1])
        x = half * tf.where(tf.equal(replica, poisoned_replica), poison, 1.0)
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_mean(tf.square(model(x) - target)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def step(poison: tf.Tensor) -> None:
        strategy.run(replica_step, args=(poison,))

    seen = []
    for poison in (1.0, np.inf, 1.0):
        step(tf.constant(poison, tf.float32))
        seen.append(_observe(strategy, model, opt))
    # By hand, on one device: SGD on the sum of the two halves' gradients (the replicas' sum).
    reference = _model()
    with tf.GradientTape() as tape:
        halves = [tf.reduce_mean(tf.square(reference(X[i : i + 4]) - Y[i : i + 4])) for i in (0, 4)]
        total = halves[0] + halves[1]
    grads = tape.gradient(total, reference.trainable_variables)
    seen[0]["bare_weights"] = [
        [(v.numpy() - np.float32(0.1) * g.numpy()).tolist()] * 2
        for v, g in zip(reference.trainable_variables, grads)
    ]
    return seen


def manager_scenario(is_distributed: bool) -> list[dict]:
    """A script driving the manager itself: replica 1 reports an overflow on the second step."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        manager = ExponentialUpdateLossScaleManager(
            2.0**10, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5, is_distributed=is_distributed
        )

    def replica_step(overflow_on_replica_1: tf.Tensor) -> None:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        finite = tf.logical_not(tf.logical_and(overflow_on_replica_1, tf.equal(replica, 1)))
        manager.update_loss_scale(finite)

    @tf.function
    def step(flag: tf.Tensor) -> None:
        strategy.run(replica_step, args=(flag,))

    seen = []
    for overflow in (False, True, False):
        step(tf.constant(overflow))
        seen.append(
            {
                "scale": _per_replica(strategy, manager.variables[0]),
                "skipped": _per_replica(strategy, manager.skipped_steps),
            }
        )
    return seen


def refused_scenario() -> str:
    """is_distributed=False under two replicas must refuse, not let each replica decide."""
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = _model()
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.1), is_distributed=False)
        model.compile(optimizer=opt, loss="mse")
    try:
        model.fit(X, Y, batch_size=8, verbose=0)
    except ValueError as error:
        return str(error)
    return ""


def main(out: str) -> None:
    results = {
        "devices": DEVICES,
        "fit": {
            f"{mode}-{replica}": fit_scenario(mode, replica)
            for mode in ("inf_nan", "saturation")
            for replica in (0, 1)
        },
        "loop": {str(replica): custom_loop_scenario(replica) for replica in (0, 1)},
        "manager": {str(flag): manager_scenario(flag) for flag in (True, False)},
        "refused": refused_scenario(),
    }
    with open(out, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
