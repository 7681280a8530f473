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


def test_a_multi_element_init_scale_is_refused_by_name() -> None:
    """A one-element tensor is read as its number (as configs hand it over); a longer one is a
    mistake that stock accepts silently (its scale tensor then has the wrong shape), so ours
    refuses it with an error that names the argument."""
    assert GradScaler("cpu", init_scale=torch.tensor([512.0])).get_scale() == 512.0
    with pytest.raises(ValueError, match=r"init_scale must be a Python number.*tensor\(\[2"):
        GradScaler("cpu", init_scale=torch.tensor([2.0, 4.0]))


@pytest.mark.parametrize("scale", [-1.0, -1e-3])
def test_a_negative_loaded_scale_is_refused_and_nothing_is_loaded(scale: float) -> None:
    """A scale below 0 is no state torch ever reaches (stock's falls to 0 at worst): a corrupt
    checkpoint, refused by name rather than raised to the floor like a collapsed 0."""
    model = _linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=256.0)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['scale'\] must be a finite number >= 0"):
        scaler.load_state_dict({**before, "scale": scale, "_growth_tracker": 5})
    assert scaler.state_dict() == before
    _backward(scaler, [model], [False])
    scaler.step(optimizer)
    scaler.update()
    assert (scaler.get_scale(), scaler.last_step_applied) == (256.0, True)


@pytest.mark.parametrize("collapsed", [0, 0.0])
def test_a_zero_loaded_scale_resumes_from_the_floor_whatever_its_type(collapsed: float) -> None:
    """A hand-written state dict with an int 0 is the same collapsed scale as stock's 0.0."""
    scaler = GradScaler("cpu", init_scale=256.0, min_loss_scale=2.0)
    with pytest.warns(UserWarning, match="below min_loss_scale"):
        scaler.load_state_dict({**scaler.state_dict(), "scale": collapsed})
    assert scaler.get_scale() == 2.0


@pytest.mark.parametrize("make", [GradScaler, torch.amp.GradScaler], ids=["ours", "stock"])
def test_stepping_fp16_parameters_is_refused_as_stock_refuses_it(make) -> None:
    """fp16 master weights cannot take unscaled updates safely: stock's step (through unscale_)
    raises ValueError, and so does ours, with no weight touched."""
    model = _linear(0).half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = make("cpu", init_scale=256.0)
    scaler.scale(model(X.half()).float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(optimizer)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(optimizer)


def _sparse_pair_loop(make) -> tuple[list[torch.Tensor], float, bool]:
    """An embedding (sparse gradients, its own SGD) feeding a linear head (another SGD), both
    stepped after one backward, the head first. The second update's embedding gradient holds
    the same row twice, each entry finite when scaled but their sum past float32's range."""
    torch.manual_seed(0)
    embedding = nn.Embedding(4, 2, sparse=True)
    head = nn.Linear(2, 1)
    head_opt = torch.optim.SGD(head.parameters(), lr=1e-3)
    embedding_opt = torch.optim.SGD(embedding.parameters(), lr=1e-3)
    scaler = make("cpu", init_scale=2.0**16)
    rows = torch.tensor([0, 0, 1])
    for factor in (1.0, 2e38 / 2.0**16):
        head_opt.zero_grad()
        embedding_opt.zero_grad()
        features = embedding(rows)
        loss = features.sum() * factor + head(features.detach()).sum()
        scaler.scale(loss).backward()
        scaler.step(head_opt)
        scaler.step(embedding_opt)
        scaler.update()
    weights = [embedding.weight.detach().clone(), head.weight.detach().clone()]
    applied = getattr(scaler, "last_step_applied", True)
    return weights, scaler.get_scale(), applied


def test_inf_nan_mode_judges_duplicate_sparse_entries_one_by_one_as_stock_does() -> None:
    """In inf_nan mode a float32 sparse gradient is checked entry by entry, as stock checks it:
    scaled duplicates that would add up past float32's range are no overflow, since the step
    adds them unscaled (6e33 here). Both optimizers step, as with stock, and the scale stays."""
    ours, ours_scale, applied = _sparse_pair_loop(
        lambda *a, **k: GradScaler(*a, overflow_mode="inf_nan", **k)
    )
    stock, stock_scale, _ = _sparse_pair_loop(torch.amp.GradScaler)
    assert (ours_scale, applied) == (stock_scale, True) == (2.0**16, True)
    assert all(torch.equal(a, b) for a, b in zip(ours, stock))
    assert torch.isfinite(ours[0]).all() and ours[0][0, 0] < -1e30  # the big step was taken


@pytest.mark.parametrize("make", [GradScaler, torch.amp.GradScaler], ids=["ours", "stock"])
def test_a_one_element_tensor_scale_in_a_loaded_state_dict_is_read_as_its_number(make) -> None:
    """A checkpoint written by code that saved the scale as a tensor (stock's own scale tensor,
    say) holds "scale" as a one-element tensor. Stock loads it, and so does ours: training
    resumes from 512, and the state dict saved afterwards holds a plain float again."""
    model = _linear(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make("cpu", init_scale=256.0)
    scaler.load_state_dict({**scaler.state_dict(), "scale": torch.tensor(512.0)})
    _backward(scaler, [model], [False])
    scaler.step(optimizer)
    scaler.update()
    saved = scaler.state_dict()["scale"]
    assert (scaler.get_scale(), type(saved), saved) == (512.0, float, 512.0)


def test_a_one_element_tensor_scale_below_the_floor_resumes_from_the_floor() -> None:
    """Stock's collapsed scale of 0 saved as a tensor is the same collapsed scale as 0.0: the
    load warns and training resumes from min_loss_scale, a float."""
    scaler = GradScaler("cpu", init_scale=256.0, min_loss_scale=2.0)
    with pytest.warns(UserWarning, match="below min_loss_scale"):
        scaler.load_state_dict({**scaler.state_dict(), "scale": torch.tensor([0.0])})
    assert (scaler.get_scale(), type(scaler.get_scale())) == (2.0, float)


@pytest.mark.parametrize(
    ("key", "bad"),
    [("scale", "1024"), ("scale", None), ("min_loss_scale", "1"), ("min_loss_scale", None)],
)
def test_a_non_numeric_loaded_scale_or_floor_is_refused_by_name_and_nothing_is_loaded(
    key: str, bad: object
) -> None:
    """A hand-edited checkpoint with a string (or None) for the scale or the floor is refused
    with a ValueError naming the entry, not a TypeError from comparing it with the other."""
    scaler = GradScaler("cpu", init_scale=256.0)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=rf"state_dict\['{key}'\] must be a Python number"):
        scaler.load_state_dict({**before, key: bad, "_growth_tracker": 5})
    assert scaler.state_dict() == before


@pytest.mark.parametrize("make", [GradScaler, torch.amp.GradScaler], ids=["ours", "stock"])
def test_gradients_on_two_devices_one_of_them_meta_fail_at_step_naming_the_meta_tensor(
    make,
) -> None:
    """One optimizer over a CPU layer and a layer built on the meta device (deferred init, never
    materialised) that its own backward pass gave meta gradients: its gradients lie on two
    devices, and a meta flag holds no value to read. Stock's step fails saying so, and so does
    ours, before any weight moves (the only pair of devices a CPU-only host has)."""
    cpu_layer = _linear(0)
    with torch.device("meta"):
        meta_layer = nn.Linear(4, 1)
    optimizer = torch.optim.SGD([*cpu_layer.parameters(), *meta_layer.parameters()], lr=0.1)
    scaler = make("cpu", init_scale=256.0)
    scaler.scale(cpu_layer(X).sum()).backward()
    scaler.scale(meta_layer(X.to("meta")).sum()).backward()
    before = [p.detach().clone() for p in cpu_layer.parameters()]
    with pytest.raises(RuntimeError, match="meta tensor"):
        scaler.step(optimizer)
    assert all(torch.equal(b, p) for b, p in zip(before, cpu_layer.parameters()))
