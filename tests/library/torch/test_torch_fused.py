"""The fused CPU saturation check (npu_lossscale.torch.kernels) agrees with the pure-torch path.

The pure-torch path (amax and amin of each still-scaled gradient, then torch._foreach_mul_) is the
reference: the op must take the same decision and leave bitwise the same unscaled gradients, in
float32, float16 and bfloat16, at scales that are not powers of two, with the boundary values
planted (65504, -65504, 65503.9, +-inf, NaN). The decision is also checked against the rule
written out by hand. The scaler must use the op where it is built, keep the pure path elsewhere
(sparse gradients, float64, non-dense layouts), and fall back with one warning when it cannot be
built. The op is built once per run (the session fixture) into the usual cache.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.profiler import profile

from npu_lossscale.modes import OverflowMode
from npu_lossscale.torch import GradScaler, kernels, overflow

SAT = OverflowMode.SATURATION
OP_EVENT = "npu_lossscale::check_and_unscale_"
STOCK_EVENT = "aten::_amp_foreach_non_finite_check_and_unscale_"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 1/3000 and 1/(0.8 * 2**15) (a dynamic scale after one decrease) are not powers of two, so the
# multiply rounds; 2**-10 does not.
INV_SCALES = [1 / 3000.0, 1 / (0.8 * 2.0**15), 2.0**-10]
PLANTED = [None, 65504.0, -65504.0, 65503.9, math.inf, -math.inf, math.nan]
# Shapes: a matrix, more elements than one thread's chunk (1 << 16), a 0-d tensor, an empty one.
SHAPES = [(257, 129), (70001,), (), (0,), (33,)]


@pytest.fixture(scope="session")
def op():
    fused = kernels.fused_op(saturation=True)
    if fused is None:
        pytest.skip(f"fused op unavailable here: {kernels.unavailable_reason()}")
    return fused


@pytest.fixture
def pure(monkeypatch):
    """Run the block with the fused op turned off (the pure-torch path), then on again."""

    class Switch:
        def __enter__(self):
            monkeypatch.setenv(kernels.DISABLE_ENV, "0")

        def __exit__(self, *exc):
            monkeypatch.delenv(kernels.DISABLE_ENV)

    return Switch()


def _gradients(dtype: torch.dtype, planted: float | None, seed: int) -> list[torch.Tensor]:
    """Still-scaled gradients: magnitudes from 1e-4 (subnormal once unscaled in float16) to 6e4,
    below 65504 unless a value is planted, at a chunk's last element of the long tensor."""
    generator = torch.Generator().manual_seed(seed)
    grads = []
    for shape in SHAPES:
        values = torch.randn(shape, generator=generator)
        values = values * 10 ** (torch.rand(shape, generator=generator) * 8 - 4)
        grads.append(values.clamp(-60000, 60000).to(dtype))
    if planted is not None:
        grads[1][(1 << 16) - 1] = planted
        grads[0][3, 7] = planted
    grads.append(grads.pop(0).t())  # transposed: dense, not contiguous
    return grads


def _by_hand(grads: list[torch.Tensor], saturation: bool) -> bool:
    """The rule written out: some scaled element is NaN or infinite, or (saturation) has
    |g| >= 65504."""
    limit = 65504.0 if saturation else math.inf
    return any(bool((g.double().isnan() | (g.double().abs() >= limit)).any()) for g in grads)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return tensor.contiguous().view(ints[tensor.dtype])


def _assert_same_values(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Bitwise equal, except that a NaN need only be NaN (torch's own kernels differ in the
    payload they write for it)."""
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(e))
        assert torch.equal(_bits(a)[~nan.contiguous()], _bits(e)[~nan.contiguous()])


def _pure_path(grads: list[torch.Tensor], inv: torch.Tensor, saturation: bool) -> float:
    """What the scaler runs for gradients the op does not take: the three-pass saturation
    check, or torch's own inf/NaN kernel (stock GradScaler's)."""
    found = torch.zeros(())
    if not saturation:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        return float(found)
    beyond = overflow._beyond(grads, 65504.0)
    if beyond is not None:
        found.add_(beyond)
    torch._foreach_mul_(grads, inv)
    return float(found)


@pytest.mark.parametrize("saturation", [True, False], ids=["saturation", "inf_nan"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inv_scale", INV_SCALES)
@pytest.mark.parametrize("planted", PLANTED, ids=repr)
def test_op_matches_the_pure_path_bit_for_bit(op, saturation, dtype, inv_scale, planted):
    grads = _gradients(dtype, planted, seed=len(str(planted)) + int(1 / inv_scale))
    reference = [g.clone() for g in grads]
    inv = torch.tensor(inv_scale, dtype=torch.float32)
    found = torch.zeros(())
    versions = [g._version for g in grads]

    by_hand = _by_hand(reference, saturation)

    assert op(grads, found, inv, saturation) is True

    assert bool(found) == bool(_pure_path(reference, inv, saturation)) == by_hand
    finite = planted is None or math.isfinite(planted)
    if planted is not None and not (dtype == torch.float32 and planted == 65503.9):
        # 65503.9 is 65504 in float16 and 65536 in bfloat16, finite in both
        assert bool(found) == (saturation or not finite)
    _assert_same_values(grads, reference)
    assert all(g._version > v for g, v in zip(grads, versions))


def test_op_sets_the_flag_and_never_clears_it(op):
    inv = torch.tensor(0.5)
    clean = [torch.ones(5)]
    found = torch.zeros(())
    assert op(clean, found, inv, True) and float(found) == 0.0
    found.fill_(1.0)
    assert op(clean, found, inv, False) and float(found) == 1.0
    assert torch.equal(clean[0], torch.full((5,), 0.25))
    assert op([], found, inv, True)


def test_op_refuses_what_it_does_not_take_and_touches_nothing(op):
    inv, found = torch.tensor(0.5), torch.zeros(())
    good = torch.full((4,), 70000.0)
    refused = [
        [good, torch.full((4,), 70000.0, dtype=torch.float64)],
        [good, torch.full((6, 8), 70000.0)[:, :4]],  # a slice: not one dense block
        [good, torch.full((8,), 70000.0).expand(2, 8)],  # overlapping
    ]
    for grads in refused:
        before = [g.clone() for g in grads]
        assert op(grads, found, inv, True) is False
        assert all(torch.equal(g, b) for g, b in zip(grads, before)) and float(found) == 0.0
    assert op([good], torch.zeros((), dtype=torch.float64), inv, True) is False
    assert op([good], found, torch.tensor(0.5, dtype=torch.float64), True) is False
    assert op([good], found, inv, False) is True and float(found) == 0.0  # finite: inf_nan passes
    assert op([torch.full((4,), 70000.0)], found, inv, True) is True and float(found) == 1.0


def test_results_do_not_depend_on_the_thread_count(op):
    inv = torch.tensor(1 / 3000.0)
    base = _gradients(torch.float16, 65504.0, seed=3) + _gradients(torch.float32, None, seed=4)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 4):
            torch.set_num_threads(count)
            grads = [g.clone() for g in base]
            found = torch.zeros(())
            op(grads, found, inv, True)
            results.append((float(found), grads))
    finally:
        torch.set_num_threads(threads)
    for found, grads in results[1:]:
        assert found == results[0][0] == 1.0
        _assert_same_values(grads, results[0][1])


def _model(dtype: torch.dtype, sparse: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1)]
    if sparse:
        layers.insert(0, nn.Embedding(10, 8, sparse=True))
    return nn.Sequential(*layers).to(dtype)


def _steps(dtype, sparse, use_fused, pure, mode="saturation") -> tuple[list, list, list[str]]:
    """Train a few steps from a scale the first steps overflow at (2**20 in saturation mode:
    still-scaled gradients pass 65504 while staying finite; 2**127 in inf_nan mode, where they
    pass float32's largest value); the gradients after each unscale, the decisions, the op
    events."""
    model = _model(dtype, sparse)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # inf_nan: a loss weighted up so that gradients times 2**127 pass float32's range
    init, weight = (2.0**20, 1.0) if mode == "saturation" else (2.0**127, 1e3)
    scaler = GradScaler("cpu", init_scale=init, overflow_mode=mode)
    generator = torch.Generator().manual_seed(5)
    grads, decisions, events = [], [], []
    for _ in range(12):
        if sparse:
            x = torch.randint(0, 10, (16,), generator=generator)
        else:
            x = torch.randn(16, 8, generator=generator, dtype=dtype)
        optimizer.zero_grad()
        scaler.scale(model(x).float().pow(2).mean() * weight).backward()
        if use_fused:
            with profile() as prof:
                scaler.unscale_(optimizer)
            events += [event.name for event in prof.events()]
        else:
            with pure:
                scaler.unscale_(optimizer)
        grads.append([p.grad.to_dense().clone() for p in model.parameters()])
        scaler.step(optimizer)
        scaler.update()
        decisions.append((scaler.last_step_applied, scaler.get_scale()))
    return grads, decisions, events


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaler_uses_the_op_and_decides_as_the_pure_path(op, pure, dtype):
    fused_grads, fused_decisions, events = _steps(dtype, False, True, pure)
    pure_grads, pure_decisions, _ = _steps(dtype, False, False, pure)
    assert fused_decisions == pure_decisions
    applied = [applied for applied, _ in fused_decisions]
    assert not all(applied) and any(applied)  # both kinds of step were taken
    for fused, reference in zip(fused_grads, pure_grads):
        _assert_same_values(fused, reference)
    assert OP_EVENT in events and "aten::amax" not in events


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inf_nan_scaler_uses_the_op_and_decides_as_torchs_kernel(op, pure, dtype):
    fused_grads, fused_decisions, events = _steps(dtype, False, True, pure, "inf_nan")
    stock_grads, stock_decisions, _ = _steps(dtype, False, False, pure, "inf_nan")
    assert fused_decisions == stock_decisions
    applied = [applied for applied, _ in fused_decisions]
    assert not all(applied) and any(applied)  # both kinds of step were taken
    for fused, reference in zip(fused_grads, stock_grads):
        _assert_same_values(fused, reference)
    assert OP_EVENT in events and STOCK_EVENT not in events


def test_inf_nan_sparse_gradients_keep_torchs_kernel(op, pure):
    fused_grads, fused_decisions, events = _steps(torch.float32, True, True, pure, "inf_nan")
    stock_grads, stock_decisions, _ = _steps(torch.float32, True, False, pure, "inf_nan")
    assert fused_decisions == stock_decisions
    for fused, reference in zip(fused_grads, stock_grads):
        _assert_same_values(fused, reference)
    assert OP_EVENT in events and STOCK_EVENT in events


def test_sparse_gradients_keep_the_pure_path(op, pure):
    fused_grads, fused_decisions, events = _steps(torch.float32, True, True, pure)
    pure_grads, pure_decisions, _ = _steps(torch.float32, True, False, pure)
    assert fused_decisions == pure_decisions
    for fused, reference in zip(fused_grads, pure_grads):
        _assert_same_values(fused, reference)
    # The dense layers through the op, the embedding's sparse gradient through amax/amin.
    assert OP_EVENT in events and "aten::amax" in events


def test_float64_gradients_keep_the_pure_path(op, pure):
    fused_grads, fused_decisions, events = _steps(torch.float64, False, True, pure)
    pure_grads, pure_decisions, _ = _steps(torch.float64, False, False, pure)
    assert fused_decisions == pure_decisions
    for fused, reference in zip(fused_grads, pure_grads):
        assert all(torch.equal(a, b) for a, b in zip(fused, reference))
    assert "aten::amax" in events  # the op was asked, refused, and the pure path ran


SCRIPT = """
import logging, math, torch
from npu_lossscale.torch import GradScaler, kernels
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
print("BUILT", kernels.built())
model = torch.nn.Linear(4, 1, bias=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler("cpu", init_scale=INIT, overflow_mode=MODE)
for value in (FIRST, 1e-3):  # an overflowing step, then a clean one
    optimizer.zero_grad()
    scaler.scale(model(torch.full((1, 4), value)).sum() + 100).backward()
    scaler.unscale_(optimizer)
    print("GRAD", model.weight.grad.tolist()[0][0], "FOUND",
          float(scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"][
              torch.device("cpu")]))
    scaler.step(optimizer)
    scaler.update()
print("REASON", kernels.unavailable_reason(), "BUILT", kernels.built())
"""


# mode: (initial scale, first input, what the first step's unscaled gradient reads): the first
# step overflows, by saturation (2**20 / 2**20) or by reaching inf (4 * 2**127).
RUNS = {
    "saturation": ("2.0**20", "1.0", "GRAD 1.0 FOUND 1.0"),
    "inf_nan": ("2.0**127", "4.0", "GRAD inf FOUND 1.0"),
}


def _run(tmp_path, mode: str = "saturation", **env_changes: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NPU_LOSSSCALE_CACHE=str(tmp_path / "cache"), **env_changes)
    if kernels.DISABLE_ENV not in env_changes:
        env.pop(kernels.DISABLE_ENV, None)
    init, first, first_line = RUNS[mode]
    script = textwrap.dedent(SCRIPT).replace("INIT", init).replace("MODE", repr(mode))
    done = subprocess.run(
        [sys.executable, "-c", script.replace("FIRST", first)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # Either path: the first step overflows, the second, at half the scale, is clean.
    assert first_line in done.stdout and "GRAD 0.001" in done.stdout, done.stdout
    assert "FOUND 0.0" in done.stdout
    return done


def test_first_use_builds_once_into_the_cache_and_later_processes_reuse_it(tmp_path):
    first = _run(tmp_path)
    assert "BUILT False" in first.stdout and "REASON None BUILT True" in first.stdout
    assert first.stderr.count("compiling the fused CPU check for torch") == 1, first.stderr
    assert list((tmp_path / "cache").glob("*/" + kernels.LIBRARY))
    second = _run(tmp_path)
    assert "BUILT True" in second.stdout and "compiling" not in second.stderr
    assert "WARNING" not in first.stderr + second.stderr


def test_build_failure_warns_once_and_falls_back(tmp_path):
    done = _run(tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, done.stderr
    assert "pure-torch" in warnings[0] and "no-such-compiler" in warnings[0]
    assert "REASON no C++ compiler" in done.stdout


def test_build_failure_in_inf_nan_mode_falls_back_to_torchs_kernel_quietly(tmp_path):
    done = _run(tmp_path, "inf_nan", CXX=str(tmp_path / "no-such-compiler"))
    assert "WARNING" not in done.stderr, done.stderr
    infos = [line for line in done.stderr.splitlines() if "check-and-unscale not used" in line]
    assert len(infos) == 1 and infos[0].startswith("INFO") and "inf/NaN kernel" in infos[0]
    assert "REASON no C++ compiler" in done.stdout


def test_switched_off_builds_nothing_and_says_nothing(tmp_path):
    done = _run(tmp_path, **{kernels.DISABLE_ENV: "0"})
    assert "WARNING" not in done.stderr and "compiling" not in done.stderr
    assert "REASON None" in done.stdout and not (tmp_path / "cache").exists()


def test_a_scaler_looks_the_op_up_once_and_keeps_it(op, monkeypatch):
    """The switch is read when a scaler first unscales CPU gradients (reading the environment
    after every backward pass cost more than the op): set before that, it holds for the scaler's
    life; later scalers read it again."""

    def unscale_events(scaler: GradScaler) -> list[str]:
        model = _model(torch.float32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.scale(model(torch.ones(4, 8)).sum()).backward()
        with profile() as prof:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        return [event.name for event in prof.events()]

    first = GradScaler("cpu", overflow_mode="inf_nan")
    assert OP_EVENT in unscale_events(first)
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    assert OP_EVENT in unscale_events(first)
    later = GradScaler("cpu", overflow_mode="inf_nan")
    events = unscale_events(later)
    assert OP_EVENT not in events and STOCK_EVENT in events


DTENSOR_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
from npu_lossscale.torch import GradScaler
mesh = DeviceMesh("cpu", [0])
for value in (1.0, float("inf")):
    weight = torch.nn.Parameter(distribute_tensor(torch.ones(8), mesh, [Shard(0)]))
    optimizer = torch.optim.SGD([weight], 0.1)
    scaler = GradScaler("cpu", overflow_mode="inf_nan")
    scaler.scale((weight * weight * value).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    print("STEP", value, weight.full_tensor()[0].item(), scaler.skipped_steps)
dist.destroy_process_group()
"""


def test_dtensor_gradients_keep_torchs_kernel(op):
    """FSDP2 / tensor parallel gradients are DTensors, which would route the op to DTensor's own
    dispatch and fail there: the op declines them and torch's kernel (which DTensor supports)
    checks and unscales them, as before the op served inf_nan mode."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", DTENSOR_SCRIPT, str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STEP 1.0 0.800000011920929 0" in done.stdout, done.stdout
    assert "STEP inf 1.0 1" in done.stdout, done.stdout
