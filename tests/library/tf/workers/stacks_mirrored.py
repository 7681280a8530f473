"""MirroredStrategy over two CPU devices in a TF1 graph, on whichever TensorFlow runs this.

Usage: stacks_mirrored.py OUT.json; runs with reference and with resource variables. A
subprocess because the second CPU device must exist before TensorFlow sets up its devices:
TF 2.x makes it a logical device; TF 1.15 has no such API and takes it from the session's
device_count. Replica 0 is fed K_REPLICA_0 (inf and NaN on steps 2 and 4), replica 1 always 1:
with the overflow status all-reduced both must skip those steps. Dumps what each replica holds.
"""

import json
import sys

import numpy as np
import tensorflow as tf

from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer

K_REPLICA_0 = [1.0, float("inf"), 1.0, float("nan"), 1.0]
X = np.array([1.0, 2.0, 4.0], np.float32)


def main(out):
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    if hasattr(tf.config, "set_logical_device_configuration"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    traces = {kind: run(kind, config) for kind in ("reference", "resource")}
    with open(out, "w") as handle:
        json.dump({"traces": traces, "tensorflow": tf.__version__}, handle)


def run(kind, config):
    devices = ["/cpu:0", "/cpu:1"]
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.MirroredStrategy(devices)
        k0 = tf.compat.v1.placeholder(tf.float32, [])
        with strategy.scope(), tf.compat.v1.variable_scope("", use_resource=(kind == "resource")):
            w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]))
            step = tf.compat.v1.train.get_or_create_global_step()
            manager = ExponentialUpdateLossScaleManager(
                1024.0, 2, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
            )
            opt = NPULossScaleOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(0.5), manager, is_distributed=True
            )

        def step_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            k = tf.where(tf.equal(replica, 0), k0, 1.0)
            return opt.minimize(k * tf.reduce_sum(w * tf.constant(X)), global_step=step)

        train = strategy.group(strategy.extended.call_for_each_replica(step_fn))
        init = tf.compat.v1.global_variables_initializer()
        reads = {
            "w": [tf.identity(v) for v in strategy.experimental_local_results(w)],
            "step": tf.identity(step),
            "scale": manager.get_loss_scale(),
        }
        trace = []
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(init)
            for value in K_REPLICA_0:
                sess.run(train, {k0: value})
                got = sess.run(reads)
                trace.append(
                    {
                        "w": [r.tolist() for r in got["w"]],
                        "step": int(got["step"]),
                        "scale": float(got["scale"]),
                    }
                )
    return trace


if __name__ == "__main__":
    main(sys.argv[1])
