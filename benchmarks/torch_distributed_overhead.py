"""Per-step cost of the all-reduced overflow decision in PyTorch: is_distributed=True vs False.

A two-process gloo job on 127.0.0.1 trains one DistributedDataParallel MLP (Adam, bfloat16
autocast, as a user's loop) with our GradScaler, two scalers taking turns on the same model: one
all-reduces the found-inf flag over the process group so every rank skips or applies together
(is_distributed=True), the other decides from the rank's own gradients (is_distributed=False, the
check stock torch makes). Every round steps the model a couple of times with each, in an order both
ranks draw from the same seed, so machine noise hits both alike. Rank 0's wall time is reported
(the collectives keep the ranks in step): the median step of each, their paired difference and
their ratio.

The rendezvous store listens on a port the system picks at run time; the job has a hard time
limit, and the worker processes are ended however the run ends.

Usage: python benchmarks/torch_distributed_overhead.py [--rounds N] [--steps N] [--width W]
           [--depth D] [--batch B] [--mode inf_nan|saturation] [--timeout S] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import queue
import random
import statistics
import time
from multiprocessing.context import SpawnContext, SpawnProcess

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch_overhead import INIT_SCALE, MODES, Loop, keep_freed_memory, mlp

from npu_lossscale.torch import GradScaler

HOST = "127.0.0.1"
WORLD = 2
VARIANTS = ("all-reduced", "local")


def worker(rank: int, port: int, args: argparse.Namespace, results: mp.Queue) -> None:
    """One rank: join the group, run the interleaved rounds, rank 0 sends its timings home."""
    keep_freed_memory()
    torch.set_num_threads(1)  # two ranks on a small machine: one core each
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only, whatever the host's name
    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore(HOST, port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    try:
        loop = Loop(DistributedDataParallel(mlp(args.width, args.depth)), args.width, args.batch)
        scalers = {
            name: GradScaler(
                "cpu",
                init_scale=INIT_SCALE,
                overflow_mode=args.mode,
                is_distributed=name == "all-reduced",
            )
            for name in VARIANTS
        }
        for scaler in scalers.values():  # DDP's buckets, Adam's state: outside the timing
            for _ in range(3):
                loop.step(scaler)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        order = list(VARIANTS)
        shuffler = random.Random(0)  # the same order on every rank: the collectives must match
        for _ in range(args.rounds):
            shuffler.shuffle(order)
            for name in order:
                started = time.perf_counter()
                for _ in range(args.steps):
                    loop.step(scalers[name])
                times[name].append((time.perf_counter() - started) / args.steps)
        if rank == 0:
            skipped = {name: scaler.skipped_steps for name, scaler in scalers.items()}
            params = sum(p.numel() for p in loop.model.parameters())
            results.put((times, skipped, params))
        dist.barrier()  # no rank tears the group down while another still talks to it
        # DDP sits in a reference cycle: left to interpreter exit, it frees the gloo group it
        # holds there, and gloo's threads can abort the rank. Free it while all is alive.
        del loop
        gc.collect()
    finally:
        dist.destroy_process_group()


def run_job(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, int], int]:
    """Start both ranks, wait for rank 0's results within the time limit, always end the ranks."""
    context: SpawnContext = mp.get_context("spawn")
    timeout = datetime.timedelta(seconds=args.timeout)
    # Port 0: the system picks a free one; the store lives here and the ranks connect to it.
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    results = context.Queue()
    ranks: list[SpawnProcess] = [
        context.Process(target=worker, args=(rank, store.port, args, results), daemon=True)
        for rank in range(WORLD)
    ]
    deadline = time.monotonic() + args.timeout
    grace = 0.0  # seconds a rank may take to leave the group once rank 0's results are in
    try:
        for process in ranks:
            process.start()
        while True:
            try:
                outcome = results.get(timeout=1.0)
                grace = 10.0
                return outcome
            except queue.Empty:
                failed = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
                if failed:
                    message = f"a rank failed (exit codes {failed}); see its traceback above"
                    raise SystemExit(message) from None
                if time.monotonic() > deadline:
                    raise SystemExit(f"the job did not finish within {args.timeout} s") from None
    finally:
        for process in ranks:
            process.join(timeout=grace)
            if process.is_alive():
                process.kill()
                process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    parser.add_argument("--width", type=int, default=512, help="units per hidden layer")
    parser.add_argument("--depth", type=int, default=3, help="hidden layers")
    parser.add_argument("--batch", type=int, default=8, help="batch size per rank")
    parser.add_argument("--mode", choices=MODES, default="inf_nan", help="overflow mode")
    parser.add_argument("--timeout", type=int, default=300, help="hard limit for the job, s")
    parser.add_argument("--quick", action="store_true", help="a toy size, for tests")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.width, args.depth = 3, 2, 32, 1
    for flag in ("rounds", "steps", "width", "depth", "batch", "timeout"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")

    times, skipped, params = run_job(args)
    print(
        f"gloo, {WORLD} processes on {HOST}, 1 thread each: DDP {args.depth}x{args.width} MLP, "
        f"{params / 1e6:.2f}M parameters, batch {args.batch} per rank, Adam, bfloat16 autocast, "
        f"overflow_mode={args.mode!r}; {args.rounds} interleaved rounds x {args.steps} steps "
        f"(rank 0 wall time, medians)"
    )
    for name in VARIANTS:
        flag = name == "all-reduced"
        print(
            f"  {name:12s} (is_distributed={flag!s:5s}) "
            f"{statistics.median(times[name]) * 1e3:8.3f} ms/step"
        )
    paired = [a - b for a, b in zip(times["all-reduced"], times["local"])]
    print(
        f"  all-reduced minus local, paired by round: {statistics.median(paired) * 1e3:.3f} ms/step"
    )
    ratio = statistics.median(times["all-reduced"]) / statistics.median(times["local"])
    print(f"  ratio all-reduced / local: {ratio:.3f}")
    print(f"steps skipped (rank 0): {skipped}")


if __name__ == "__main__":
    main()
