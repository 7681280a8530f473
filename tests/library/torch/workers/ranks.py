"""One rank of a two-process torch.distributed (gloo, 127.0.0.1) job, for test_torch_distributed.

Usage: ranks.py JOB RANK WORLD_SIZE PORT OUT.json

JOB "agree": every case in one process (torch is imported once): a clean step, then a step where
only rank 1 overflows, then a clean step, under DDP and with plain per-rank gradients, in both
modes, with our scaler and (as the control) stock torch's or ours with is_distributed=False. Each
rank writes what it saw; the test compares the ranks.
JOB "die": rank 1 exits (os._exit) right before the scaler's all-reduce; rank 0 writes the error
its step raised and how long it took to come.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from npu_lossscale.torch import GradScaler

INIT_SCALE = 1024.0
# Rank 1's poisoned target: an inf in INF_NAN mode; in saturation mode a finite value whose
# scaled gradients pass 65504 even after DDP averages them with rank 0's.
POISON = {"inf_nan": float("inf"), "saturation": -1e6}
MODES = tuple(POISON)


def _model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _data(rank: int, poisoned: bool, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10 + rank)  # each rank its own batch
    x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)
    if poisoned:
        y[0, 0] = POISON[mode]
    return x, y


def _weights(model: nn.Module) -> list[float]:
    return [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


def _step(scaler: torch.amp.GradScaler, model: nn.Module, optimizer, x, y) -> None:
    optimizer.zero_grad()
    scaler.scale(((model(x) - y) ** 2).mean()).backward()
    scaler.step(optimizer)
    scaler.update()


def _case(rank: int, mode: str, ddp: bool, make_scaler) -> list[dict]:
    """Clean, overflowed on rank 1 only, clean: weights, Adam state, scale after each."""
    model = _model()
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    scaler = make_scaler(mode)
    seen = []
    for poisoned in (False, True, False):
        x, y = _data(rank, poisoned and rank == 1, mode)
        _step(scaler, model, optimizer, x, y)
        steps = [s["step"].item() for s in optimizer.state.values()]
        seen.append({"weights": _weights(model), "scale": scaler.get_scale(), "adam_steps": steps})
    return seen


def _ours(is_distributed: bool | None):
    return lambda mode: GradScaler(
        "cpu", INIT_SCALE, overflow_mode=mode, is_distributed=is_distributed
    )


def _stock(mode: str) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", INIT_SCALE)


def agree(rank: int) -> dict:
    results = {}
    for mode in MODES:
        for layout in ("ddp", "plain"):
            ddp = layout == "ddp"
            results[f"{layout}-{mode}-ours"] = _case(rank, mode, ddp, _ours(None))
        results[f"plain-{mode}-ours-true"] = _case(rank, mode, False, _ours(True))
        results[f"plain-{mode}-ours-false"] = _case(rank, mode, False, _ours(False))
    results["plain-inf_nan-stock"] = _case(rank, "inf_nan", False, _stock)
    return results


def die(rank: int) -> dict:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scaler = GradScaler("cpu", INIT_SCALE)
    x, y = _data(rank, False, "inf_nan")
    _step(scaler, model, optimizer, x, y)  # one step together first
    optimizer.zero_grad()
    scaler.scale(((model(x) - y) ** 2).mean()).backward()
    if rank == 1:
        os._exit(3)  # dies before the all-reduce in step()
    start = time.monotonic()
    try:
        scaler.step(optimizer)
    except Exception as error:  # what the survivor reports
        return {"error": f"{type(error).__name__}: {error}", "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def main() -> None:
    job, rank, world_size, port, out = sys.argv[1:]
    rank = int(rank)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=int(world_size),
        timeout=timedelta(seconds=10),
    )
    result = {"agree": agree, "die": die}[job](rank)
    with open(out, "w") as f:
        json.dump(result, f)
    if result.get("error") is None:
        dist.barrier()  # no rank tears the group down while another still talks to it
        # The DDP models of `agree` sit in reference cycles; freed only at interpreter exit, with
        # the gloo group they hold, gloo's threads can abort the process. Free them now.
        gc.collect()
        dist.destroy_process_group()
        return
    # The group lost a peer: tearing it down at interpreter exit can abort in gloo's threads
    # ("terminate called without an active exception"), which says nothing about the scaler.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
