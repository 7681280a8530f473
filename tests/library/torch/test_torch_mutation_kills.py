"""GradScaler behaviour the mutation run (benchmarks/mutation.py, issue 30) found unpinned.

Stock `torch.amp.GradScaler("cpu")` runs the same loop as the control wherever ours must agree
with it (an optimizer unscaled but never stepped still counts at update()).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from npu_lossscale.torch import GradScaler

X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))


def _linear(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(4, 1)


def _backward(scaler: torch.amp.GradScaler, models: list[nn.Module], poison: list[bool]) -> None:
    loss = sum((m(X).sum() * (math.inf if bad else 1.0)) for m, bad in zip(models, poison))
    scaler.scale(loss).backward()


@pytest.mark.parametrize("make", [GradScaler, torch.amp.GradScaler], ids=["ours", "stock"])
def test_an_optimizer_unscaled_but_not_stepped_still_backs_the_scale_off(make) -> None:
    """A loop that unscales to log a gradient norm and then decides not to step (or steps only
    another optimizer) still reports the overflow at update(), as stock does."""
    scaler = make("cpu", init_scale=256.0)
    model = _linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(scaler, [model], [True])
    scaler.unscale_(optimizer)
    scaler.update()
    assert scaler.get_scale() == 128.0
    # Two optimizers: the clean one steps, then the other is unscaled (overflowed) and not stepped.
    models = [_linear(1), _linear(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for opt in optimizers:
        opt.zero_grad()
    _backward(scaler, models, [False, True])
    before = [p.detach().clone() for p in models[0].parameters()]
    scaler.step(optimizers[0])
    scaler.unscale_(optimizers[1])
    scaler.update()
    assert scaler.get_scale() == 64.0
    after = list(models[0].parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after))  # the clean one stepped


def test_a_loaded_state_dict_resumes_the_bad_step_count() -> None:
    """decr_every_n_nan_or_inf=2: one overflow before the checkpoint and one after it are the
    two in a row that halve the scale."""
    model = _linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = GradScaler("cpu", init_scale=256.0, decr_every_n_nan_or_inf=2)
    _backward(saved, [model], [True])
    saved.step(optimizer)
    saved.update()
    assert saved.get_scale() == 256.0
    resumed = GradScaler("cpu", init_scale=1024.0, decr_every_n_nan_or_inf=2)
    resumed.load_state_dict(saved.state_dict())
    optimizer.zero_grad()
    _backward(resumed, [model], [True])
    resumed.step(optimizer)
    resumed.update()
    assert (resumed.get_scale(), resumed.skipped_steps) == (128.0, 2)


def test_the_floor_may_equal_the_ceiling() -> None:
    """min_loss_scale == max_loss_scale pins a dynamic scale: neither growth nor backoff moves
    it, while overflowed steps are still skipped."""
    model = _linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(
        "cpu", init_scale=8.0, growth_interval=1, min_loss_scale=8.0, max_loss_scale=8.0
    )
    for poison in (False, True, False):
        optimizer.zero_grad()
        _backward(scaler, [model], [poison])
        scaler.step(optimizer)
        scaler.update()
        assert scaler.get_scale() == 8.0
    assert scaler.skipped_steps == 1
