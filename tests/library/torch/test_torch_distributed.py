"""npu_lossscale.torch.GradScaler over real torch.distributed jobs: two gloo processes on 127.0.0.1.

Two jobs run at once (tests/library/torch/workers/ranks.py), each with a free port picked now, a
hard timeout and its processes killed whatever happens: "agree" runs every agreement case in one
pair of processes (torch is imported once per process), "die" loses rank 1 just before the all-
reduce. In every agreement case rank 1 alone overflows on the second of three steps."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from npu_lossscale.torch import GradScaler

WORKER = Path(__file__).parent / "workers" / "ranks.py"
WORLD_SIZE = 2
TIMEOUT_S = 120  # the jobs take seconds; this only bounds a hang
MODES = ("inf_nan", "saturation")

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(job: str, out_dir: Path) -> list[tuple[subprocess.Popen, Path]]:
    port = _free_port()
    ranks = []
    for rank in range(WORLD_SIZE):
        out = out_dir / f"{job}-{rank}.json"
        command = [
            sys.executable,
            str(WORKER),
            job,
            str(rank),
            str(WORLD_SIZE),
            str(port),
            str(out),
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ranks.append((process, out))
    return ranks


def _finish(ranks: list[tuple[subprocess.Popen, Path]], deadline: float) -> list[dict]:
    """Wait for every rank (killing all of them on a timeout or an error) and collect them."""
    results = []
    try:
        for process, out in ranks:
            output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(
                {
                    "returncode": process.returncode,
                    "output": output[-4000:],
                    "data": json.loads(out.read_text()) if out.exists() else None,
                }
            )
    finally:
        for process, _ in ranks:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    return results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    out_dir = tmp_path_factory.mktemp("torch_distributed")
    started = {job: _start(job, out_dir) for job in ("agree", "die")}
    deadline = time.monotonic() + TIMEOUT_S
    return {job: _finish(ranks, deadline) for job, ranks in started.items()}


def _agreed(jobs: dict, case: str) -> list[list[dict]]:
    ranks = jobs["agree"]
    for rank in ranks:
        assert rank["returncode"] == 0, rank["output"]
    return [rank["data"][case] for rank in ranks]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["ddp", "plain", "plain-explicit"])
def test_overflow_on_one_rank_skips_on_every_rank(jobs: dict, layout: str, mode: str) -> None:
    case = {"ddp": f"ddp-{mode}-ours", "plain": f"plain-{mode}-ours"}.get(
        layout, f"plain-{mode}-ours-true"
    )
    rank0, rank1 = _agreed(jobs, case)
    clean, overflowed, again = zip(rank0, rank1)
    for a, b in (clean, overflowed, again):
        assert a["scale"] == b["scale"] and a["adam_steps"] == b["adam_steps"]
    if layout == "ddp":  # averaged gradients: the ranks hold the same weights throughout
        assert all(a["weights"] == b["weights"] for a, b in (clean, overflowed, again))
    # Nothing moved on either rank, Adam's step counts included; the scale backed off on both.
    assert [s["weights"] for s in overflowed] == [s["weights"] for s in clean]
    assert [s["adam_steps"] for s in overflowed] == [[1.0] * 4] * 2
    assert [s["scale"] for s in overflowed] == [512.0, 512.0]
    assert [s["adam_steps"] for s in again] == [[2.0] * 4] * 2


def test_stock_torch_diverges_in_the_same_job(jobs: dict) -> None:
    """The control: without the reduction, only rank 1 skips, and the ranks part ways."""
    rank0, rank1 = _agreed(jobs, "plain-inf_nan-stock")
    assert rank0[1]["weights"] != rank0[0]["weights"]  # rank 0 applied its step
    assert rank1[1]["weights"] == rank1[0]["weights"]  # rank 1 skipped
    assert (rank0[1]["scale"], rank1[1]["scale"]) == (1024.0, 512.0)
    assert (rank0[2]["adam_steps"], rank1[2]["adam_steps"]) == ([3.0] * 4, [2.0] * 4)


@pytest.mark.parametrize("mode", MODES)
def test_is_distributed_false_decides_per_rank(jobs: dict, mode: str) -> None:
    rank0, rank1 = _agreed(jobs, f"plain-{mode}-ours-false")
    assert (rank0[1]["scale"], rank1[1]["scale"]) == (1024.0, 512.0)
    assert rank0[1]["weights"] != rank0[0]["weights"]


def test_a_rank_that_dies_ends_the_other_with_an_error(jobs: dict) -> None:
    survivor, dead = jobs["die"]
    assert dead["returncode"] == 3, dead["output"]
    assert survivor["returncode"] == 0, survivor["output"]
    report = survivor["data"]
    assert report["error"].startswith("RuntimeError: npu_lossscale.torch: summing the overflow")
    # gloo words the lost peer its own way (connection closed, timeout, remote worker hanging),
    # depending on when it notices: ours says what failed and carries gloo's words along.
    assert "another rank has probably died or hung (" in report["error"], report
    assert len(report["error"]) > len("RuntimeError: ") + 160, report
    assert report["seconds"] < 30, report  # bounded by gloo's 10 s timeout, not a hang


def test_is_distributed_true_without_a_group_raises_at_the_first_scale() -> None:
    assert not torch.distributed.is_initialized()
    scaler = GradScaler("cpu", is_distributed=True)  # building it is fine
    with pytest.raises(RuntimeError, match="init_process_group"):
        scaler.scale(torch.ones(()))
    assert GradScaler("cpu").scale(torch.ones(())).item() == 2.0**16  # None: no group, no reduce
