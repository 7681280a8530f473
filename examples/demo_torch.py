"""Why the overflow mode matters, in PyTorch: an fp16 model on a saturating chip, in either mode.

The model computes in float16 (master weights stay float32) and trains with
`npu_lossscale.torch.GradScaler` from a loss scale of 2^32, far too large, so its backward pass
overflows for real. On a first-generation Atlas chip (saturation mode) an overflowing float16
result is clamped to +-65504 instead of becoming inf, and an invalid one comes out as 0; this demo
reproduces that on the CPU by saturating every float16 result, forward and backward. Three runs:

- a saturating chip with overflow_mode="saturation": the matching mode sees every overflow;
- the same chip with overflow_mode="inf_nan": the wrong mode sees no inf, so it applies every
  overflowed step and never lowers the scale;
- an IEEE device (inf/NaN, like a GPU or an Atlas A2) with overflow_mode="inf_nan": matching again.

Each run also counts the true overflows (a scaled gradient that reached 65504 or is not finite), so
the table can say how many each mode caught. The TensorFlow version is library_demo.py.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from npu_lossscale.torch import GradScaler, kernels

FP16_MAX = 65504.0
FEATURES, HIDDEN, BATCH = 16, 64, 32


def format_scale(scale: float) -> str:
    """Loss scales as library_demo.py prints them: powers of two as 2^k, others as a number."""
    exponent = math.log2(scale) if scale > 0 else math.nan
    if exponent == int(exponent):
        return f"2^{int(exponent)}"
    return f"{scale:.6g}"


def chip_result(values: torch.Tensor) -> torch.Tensor:
    """What a saturating chip writes: overflow clamped to +-65504, NaN (invalid) as 0."""
    return torch.nan_to_num(values, nan=0.0, posinf=FP16_MAX, neginf=-FP16_MAX).clamp(
        -FP16_MAX, FP16_MAX
    )


class Saturate(torch.autograd.Function):
    """Identity that saturates its result and its gradient, as the chip does after every op."""

    @staticmethod
    def forward(ctx, values: torch.Tensor) -> torch.Tensor:
        return chip_result(values)

    @staticmethod
    def backward(ctx, upstream: torch.Tensor) -> torch.Tensor:
        return chip_result(upstream)


class TwoLayer(torch.nn.Module):
    """Two dense layers computed in float16 from float32 master weights."""

    def __init__(self, saturating: bool) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(FEATURES, HIDDEN)))
        self.w2 = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(HIDDEN, 1)))
        self.sat: Callable[[torch.Tensor], torch.Tensor] = (
            Saturate.apply if saturating else (lambda values: values)
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        sat = self.sat
        x16, w1_16, w2_16 = (sat(t.half()) for t in (features, self.w1, self.w2))
        hidden = sat(torch.relu(sat(x16 @ w1_16)))
        return sat(hidden @ w2_16).float()


@dataclass
class Run:
    """One training run's settings and what it recorded per step."""

    title: str
    chip: str  # "saturation" or "inf_nan": what the simulated device does on overflow
    mode: str  # the overflow_mode given to the scaler
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    overflows: int = 0  # true overflows, whatever the mode saw
    skipped: int = 0
    applied: int = 0


def overflowed(model: torch.nn.Module) -> bool:
    """The truth, whatever the mode: did any scaled gradient reach 65504 or stop being finite?"""
    return any(
        bool((~torch.isfinite(p.grad) | (p.grad.abs() >= FP16_MAX)).any())
        for p in model.parameters()
    )


def train(run: Run, steps: int, trace_every: int, seed: int = 0) -> Run:
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(seed)
    true_w = torch.randn(FEATURES, 1, generator=data)
    model = TwoLayer(saturating=run.chip == "saturation")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = GradScaler("cpu", init_scale=2.0**32, growth_interval=100, overflow_mode=run.mode)
    print(f"\n== {run.title} ==")
    print(f"{'step':>5} {'loss':>12} {'loss scale':>11} {'skipped':>8} {'applied':>8}")
    last_scale = None
    for step in range(1, steps + 1):
        features = torch.randn(BATCH, FEATURES, generator=data)
        optimizer.zero_grad()
        loss = torch.mean((model(features) - features @ true_w) ** 2)
        scaler.scale(loss).backward()
        truth = overflowed(model)
        scaler.step(optimizer)
        scaler.update()
        scale = scaler.get_scale()
        run.losses.append(loss.item())
        run.scales.append(scale)
        run.overflows += truth
        run.applied += scaler.last_step_applied
        unseen = truth and scaler.last_step_applied
        if step % trace_every == 0 or scale != last_scale or (unseen and step <= 3):
            if not scaler.last_step_applied:
                mark = "  <- overflow, step skipped"
            elif truth:
                mark = "  <- overflow NOT seen, step applied"
            else:
                mark = ""
            print(
                f"{step:>5} {loss.item():>12.4g} {format_scale(scale):>11}"
                f" {scaler.skipped_steps:>8d} {run.applied:>8d}{mark}"
            )
        last_scale = scale
    run.skipped = scaler.skipped_steps
    return run


def summarize(runs: list[Run]) -> None:
    # Two counts side by side: steps whose gradients overflowed, and how many the scaler skipped.
    print(
        f"\n{'run':<48} {'overflowed':>10}  {'skipped':>7}  {'final scale':>11}  {'final loss':>10}"
    )
    for run in runs:
        print(
            f"{run.title:<48} {run.overflows:>10d}  {run.skipped:>7d}"
            f"  {format_scale(run.scales[-1]):>11}  {run.losses[-1]:>10.4g}"
        )
    right, wrong = runs[0], runs[1]
    print(
        f"On a saturating chip the matching mode caught {right.skipped} of {right.overflows} "
        f"overflows; the wrong mode caught {wrong.skipped} of {wrong.overflows}, applied the "
        f"clamped gradients, never lowered the scale, and ended at loss {wrong.losses[-1]:.4g} "
        f"instead of {right.losses[-1]:.4g}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--trace-every", type=int, default=50)
    args = parser.parse_args()
    if not kernels.built():
        print("Compiling the fused CPU check once (seconds; cached afterwards)...", flush=True)
        kernels.fused_op(saturation=True)
    runs = [
        Run("saturating chip, overflow_mode='saturation'", chip="saturation", mode="saturation"),
        Run("saturating chip, overflow_mode='inf_nan' (wrong)", chip="saturation", mode="inf_nan"),
        Run("IEEE device, overflow_mode='inf_nan'", chip="inf_nan", mode="inf_nan"),
    ]
    for run in runs:
        train(run, args.steps, args.trace_every)
    summarize(runs)


if __name__ == "__main__":
    main()
