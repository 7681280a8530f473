"""Run the MirroredStrategy scenarios over two logical CPU devices and dump what each replica saw.

A subprocess because logical devices must be configured before TensorFlow initialises its devices,
which another test module in the pytest process may already have done. One process runs every
scenario so TensorFlow is imported once. Usage: mirrored_worker.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys

import tensorflow as tf
import training

from npu_lossscale import NPULossScaleOptimizer

MODES = ("inf_nan", "saturation")


def _configure_two_cpus() -> list[str]:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return [device.name for device in tf.config.list_logical_devices("CPU")]


class LocalOnly:
    """A reducer that does not reduce: the control that shows the scenarios catch the bug."""

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor


def _graph_scenario(
    devices: list[str],
    mode: str,
    schedule: list[int | None],
    reducer: object = None,
    per_replica: bool = False,
) -> list[dict]:
    """TF1 style: a tf.Graph, strategy.extended.call_for_each_replica, Session.run. With
    `per_replica`, an Estimator's shape: model_fn runs once per replica, so each replica builds
    its own manager and optimizer inside the replica function (over the mirrored state)."""
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            weights = tf.compat.v1.get_variable(
                "w", initializer=training.INITIAL_WEIGHTS, use_resource=True
            )
            global_step = tf.compat.v1.train.get_or_create_global_step()
            poison = tf.compat.v1.placeholder(tf.float32, [2], name="poison")
            managers = [] if per_replica else [training.make_manager(mode)] * 2
            shared = None if per_replica else training.make_optimizer(managers[0], reducer)

            def model_fn() -> tf.Operation:
                optimizer = shared
                if optimizer is None:
                    managers.append(training.make_manager(mode))
                    optimizer = training.make_optimizer(managers[-1], reducer)
                return training.replica_step(optimizer, weights, poison, global_step)

            train_op = strategy.group(strategy.extended.call_for_each_replica(model_fn))
            init = tf.compat.v1.global_variables_initializer()

        def each_replica(variable_of) -> list:  # replica i's value of its own manager's variable
            return [
                strategy.experimental_local_results(variable_of(m))[i]
                for i, m in enumerate(managers)
            ]

        observed = {
            "w": strategy.experimental_local_results(weights),
            "scale": each_replica(lambda m: m.variables[0]),
            "good_steps": each_replica(lambda m: m.variables[1]),
            "skipped": each_replica(lambda m: m.skipped_steps),
            "global_step": strategy.experimental_local_results(global_step),
        }
        records = []
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(init)
            for entry in schedule:
                feed = [training.poison_for(entry, replica, mode) for replica in range(2)]
                session.run(train_op, {poison: feed})
                records.append(_jsonable(session.run(observed)))
    return records


def _function_scenario(devices: list[str], mode: str, schedule: list[int | None]) -> list[dict]:
    """TF2 style: eager variables, a tf.function around strategy.run."""
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        weights = tf.Variable(training.INITIAL_WEIGHTS, name="w")
        global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        manager = training.make_manager(mode)
        optimizer = training.make_optimizer(manager)

    @tf.function
    def step(poison: tf.Tensor) -> None:
        strategy.run(training.replica_step, args=(optimizer, weights, poison, global_step))

    def local(variable: tf.Variable) -> list:
        return [value.numpy() for value in strategy.experimental_local_results(variable)]

    records = []
    for entry in schedule:
        step(tf.constant([training.poison_for(entry, replica, mode) for replica in range(2)]))
        observed = {
            "w": local(weights),
            "scale": local(manager.variables[0]),
            "good_steps": local(manager.variables[1]),
            "skipped": local(manager.skipped_steps),
            "global_step": local(global_step),
        }
        records.append(_jsonable(observed))
    return records


def _jsonable(observed: dict) -> dict:
    return {key: [value.tolist() for value in values] for key, values in observed.items()}


def _not_distributed_error(devices: list[str]) -> str:
    """is_distributed=False with two replicas must refuse to build, with a message."""
    graph = tf.Graph()
    with graph.as_default():
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            weights = tf.compat.v1.get_variable(
                "w", initializer=training.INITIAL_WEIGHTS, use_resource=True
            )
            manager = training.make_manager("inf_nan")
            optimizer = NPULossScaleOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(training.LEARNING_RATE), manager
            )
            try:
                strategy.extended.call_for_each_replica(
                    lambda: optimizer.minimize(tf.reduce_sum(weights), var_list=[weights])
                )
            except ValueError as error:
                return str(error)
    return ""


def main(out_path: str) -> None:
    devices = _configure_two_cpus()
    results = {}
    scenarios = (
        ("graph", _graph_scenario),
        ("function", _function_scenario),
        ("graph-per-replica", functools.partial(_graph_scenario, per_replica=True)),
    )
    for api, scenario in scenarios:
        for mode in MODES:
            for schedule_name, schedule in training.SCHEDULES.items():
                key = f"{api}/{mode}/{schedule_name}"
                results[key] = scenario(devices, mode, schedule)
    results["graph/inf_nan/mixed/local-only"] = _graph_scenario(
        devices, "inf_nan", training.SCHEDULES["mixed"], LocalOnly()
    )
    not_distributed = _not_distributed_error(devices)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(
            {"devices": devices, "results": results, "not_distributed_error": not_distributed},
            handle,
        )


if __name__ == "__main__":
    main(sys.argv[1])
