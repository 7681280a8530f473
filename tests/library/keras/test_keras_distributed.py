"""npu_lossscale.keras under MirroredStrategy over two logical CPUs, one replica overflowing.

The scenarios run in one subprocess (tests/library/keras/workers/keras_mirrored_worker.py) because
logical devices must be configured before TensorFlow initialises, which another test module in this
process may already have done. Every scenario runs clean, overflowed (on one replica only), clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).parent / "workers" / "keras_mirrored_worker.py"
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("keras_mirrored") / "results.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == 0, output[-6000:]
    data = json.loads(out.read_text())
    assert len(data["devices"]) == 2
    return data


def _check_one_decision(steps: list[dict]) -> None:
    clean, overflowed, again = steps
    for step in steps:  # both replicas hold the same state after every step
        for name in ("weights", "slots"):
            for per_replica in step[name]:
                assert per_replica[0] == per_replica[1], name
        for name in ("scale", "skipped", "iterations"):
            assert step[name][0] == step[name][1], name
    assert clean["scale"] == [1024.0, 1024.0] and clean["iterations"] == [1, 1]
    # The clean step is the one the bare optimizer takes, from every replica's own gradients.
    for per_replica, bare in zip(clean["weights"], clean["bare_weights"]):
        np.testing.assert_allclose(per_replica, bare, rtol=1e-6, atol=0)
    # The overflow seen by one replica skipped the step on both: nothing moved.
    assert overflowed["weights"] == clean["weights"] and overflowed["slots"] == clean["slots"]
    assert overflowed["scale"] == [512.0, 512.0] and overflowed["skipped"] == [1, 1]
    assert overflowed["iterations"] == [1, 1]
    assert again["weights"] != clean["weights"] and again["iterations"] == [2, 2]


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("replica", [0, 1])
def test_model_fit_takes_one_decision_for_all_replicas(mirrored: dict, mode: str, replica: int):
    _check_one_decision(mirrored["fit"][f"{mode}-{replica}"])


@pytest.mark.parametrize("replica", ["0", "1"])
def test_custom_loop_under_strategy_run(mirrored: dict, replica: str) -> None:
    _check_one_decision(mirrored["loop"][replica])


def test_a_manager_driven_by_the_script_reduces_its_flag(mirrored: dict) -> None:
    reduced = mirrored["manager"]["True"]
    assert [s["scale"] for s in reduced] == [[1024.0] * 2, [512.0] * 2, [512.0] * 2]
    assert [s["skipped"] for s in reduced] == [[0, 0], [1, 1], [1, 1]]
    # Control: without is_distributed replica 1's overflow is lost (the state follows replica 0).
    local = mirrored["manager"]["False"]
    assert [s["scale"] for s in local] == [[1024.0] * 2] * 3


def test_is_distributed_false_with_two_replicas_is_refused(mirrored: dict) -> None:
    assert "is_distributed=False" in mirrored["refused"]
    assert "2 replicas" in mirrored["refused"]
