"""is_distributed=True across two real processes: MultiWorkerMirroredStrategy over 127.0.0.1.

The workers (tests/library/tf/workers/multiworker_worker.py) train the same tiny model with an
overflow injected on one worker only; the expected numbers are derived by hand in
tests/distributed_expected.py. Every job runs under a hard timeout and its processes are killed in a
finally block, whatever happens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from distributed_expected import EXPECTED, W0

from npu_lossscale import ExponentialUpdateLossScaleManager

WORKER = Path(__file__).parent / "workers" / "multiworker_worker.py"
JOB_TIMEOUT_S = 150


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _run_job(out_dir: Path, extra: dict[int, list[str]] | None = None) -> list[tuple[int, str]]:
    """Start both workers, wait at most JOB_TIMEOUT_S, always kill what is left."""
    ports = ",".join(str(port) for port in _free_ports(2))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    processes = []
    try:
        for index in range(2):
            command = [sys.executable, str(WORKER), str(index), ports, str(out_dir)]
            command += (extra or {}).get(index, [])
            processes.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        deadline = time.monotonic() + JOB_TIMEOUT_S
        outcomes = []
        for process in processes:
            remaining = max(1.0, deadline - time.monotonic())
            output, _ = process.communicate(timeout=remaining)
            outcomes.append((process.returncode, output))
        return outcomes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _restore(prefix: str, mode: str) -> tuple[np.ndarray, int, ExponentialUpdateLossScaleManager]:
    """Restore a worker's checkpoint into fresh, non-distributed objects in this process."""
    weights = tf.Variable([0.0, 0.0])
    global_step = tf.Variable(0, dtype=tf.int64)
    manager = ExponentialUpdateLossScaleManager(
        1, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode=mode
    )
    checkpoint = tf.train.Checkpoint(weights=weights, global_step=global_step, manager=manager)
    checkpoint.read(prefix).assert_existing_objects_matched()
    return weights.numpy(), int(global_step.numpy()), manager


def _check_records(records: list[dict], expected: list[dict]) -> None:
    assert len(records) == len(expected)
    for number, (seen, want) in enumerate(zip(records, expected)):
        np.testing.assert_array_equal(seen["w"], want["w"], err_msg=f"weights after step {number}")
        for key in ("scale", "good_steps", "skipped", "global_step"):
            assert seen[key] == want[key], (number, key, seen, want)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, str]]]:
    out_dir = tmp_path_factory.mktemp("multiworker")
    return out_dir, _run_job(out_dir)


def test_both_workers_finish(job: tuple[Path, list[tuple[int, str]]]) -> None:
    _, outcomes = job
    for index, (returncode, output) in enumerate(outcomes):
        assert returncode == 0, f"worker {index} failed:\n{output[-4000:]}"


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_workers_agree_step_by_step_with_overflow_on_one_worker(
    job: tuple[Path, list[tuple[int, str]]], mode: str
) -> None:
    out_dir, outcomes = job
    assert all(returncode == 0 for returncode, _ in outcomes), outcomes
    reports = [json.loads((out_dir / f"worker{i}.json").read_text()) for i in range(2)]
    assert [report["num_replicas"] for report in reports] == [2, 2]
    for report in reports:
        _check_records(report["modes"][mode]["records"], EXPECTED["mixed"])
    assert reports[0]["modes"][mode]["records"] == reports[1]["modes"][mode]["records"]


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_checkpoint_of_either_worker_restores_the_same_state(
    job: tuple[Path, list[tuple[int, str]]], mode: str
) -> None:
    out_dir, _ = job
    restored = []
    for index in range(2):
        report = json.loads((out_dir / f"worker{index}.json").read_text())
        weights, global_step, manager = _restore(report["modes"][mode]["checkpoint"], mode)
        state = [value.numpy().item() for value in manager.variables]
        restored.append((weights.tolist(), global_step, state))
    assert restored[0] == restored[1]
    weights, global_step, (scale, good, bad, skipped, _) = restored[0]
    np.testing.assert_array_equal(weights, W0 / 16)
    assert (global_step, scale, good, bad, skipped) == (4, 128.0, 1, 0, 2)


def test_dead_peer_gives_survivor_a_clear_error_in_bounded_time(tmp_path: Path) -> None:
    """Worker 1 crashes right after step 3; worker 0's step 4 collective must fail, not hang."""
    started = time.monotonic()
    outcomes = _run_job(tmp_path, extra={1: ["--die-after-step", "3"]})
    elapsed = time.monotonic() - started
    (survivor_rc, survivor_output), (dead_rc, _) = outcomes
    assert dead_rc == 3
    assert survivor_rc == 2, survivor_output[-4000:]
    assert elapsed < JOB_TIMEOUT_S
    report = json.loads((tmp_path / "worker0.json").read_text())
    assert report["error"]["type"] in {"UnavailableError", "DeadlineExceededError"}, report
    assert report["error"]["message"]

    # The survivor's last checkpoint (after step 3, written before the peer died) restores to the
    # hand-derived state after four steps of the schedule.
    progress = json.loads((tmp_path / "worker0.progress.json").read_text())
    assert (progress["mode"], progress["step"]) == ("inf_nan", 3)
    weights, global_step, manager = _restore(progress["checkpoint"], "inf_nan")
    np.testing.assert_array_equal(weights, W0 / 8)
    assert global_step == 3
    assert manager.variables[0].numpy() == 256.0
    assert manager.skipped_steps.numpy() == 1
