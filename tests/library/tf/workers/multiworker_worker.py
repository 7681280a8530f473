"""One worker of a 2-process MultiWorkerMirroredStrategy job on 127.0.0.1.

Usage: multiworker_worker.py INDEX PORT0,PORT1 OUT_DIR [--die-after-step N]

Runs the "mixed" schedule in both overflow modes (one replica per worker, so the poisoned replica
is a whole worker), records what this worker saw after every step, writes a checkpoint after every
step, and dumps worker<INDEX>.json into OUT_DIR. With --die-after-step the worker exits abruptly
after that step (the fault test); the survivor catches the collective's error, records it and
exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import time

COLLECTIVE_TIMEOUT_S = 20.0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("index", type=int)
    parser.add_argument("ports")
    parser.add_argument("out_dir")
    parser.add_argument("--die-after-step", type=int, default=None)
    return parser.parse_args()


def main() -> int:
    args = _parse()
    workers = [f"127.0.0.1:{port}" for port in args.ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": args.index}}
    )
    import tensorflow as tf
    import training

    # The timeout bounds every collective even if failure detection via heartbeats missed a
    # dead peer: the survivor must end with an error, never hang.
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=COLLECTIVE_TIMEOUT_S
        )
    )
    report: dict = {"num_replicas": strategy.num_replicas_in_sync, "modes": {}}
    out_file = os.path.join(args.out_dir, f"worker{args.index}.json")
    try:
        for mode in ("inf_nan", "saturation"):
            report["modes"][mode] = _run_mode(tf, training, strategy, mode, args)
    except (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.InternalError,
    ) as error:
        report["error"] = {
            "type": type(error).__name__,
            "message": error.message[:2000],
            "at": time.time(),
        }
        _dump(report, out_file)
        return 2
    _dump(report, out_file)
    return 0


def _run_mode(tf, training, strategy, mode: str, args: argparse.Namespace) -> dict:
    with strategy.scope():
        weights = tf.Variable(training.INITIAL_WEIGHTS, name=f"w_{mode}")
        global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name=f"global_step_{mode}",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        manager = training.make_manager(mode)
        optimizer = training.make_optimizer(manager)

    @tf.function
    def step(poison: tf.Tensor) -> None:
        strategy.run(training.replica_step, args=(optimizer, weights, poison, global_step))

    checkpoint = tf.train.Checkpoint(weights=weights, global_step=global_step, manager=manager)
    prefix = os.path.join(args.out_dir, f"ckpt-worker{args.index}-{mode}")
    records = []
    last_checkpoint = None
    for number, entry in enumerate(training.SCHEDULES["mixed"]):
        step(tf.constant([training.poison_for(entry, replica, mode) for replica in range(2)]))
        records.append(
            {
                "w": weights.numpy().tolist(),
                "scale": float(manager.variables[0].numpy()),
                "good_steps": int(manager.variables[1].numpy()),
                "skipped": int(manager.skipped_steps.numpy()),
                "global_step": int(global_step.numpy()),
            }
        )
        last_checkpoint = checkpoint.write(f"{prefix}-{number}")
        # Tells the test which checkpoint is this worker's last good one, even if a step fails.
        _dump(
            {"mode": mode, "step": number, "checkpoint": last_checkpoint},
            os.path.join(args.out_dir, f"worker{args.index}.progress.json"),
        )
        if args.die_after_step == number:
            os._exit(3)  # a crash: no clean-up, no goodbye to the peer
    return {"records": records, "checkpoint": last_checkpoint}


def _dump(report: dict, path: str) -> None:
    """Write atomically: a reader never sees half a report, even if this process dies."""
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    os.replace(temporary, path)


if __name__ == "__main__":
    raise SystemExit(main())
