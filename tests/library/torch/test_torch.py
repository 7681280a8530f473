"""npu_lossscale.torch.GradScaler on real torch modules, optimizers and backward passes (CPU).

Stock `torch.amp.GradScaler("cpu")` runs beside ours wherever they must agree (clean steps, the
inf/NaN decision, clipping, sparse gradients) and as the control where they must not (one decision
per update, the floor, saturation). Gradients are steered exactly with a probe: a bias-free
Linear(1, 1) whose loss is w * a has the gradient a, a * S once the loss is scaled by S, which
makes the saturation boundary (|g_scaled| >= 65504) testable to the last unit.
"""

from __future__ import annotations

import collections
import inspect
import math
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from rule_driver import run
from torch import nn
from torch.amp.grad_scaler import _refresh_per_optimizer_state
from torch.profiler import ProfilerActivity, profile

from npu_lossscale.rule import DynamicRule
from npu_lossscale.torch import (
    ExponentialUpdateLossScaleManager,
    FixedLossScaleManager,
    GradScaler,
    OverflowMode,
)

INF = math.inf
X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
Y = torch.randn(16, 1, generator=torch.Generator().manual_seed(1))


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _poisoned(value: float = INF) -> torch.Tensor:
    x = X.clone()
    x[0, 0] = value
    return x


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return ((model(x) - Y) ** 2).mean()


def _train_step(
    scaler: torch.amp.GradScaler,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    clip: float | None = None,
) -> None:
    optimizer.zero_grad()
    scaler.scale(_loss(model, x)).backward()
    if clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    scaler.step(optimizer)
    scaler.update()


def _snapshot(model: nn.Module, *optimizers: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter and every tensor of the optimizers' state (moments, step counts)."""
    tensors = [p.detach().clone() for p in model.parameters()]
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors += [v.clone() for _, v in sorted(state.items()) if torch.is_tensor(v)]
    return tensors


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _probe(a: float, scaler: GradScaler, lr: float = 1e-3) -> tuple[nn.Linear, bool]:
    """One step whose only gradient is a * S; returns the probe and whether it moved."""
    probe = nn.Linear(1, 1, bias=False)
    nn.init.ones_(probe.weight)
    optimizer = torch.optim.SGD(probe.parameters(), lr=lr)
    scaler.scale(probe(torch.tensor([[a]])).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    return probe, not torch.equal(probe.weight.detach(), torch.ones(1, 1))


def _host_reads(step: object) -> int:
    """How many times ``step()`` read a tensor value back to the host (aten::item's kernel)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


# -- the public surface ---------------------------------------------------------------------------


def _parameters(function: object) -> list[tuple[str, str, object]]:
    return [
        (p.name, p.kind.name, p.default) for p in inspect.signature(function).parameters.values()
    ]


def test_signatures_are_the_contracts() -> None:
    positional, keyword = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert _parameters(GradScaler) == [
        ("device", positional, "auto"),
        ("init_scale", positional, 2.0**16),
        ("growth_factor", positional, 2.0),
        ("backoff_factor", positional, 0.5),
        ("growth_interval", positional, 2000),
        ("enabled", positional, True),
        ("dynamic", keyword, True),
        ("overflow_mode", keyword, "auto"),
        ("is_distributed", keyword, None),
        ("process_group", keyword, None),
        ("decr_every_n_nan_or_inf", keyword, 1),
        ("min_loss_scale", keyword, 1.0),
        ("max_loss_scale", keyword, None),
        ("max_skipped_steps_at_floor", keyword, None),
        ("per_optimizer", keyword, False),
    ]
    stock = [name for name, _, _ in _parameters(torch.amp.GradScaler)]
    assert [name for name, _, _ in _parameters(GradScaler)][:6] == stock
    assert _parameters(GradScaler.from_manager) == [
        ("manager", positional, inspect.Parameter.empty),
        ("device", keyword, "auto"),
        ("is_distributed", keyword, None),
        ("process_group", keyword, None),
    ]
    assert _parameters(FixedLossScaleManager) == [
        ("loss_scale", positional, inspect.Parameter.empty),
        ("enable_overflow_check", positional, True),
        ("overflow_mode", keyword, "auto"),
        ("is_distributed", keyword, None),
    ]
    assert _parameters(ExponentialUpdateLossScaleManager) == [
        ("init_loss_scale", positional, inspect.Parameter.empty),
        ("incr_every_n_steps", positional, inspect.Parameter.empty),
        ("decr_every_n_nan_or_inf", positional, 2),
        ("incr_ratio", positional, 2),
        ("decr_ratio", positional, 0.8),
        ("overflow_mode", keyword, "auto"),
        ("is_distributed", keyword, None),
        ("min_loss_scale", keyword, 1.0),
        ("max_loss_scale", keyword, None),
        ("max_skipped_steps_at_floor", keyword, None),
    ]
    assert issubclass(GradScaler, torch.amp.GradScaler)
    assert OverflowMode("SATURATION") is OverflowMode.SATURATION


def test_imports_stay_apart() -> None:
    """The package root never loads torch, and the torch front-end never loads TensorFlow."""
    code = (
        "import sys, npu_lossscale\n"
        "assert 'torch' not in sys.modules, 'npu_lossscale imported torch'\n"
        "import npu_lossscale.torch\n"
        "assert 'tensorflow' not in sys.modules, 'npu_lossscale.torch imported tensorflow'\n"
        "assert 'torch_npu' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_auto_device_and_mode_off_the_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INF_NAN_MODE_ENABLE", raising=False)
    scaler = GradScaler()
    assert scaler._device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert scaler.overflow_mode is OverflowMode.INF_NAN
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    assert GradScaler("cpu").overflow_mode is OverflowMode.SATURATION
    assert GradScaler("cpu", overflow_mode="inf_nan").overflow_mode is OverflowMode.INF_NAN


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (dict(growth_interval=0), "growth_interval"),
        (dict(backoff_factor=1.0), "backoff_factor"),
        (dict(growth_factor=1.0), "growth_factor"),
        (
            dict(init_scale=0.5),
            r"init_scale \(0.5\) must not be below min_loss_scale \(1.0\); "
            r"a scale below 1 needs a floor below 1 too: pass min_loss_scale=0.5",
        ),
        (dict(init_scale=-1.0, min_loss_scale=0), "init_scale"),
        (dict(min_loss_scale=-0.5), "min_loss_scale"),
        (dict(init_scale=float("nan")), "init_scale"),
        (dict(decr_every_n_nan_or_inf=0), "decr_every_n_nan_or_inf"),
        (dict(min_loss_scale=8, max_loss_scale=4, init_scale=4), "min_loss_scale"),
        (dict(max_skipped_steps_at_floor=0), "max_skipped_steps_at_floor"),
        (dict(overflow_mode="bogus"), "overflow_mode"),
        (dict(is_distributed="yes"), "is_distributed"),
        (dict(dynamic=2), "dynamic"),
        (dict(enabled="no"), "enabled"),
        (dict(enabled=torch.tensor([1, 0])), "enabled"),
        (dict(dynamic=False, max_skipped_steps_at_floor=5), "max_skipped_steps_at_floor"),
        (dict(device=1024.0), r"init_scale=\.\.\."),
        (dict(device="gpu"), r"device must be a device type.*'gpu'"),
    ],
)
def test_bad_arguments_name_themselves(arguments: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        GradScaler(**{"device": "cpu", **arguments})


@pytest.mark.parametrize(
    "flag", [True, 1, np.bool_(True), torch.tensor(True), torch.tensor(1)], ids=repr
)
def test_enabled_takes_the_flags_stock_takes(flag: object) -> None:
    """Scripts pass `enabled=args.amp` as read from a config: an int, a numpy or a 0-d tensor
    flag works as with stock torch's scaler."""
    assert GradScaler("cpu", enabled=flag).is_enabled() is True
    off = flag.__class__(0) if not isinstance(flag, torch.Tensor) else torch.tensor(0)
    assert GradScaler("cpu", enabled=off).is_enabled() is False
    assert GradScaler("cpu", enabled=None).is_enabled() is False  # an unset option, as stock


def test_init_scale_in_a_tensor_is_taken_as_stock_takes_it() -> None:
    scaler = GradScaler("cpu", init_scale=torch.tensor(1024.0))
    assert scaler.get_scale() == 1024.0
    assert _drive(scaler, [True, False]) == [1024.0, 512.0]


def test_stuck_message_suggests_a_lower_floor_only_above_one() -> None:
    _, at_one = DynamicRule.validated(4.0, 2000, 1, 2.0, 0.5, max_skipped_steps_at_floor=3)
    _, at_64 = DynamicRule.validated(
        256.0, 2000, 1, 2.0, 0.5, min_loss_scale=64.0, max_skipped_steps_at_floor=3
    )
    assert "lower min_loss_scale" not in at_one.stuck_message("inf_nan")
    assert "cannot help" in at_one.stuck_message("inf_nan")
    assert "lower min_loss_scale" in at_64.stuck_message("saturation")
    assert "cannot help" not in at_64.stuck_message("saturation")


def test_setters_and_managers_validate_too() -> None:
    scaler = GradScaler("cpu")
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.set_growth_interval(0)
    with pytest.raises(ValueError, match="backoff_factor"):
        scaler.set_backoff_factor(2.0)
    scaler.set_growth_factor(4.0)
    assert scaler.get_growth_factor() == 4.0 and scaler.state_dict()["growth_factor"] == 4.0
    with pytest.raises(ValueError, match="init_loss_scale"):
        ExponentialUpdateLossScaleManager(0.5, 10)
    with pytest.raises(ValueError, match="loss_scale"):
        FixedLossScaleManager(0)
    with pytest.raises(ValueError, match="is_distributed"):
        FixedLossScaleManager(8, is_distributed="no")


# -- the training loop ----------------------------------------------------------------------------


def test_drop_in_for_stock_clean_and_overflowed_steps() -> None:
    """Same rule as stock where stock's rule is the contract: bitwise the same parameters, Adam
    state and scale after clean steps, a growth and an inf-skipped step."""
    ours_model, stock_model = _mlp(), _mlp()
    ours_opt = torch.optim.Adam(ours_model.parameters(), 1e-2)
    stock_opt = torch.optim.Adam(stock_model.parameters(), 1e-2)
    ours, stock = (
        GradScaler("cpu", growth_interval=3),
        torch.amp.GradScaler("cpu", growth_interval=3),
    )
    for i in range(8):
        x = _poisoned() if i == 4 else X
        _train_step(ours, ours_model, ours_opt, x)
        _train_step(stock, stock_model, stock_opt, x)
        assert ours.get_scale() == stock.get_scale(), i
        assert _same(_snapshot(ours_model, ours_opt), _snapshot(stock_model, stock_opt)), i
    assert ours.get_scale() == 2.0**17
    assert ours.skipped_steps == 1 and ours.last_step_applied is True


@pytest.mark.parametrize("poison", [INF, -INF, math.nan])
def test_overflowed_step_changes_nothing(poison: float) -> None:
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    scaler = GradScaler("cpu", init_scale=1024.0)
    _train_step(scaler, model, optimizer, X)
    before = _snapshot(model, optimizer)
    _train_step(scaler, model, optimizer, _poisoned(poison))
    assert _same(_snapshot(model, optimizer), before)
    assert [s["step"].item() for s in optimizer.state.values()] == [1.0] * 4
    assert scaler.skipped_steps == 1 and scaler.last_step_applied is False
    assert scaler.get_scale() == 512.0
    _train_step(scaler, model, optimizer, X)
    assert scaler.last_step_applied is True and not _same(_snapshot(model, optimizer), before)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_unscale_and_clip_between_backward_and_step(mode: str) -> None:
    """Clipping sees the true gradients: both modes unscale exactly as stock does."""
    ours_model, stock_model = _mlp(), _mlp()
    ours_opt = torch.optim.SGD(ours_model.parameters(), 0.1)
    stock_opt = torch.optim.SGD(stock_model.parameters(), 0.1)
    ours = GradScaler("cpu", init_scale=4096.0, overflow_mode=mode)
    stock = torch.amp.GradScaler("cpu", init_scale=4096.0)
    for _ in range(3):
        _train_step(ours, ours_model, ours_opt, X, clip=0.05)
        _train_step(stock, stock_model, stock_opt, X, clip=0.05)
    assert _same(_snapshot(ours_model), _snapshot(stock_model))
    with pytest.raises(RuntimeError, match="already been called"):
        ours.scale(_loss(ours_model, X)).backward()
        ours.unscale_(ours_opt)
        ours.unscale_(ours_opt)


@pytest.mark.parametrize(
    ("a", "saturation_skips", "inf_nan_skips"),
    [
        (65504.0 / 65536.0, True, False),  # scaled gradient exactly 65504
        (-65504.0 / 65536.0, True, False),
        (65503.99609375 / 65536.0, False, False),  # one float32 step below
        (1e30, True, False),  # finite and huge: only saturation mode sees it
        (INF, True, True),
        (math.nan, True, True),
    ],
)
def test_the_two_modes_decide_as_the_tf_front_ends(
    a: float, saturation_skips: bool, inf_nan_skips: bool
) -> None:
    for mode, skips in (("saturation", saturation_skips), ("inf_nan", inf_nan_skips)):
        scaler = GradScaler("cpu", init_scale=2.0**16, overflow_mode=mode)
        _, moved = _probe(a, scaler)
        assert scaler.last_step_applied is not skips, mode
        assert moved is not skips, mode
        assert scaler.skipped_steps == int(skips)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_on_the_cpu(dtype: torch.dtype) -> None:
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    losses = []
    for _ in range(6):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = _loss(model, X)
        assert loss.dtype == torch.float32  # mse_loss autocasts to float32
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert scaler.skipped_steps == 0 and losses[-1] < losses[0]
    assert scaler.get_scale() == 2.0**13
    if dtype is torch.float16:  # activations past 65504 become inf in float16
        before = _snapshot(model, optimizer)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = _loss(model, X * 1e5)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        assert scaler.last_step_applied is False and _same(_snapshot(model, optimizer), before)


# -- several optimizers, None and sparse gradients ------------------------------------------------


class _TwoParts(nn.Module):
    """Two parts with an optimizer each; an inf in ``y`` overflows only part b's gradients."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.a(x) - Y) ** 2).mean() + ((self.b(y) - Y) ** 2).mean()


def _two_part_update(
    scaler: torch.amp.GradScaler,
    model: _TwoParts,
    optimizers: list[torch.optim.Optimizer],
    y: torch.Tensor,
    unscale_first: bool = False,
) -> None:
    for optimizer in optimizers:
        optimizer.zero_grad()
    scaler.scale(model.loss(X, y)).backward()
    if unscale_first:
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
    for optimizer in optimizers:
        scaler.step(optimizer)
    scaler.update()


def _two_parts() -> tuple[_TwoParts, list[torch.optim.Optimizer]]:
    model = _TwoParts()
    return model, [
        torch.optim.Adam(model.a.parameters(), 1e-2),
        torch.optim.SGD(model.b.parameters(), 0.1),
    ]


def test_several_optimizers_one_decision_where_stock_applies_half() -> None:
    ours_model, ours_opts = _two_parts()
    stock_model, stock_opts = _two_parts()
    ours, stock = GradScaler("cpu"), torch.amp.GradScaler("cpu")
    _two_part_update(ours, ours_model, ours_opts, X)
    _two_part_update(stock, stock_model, stock_opts, X)
    ours_before = _snapshot(ours_model, *ours_opts)
    stock_before = _snapshot(stock_model.a, stock_opts[0])

    reads = _host_reads(lambda: _two_part_update(ours, ours_model, ours_opts, _poisoned()))
    _two_part_update(stock, stock_model, stock_opts, _poisoned())
    assert _same(_snapshot(ours_model, *ours_opts), ours_before)  # neither part moved
    assert ours.skipped_steps == 1 and ours.last_step_applied is False
    assert reads == 1  # one decision for both optimizers (stock reads once per optimizer)
    assert not _same(_snapshot(stock_model.a, stock_opts[0]), stock_before)  # stock moved part a


def test_several_optimizers_in_the_first_update() -> None:
    """unscale_ on each before the first step covers all of them from the first update; without
    it, an optimizer new to the scaler is judged at its own step (documented in step())."""
    model, optimizers = _two_parts()
    scaler = GradScaler("cpu")
    before = _snapshot(model, *optimizers)
    _two_part_update(scaler, model, optimizers, _poisoned(), unscale_first=True)
    assert _same(_snapshot(model, *optimizers), before)

    model, optimizers = _two_parts()
    scaler = GradScaler("cpu")
    part_b = _snapshot(model.b)
    _two_part_update(scaler, model, optimizers, _poisoned())
    assert _same(_snapshot(model.b), part_b)  # b overflowed: skipped; a was applied before
    assert scaler.skipped_steps == 1 and scaler.get_scale() == 2.0**15


def test_interleaved_backward_and_steps_in_one_update_match_stock() -> None:
    """A GAN-style loop: both zeroed, the critic's loss (which reaches the generator too) and the
    critic's step, then the generator's loss and step, one update. The generator's gradients are
    incomplete at the critic's step, so the read-only check there must leave them as they are,
    for the generator's own step to unscale them once, complete."""
    runs = []
    for scaler in (GradScaler("cpu"), torch.amp.GradScaler("cpu")):
        torch.manual_seed(0)
        generator, critic = nn.Linear(4, 4), nn.Linear(4, 1)
        opt_g = torch.optim.Adam(generator.parameters(), 1e-2)
        opt_c = torch.optim.SGD(critic.parameters(), 0.1)
        for _ in range(3):
            opt_g.zero_grad()
            opt_c.zero_grad()
            scaler.scale(((critic(generator(X)) - Y) ** 2).mean()).backward()
            scaler.step(opt_c)
            scaler.scale((critic(generator(X)) ** 2).mean()).backward()
            scaler.step(opt_g)
            scaler.update()
        runs.append(_snapshot(nn.ModuleList([generator, critic]), opt_g, opt_c))
    assert _same(*runs)


def test_none_gradients_unused_and_frozen_parameters() -> None:
    runs = []
    for scaler in (GradScaler("cpu"), torch.amp.GradScaler("cpu")):
        model = _mlp()
        model.unused = nn.Parameter(torch.ones(3))  # never in the graph: its gradient stays None
        model[0].bias.requires_grad_(False)
        optimizer = torch.optim.Adam(model.parameters(), 1e-2)
        for _ in range(2):
            _train_step(scaler, model, optimizer, X)
        runs.append(_snapshot(model, optimizer))
    assert _same(*runs)
    assert model.unused.grad is None

    scaler = GradScaler("cpu")  # an optimizer with no gradient at all steps as a no-op
    idle = torch.optim.SGD(nn.Linear(2, 2).parameters(), 0.1)
    scaler.scale(_loss(_mlp(), X))
    scaler.step(idle)
    scaler.update()
    assert scaler.last_step_applied is True


class _Sparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(10, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.head(self.embedding(ids) * scale)


IDS = torch.tensor([1, 3, 3, 7])


def _sparse_update(scaler: torch.amp.GradScaler, model: _Sparse, opts: list, scale: float) -> None:
    for optimizer in opts:
        optimizer.zero_grad()
    scaler.scale(((model(IDS, scale) - 1.0) ** 2).mean()).backward()
    for optimizer in opts:
        scaler.step(optimizer)
    scaler.update()


@pytest.mark.parametrize("sparse_optimizer", ["SparseAdam", "SGD"])
def test_sparse_gradients(sparse_optimizer: str) -> None:
    runs, models = [], []
    for scaler in (GradScaler("cpu"), torch.amp.GradScaler("cpu")):
        model = _Sparse()
        opts = [
            getattr(torch.optim, sparse_optimizer)(model.embedding.parameters(), lr=0.01),
            torch.optim.Adam(model.head.parameters(), 1e-2),
        ]
        for _ in range(3):
            _sparse_update(scaler, model, opts, 1.0)
        runs.append(_snapshot(model, *opts))
        models.append((scaler, model, opts))
    assert _same(*runs)

    scaler, model, opts = models[0]
    before = _snapshot(model, *opts)
    _sparse_update(scaler, model, opts, INF)
    assert _same(_snapshot(model, *opts), before) and scaler.skipped_steps == 1


def test_saturation_judges_sparse_gradients_after_duplicates_add_up() -> None:
    """Index 3 appears twice: each occurrence's scaled gradient is 40000, their sum 80000."""
    for mode, skips in (("saturation", True), ("inf_nan", False)):
        embedding = nn.Embedding(10, 1, sparse=True)
        optimizer = torch.optim.SGD(embedding.parameters(), lr=1e-9)
        scaler = GradScaler("cpu", init_scale=2.0**16, overflow_mode=mode)
        c = 40000.0 / 2.0**16
        scaler.scale((embedding(torch.tensor([3, 3])) * c).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        assert scaler.last_step_applied is not skips, mode


def test_fused_adam_is_stepped_with_unscaled_gradients() -> None:
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), 1e-2, fused=True)
    reference_model = _mlp()
    reference = torch.optim.Adam(reference_model.parameters(), 1e-2, fused=True)
    scaler = GradScaler("cpu", init_scale=2.0**10)
    _train_step(scaler, model, optimizer, X)
    reference.zero_grad()
    _loss(reference_model, X).backward()
    reference.step()
    assert all(
        torch.allclose(p, q) for p, q in zip(model.parameters(), reference_model.parameters())
    )
    before = _snapshot(model, optimizer)
    _train_step(scaler, model, optimizer, _poisoned())
    assert _same(_snapshot(model, optimizer), before)


def _sgd_(optimizer: torch.optim.Optimizer, scale: object) -> None:
    """Plain SGD on gradients divided by ``scale`` (None: already unscaled)."""
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(p.grad if scale is None else p.grad / scale, alpha=group["lr"])


class _UnscalesItself(torch.optim.Optimizer):
    """A third-party optimizer in stock's protocol: it reads the scale and the overflow flag the
    scaler sets on it, unscales in its own step and skips when found_inf says so."""

    def __init__(self, params: object) -> None:
        super().__init__(params, {"lr": 0.1})
        self._step_supports_amp_scaling = True
        self.seen: list[tuple[float | None, float]] = []

    def step(self, closure: object = None) -> None:
        scale, found = getattr(self, "grad_scale", None), float(self.found_inf)
        self.seen.append((None if scale is None else float(scale), found))
        if not found:
            _sgd_(self, scale)


class _TakesTheScaler(torch.optim.Optimizer):
    """The older form of the protocol: step(grad_scaler=...) asks the scaler itself."""

    def __init__(self, params: object) -> None:
        super().__init__(params, {"lr": 0.1})
        self._step_supports_amp_scaling = True

    def step(self, closure: object = None, *, grad_scaler: object = None) -> None:
        assert not hasattr(self, "grad_scale") and not hasattr(self, "found_inf")
        found = sum(v.item() for v in grad_scaler._check_inf_per_device(self).values())
        if not found:
            _sgd_(self, grad_scaler._get_scale_async())


@pytest.mark.parametrize("kind", [_UnscalesItself, _TakesTheScaler])
def test_optimizers_that_unscale_themselves_get_stocks_protocol(kind: type) -> None:
    """`_step_supports_amp_scaling`: as with stock, the optimizer gets the scale and the flag
    (or the scaler) and unscales itself, so weights and decisions equal stock's, clean and
    overflowed. The decision stays ours: an overflowed step is not called at all, and in
    saturation mode a finite gradient past 65504 (stock: applied) is skipped."""

    def run(scaler: torch.amp.GradScaler, last_factor: float) -> tuple:
        model = _mlp()
        optimizer = kind(model.parameters())
        trace = []
        for x, factor in ((X, 1.0), (_poisoned(), 1.0), (X, 1.0), (X, last_factor)):
            optimizer.zero_grad()
            scaler.scale(_loss(model, x) * factor).backward()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                scaler.step(optimizer)
            assert any(w.category is FutureWarning for w in caught) is (kind is _TakesTheScaler)
            scaler.update()
            trace.append((scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
        return trace, getattr(optimizer, "seen", None)

    big = 1000.0  # a loss whose scaled gradients, finite, pass 65504
    ours, ours_seen = run(GradScaler("cpu", 1024.0, overflow_mode="inf_nan"), 1.0)
    stock, stock_seen = run(torch.amp.GradScaler("cpu", 1024.0), 1.0)
    assert [s for s, _ in ours] == [s for s, _ in stock] == [1024.0, 512.0, 512.0, 512.0]
    assert all(_same(a, b) for (_, a), (_, b) in zip(ours, stock))
    if kind is _UnscalesItself:
        assert stock_seen[1] == (1024.0, 1.0)  # stock calls the overflowed step
        assert ours_seen == [stock_seen[0], stock_seen[2], stock_seen[3]]  # ours does not
    saturated, _ = run(GradScaler("cpu", 1024.0, overflow_mode="saturation"), big)
    stock_big, _ = run(torch.amp.GradScaler("cpu", 1024.0), big)
    assert saturated[-1][0] == 256.0 and stock_big[-1][0] == 512.0
    assert _same(saturated[-1][1], saturated[-2][1])  # skipped: weights as before


def test_an_optimizer_unscaling_itself_is_in_its_passs_one_decision() -> None:
    """One backward, then the step of an optimizer that unscales itself (its gradients still
    scaled when the decision is taken) and a plain one's: its own overflow skips both, from the
    second update on too, where the decision also prechecks the other."""
    model = _TwoParts()
    optimizers = [_UnscalesItself(model.b.parameters()), torch.optim.SGD(model.a.parameters(), 0.1)]
    scaler = GradScaler("cpu", 256.0)
    for y in (X, X, _poisoned(), X):  # the inf overflows part b only
        before = [p.detach().clone() for p in model.parameters()]
        _two_part_update(scaler, model, optimizers, y)
        moved = [not torch.equal(a, b) for a, b in zip(before, model.parameters())]
        assert all(moved) if y is X else not any(moved)
    assert optimizers[0].seen == [(256.0, 0.0), (256.0, 0.0), (128.0, 0.0)]
    # A first update with the plain optimizer unscaled first: nothing to precheck, the
    # decision has its flags and those of the one stepping.
    scaler = GradScaler("cpu", 64.0)
    optimizers[1].zero_grad()
    optimizers[0].zero_grad()
    scaler.scale(model.loss(X, _poisoned())).backward()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.unscale_(optimizers[1])
    scaler.step(optimizers[0])
    scaler.step(optimizers[1])
    scaler.update()
    assert _same(before, [p.detach() for p in model.parameters()])
    assert scaler.get_scale() == 32.0 and len(optimizers[0].seen) == 3


def test_an_optimizer_unscaled_before_its_own_unscaling_step() -> None:
    """unscale_ (to clip) before a fused step: the optimizer gets no scale, as with stock."""
    model, reference_model = _mlp(), _mlp()
    optimizer = _UnscalesItself(model.parameters())
    reference = _UnscalesItself(reference_model.parameters())
    for scaler, m, opt in (
        (GradScaler("cpu", 64.0), model, optimizer),
        (torch.amp.GradScaler("cpu", 64.0), reference_model, reference),
    ):
        opt.zero_grad()
        scaler.scale(_loss(m, X)).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(m.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
    assert optimizer.seen == reference.seen == [(None, 0.0)]
    assert _same(list(model.parameters()), list(reference_model.parameters()))


def test_stocks_private_state_stays_coherent() -> None:
    """What libraries read of stock's private state (FSDP's sharded scaler, accelerate, torch's
    own tests): _init_scale, _init_growth_tracker and _growth_tracker follow ours, are loaded
    with a state dict, and _check_inf_per_device works after scale(), in this scaler's mode."""
    scaler = GradScaler("cpu", 8.0, growth_interval=5, overflow_mode="saturation")
    assert scaler._growth_tracker is None and scaler._init_growth_tracker == 0
    _drive(scaler, [True, True])
    assert (scaler._init_scale, scaler._init_growth_tracker) == (8.0, 2)
    scaler._init_growth_tracker = 7
    scaler.load_state_dict(torch.amp.GradScaler("cpu", 3.0).state_dict())
    assert (scaler._init_scale, scaler._init_growth_tracker, scaler.get_scale()) == (3.0, 0, 3.0)

    weight = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([weight], 0.1)
    scaler.scale((weight * 70000.0 / 3.0).sum()).backward()  # finite, 70000 once scaled
    assert scaler._growth_tracker.item() == 0
    found = scaler._check_inf_per_device(optimizer)
    assert [v.item() for v in found.values()] == [1.0]  # saturation: past 65504
    assert torch.equal(weight.grad, torch.full((3,), 70000.0))  # checked, left scaled
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 1.5 and torch.equal(weight.detach(), torch.zeros(3))


def _capped_run(scaler: torch.amp.GradScaler, write: str) -> tuple[list[float], list]:
    """Train through a clean, clean, overflowed, clean, clean pass, capping the scale at 128 the
    way scripts do it, by writing stock's `_scale` (insightface's MaxClipGradScaler fills it)."""
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scales = []
    for x in (X, X, _poisoned(), X, X):
        if scaler.get_scale() > 128.0:
            if write == "fill_":
                scaler._scale.fill_(128.0)
            else:
                scaler._scale = torch.full((), 128.0)
        _train_step(scaler, model, optimizer, x, clip=1.0)
        scales.append(scaler.get_scale())
    return scales, _snapshot(model, optimizer)


@pytest.mark.parametrize("write", ["fill_", "assign"])
def test_a_scale_written_into_stocks_scale_tensor_is_the_scale(write: str) -> None:
    """Loss and gradients meet the written scale, and the rule goes on from it, as in stock
    (before, the loss was multiplied by the written scale and the gradients divided by the
    one kept on the host)."""
    stock_scales, stock_state = _capped_run(
        torch.amp.GradScaler("cpu", 64.0, growth_interval=1), write
    )
    ours_scales, ours_state = _capped_run(GradScaler("cpu", 64.0, growth_interval=1), write)
    assert stock_scales == [128.0, 256.0, 64.0, 128.0, 256.0]
    assert ours_scales == stock_scales and _same(ours_state, stock_state)


@pytest.mark.parametrize("written", [math.nan, math.inf, -1.0])
def test_a_scale_written_into_scale_that_no_rule_can_take_is_refused(written: float) -> None:
    """The next call that reads the scale says what was written; the host's scale, the weights
    and the counters stay as they were."""
    scaler = GradScaler("cpu", 64.0)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    _train_step(scaler, model, optimizer, X)
    before = _snapshot(model, optimizer)
    scaler._scale.fill_(written)
    with pytest.raises(ValueError, match=r"written into _scale must be finite and >= 0"):
        scaler.scale(_loss(model, X))
    assert _same(_snapshot(model, optimizer), before)
    assert (scaler._state.scale, scaler.skipped_steps) == (64.0, 0)


def test_a_growth_factor_of_one_set_later_stops_growth_as_in_stock() -> None:
    """Stock's constructor wants a growth factor above 1, its setter and state dict take 1
    (scripts freeze the scale at a cap so); ours did refuse it there."""
    ours, stock = GradScaler("cpu", 64.0, growth_interval=1), torch.amp.GradScaler("cpu", 64.0)
    stock.set_growth_interval(1)
    for scaler in (ours, stock):
        scaler.set_growth_factor(1)
        _drive(scaler, [True, True])
    assert ours.get_scale() == stock.get_scale() == 64.0 and ours.get_growth_factor() == 1.0
    loaded = GradScaler("cpu")
    loaded.load_state_dict(stock.state_dict())
    assert loaded.get_growth_factor() == 1.0
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler("cpu", growth_factor=1.0)  # stock's constructor refuses it too


def _dropped_attempt_then_retry(scaler: torch.amp.GradScaler, retry: torch.Tensor) -> bool:
    """composer's trainer on running out of memory mid-update: the attempt's gradients and
    stock's per-optimizer state are dropped (`_per_optimizer_states` replaced), the batch is
    retried. Returns whether the retry's step moved the model."""
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scaler.scale(_loss(model, X)).backward()
    scaler.unscale_(optimizer)  # judged clean: the dropped attempt's flags say "apply"
    optimizer.zero_grad(set_to_none=True)
    scaler._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)
    before = _snapshot(model, optimizer)
    scaler.scale(_loss(model, retry)).backward()
    scaler.step(optimizer)
    scaler.update()
    return not _same(_snapshot(model, optimizer), before)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_replacing_stocks_per_optimizer_states_starts_the_update_afresh(mode: str) -> None:
    """A retry that overflows after the state was replaced is skipped and backs off, as with
    stock; a clean retry is applied (the replaced state's unscale_ is forgotten, as in stock)."""
    for retry, moved, scale in ((_poisoned(), False, 512.0), (X, True, 1024.0)):
        ours = GradScaler("cpu", 1024.0, overflow_mode=mode)  # no saturation at this scale
        stock = torch.amp.GradScaler("cpu", 1024.0)
        assert _dropped_attempt_then_retry(stock, retry) is moved and stock.get_scale() == scale
        assert _dropped_attempt_then_retry(ours, retry) is moved and ours.get_scale() == scale
        assert ours.skipped_steps == (0 if moved else 1)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("layout", ["float64", "non-contiguous", "sparse"])
def test_private_unscale_takes_a_one_element_scale_as_stock(mode: str, layout: str) -> None:
    """torch's tests and some libraries call _unscale_grads_ with 1-element 1-D tensors."""
    weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.float64 if layout == "float64" else None))
    grad = torch.full((4, 4), 8.0, dtype=weight.dtype)
    if layout == "non-contiguous":
        grad = torch.full((4, 8), 8.0)[:, ::2]
    if layout == "sparse":
        grad = grad.to_sparse()
    weight.grad = grad
    optimizer = torch.optim.SGD([weight], 1.0)
    inv, found = torch.full((1,), 0.25), torch.zeros(1)
    per_device = GradScaler("cpu", overflow_mode=mode)._unscale_grads_(optimizer, inv, found, False)
    assert [v.item() for v in per_device.values()] == [0.0] and found.shape == (1,)
    assert torch.equal(weight.grad.to_dense(), torch.full((4, 4), 2.0, dtype=weight.dtype))
    weight.grad = torch.full_like(weight, INF)
    per_device = GradScaler("cpu", overflow_mode=mode)._unscale_grads_(optimizer, inv, found, False)
    assert [v.item() for v in per_device.values()] == [1.0]


def test_per_optimizer_decisions_as_stock_on_request() -> None:
    """per_optimizer=True: stock's decisions, each optimizer on its own gradients (the half-applied
    update the default avoids), scale and weights as stock's; the default skips both."""

    def run(scaler: torch.amp.GradScaler) -> list:
        model, optimizers = _two_parts()
        trace = []
        for y in (X, _poisoned(), X):  # the inf overflows part b only
            _two_part_update(scaler, model, optimizers, y)
            trace.append((scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
        return trace

    stock = run(torch.amp.GradScaler("cpu", 256.0))
    ours = run(GradScaler("cpu", 256.0, per_optimizer=True))
    assert [s for s, _ in ours] == [s for s, _ in stock] == [256.0, 128.0, 128.0]
    assert all(_same(a, b) for (_, a), (_, b) in zip(ours, stock))
    one = run(GradScaler("cpu", 256.0))
    assert _same(one[1][1], one[0][1])  # the default applied neither part
    assert not _same(stock[1][1], stock[0][1])  # stock applied the clean part


# -- the rule -------------------------------------------------------------------------------------


def test_floor_of_one_where_stock_reaches_zero() -> None:
    ours_model, stock_model = _mlp(), _mlp()
    ours_opt = torch.optim.SGD(ours_model.parameters(), 0.1)
    stock_opt = torch.optim.SGD(stock_model.parameters(), 0.1)
    ours = GradScaler("cpu", backoff_factor=1e-10)
    stock = torch.amp.GradScaler("cpu", backoff_factor=1e-10)
    for _ in range(6):
        _train_step(ours, ours_model, ours_opt, _poisoned())
        _train_step(stock, stock_model, stock_opt, _poisoned())
    assert stock.get_scale() == 0.0  # every later gradient would be 0
    assert ours.get_scale() == 1.0 and ours.skipped_steps == 6


def _sum_reduced_run(scaler: torch.amp.GradScaler, steps: int = 8) -> list[tuple]:
    """Float16 autocast on a loss summed over 8192 rows: its weight gradient overflows float16
    (inf) at scales 1 to 0.25 and trains from 0.125. Per step: scale, applied, weights."""
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), 1e-7)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(8192, 16, generator=generator) * 4
    y = torch.rand(8192, 4, generator=generator) * 4 + 8
    trace = []
    for _ in range(steps):
        optimizer.zero_grad()
        before = model.weight.detach().clone()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x), y, reduction="sum")
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        weights = [p.detach().clone() for p in model.parameters()]
        applied = not torch.equal(before, model.weight)
        trace.append((scaler.get_scale(), applied, weights))
    return trace


def test_a_loss_that_overflows_unscaled_trains_below_one_as_with_stock() -> None:
    """Stock torch lets the scale fall below 1, which such a script needs: with min_loss_scale=0
    ours does too, step for step (scales, skips, bitwise weights); init_scale below 1 starts
    there. The default floor of 1 skips every step, and the stuck-run guard says so."""
    stock = _sum_reduced_run(torch.amp.GradScaler("cpu", 1.0, growth_interval=3))
    ours = _sum_reduced_run(GradScaler("cpu", 1.0, growth_interval=3, min_loss_scale=0))
    expected = [(0.5, False), (0.25, False), (0.125, False), (0.125, True)]
    assert [(s, a) for s, a, _ in stock][:4] == expected
    assert [(s, a) for s, a, _ in ours] == [(s, a) for s, a, _ in stock]
    assert all(_same(mine, theirs) for (_, _, mine), (_, _, theirs) in zip(ours, stock))

    low = _sum_reduced_run(GradScaler("cpu", 0.125, growth_interval=100, min_loss_scale=0.125))
    stock_low = _sum_reduced_run(torch.amp.GradScaler("cpu", 0.125, growth_interval=100))
    assert [(s, a) for s, a, _ in low] == [(0.125, True)] * 8
    assert all(_same(mine, theirs) for (_, _, mine), (_, _, theirs) in zip(low, stock_low))

    floored = _sum_reduced_run(GradScaler("cpu", 1.0))
    assert [(s, a) for s, a, _ in floored] == [(1.0, False)] * 8
    with pytest.raises(RuntimeError, match="3 consecutive training steps were skipped"):
        _sum_reduced_run(GradScaler("cpu", 1.0, max_skipped_steps_at_floor=3))


def test_no_floor_falls_to_zero_as_stock_and_loads_stocks_zero() -> None:
    """min_loss_scale=0 is stock's rule to the last bit, down to 0, and a stock state dict at 0
    loads as it is. At a scale whose reciprocal is inf in float32, unscaling turns the gradients
    into NaN (0 * inf) after the check passed them: stock applies that step and its weights
    become NaN; ours skips it, with a warning when the scale gets there."""
    steps = [False] * 170

    def weights_after(scaler: torch.amp.GradScaler) -> tuple[list[float], list[torch.Tensor]]:
        model = _mlp()
        optimizer = torch.optim.SGD(model.parameters(), 0.01)
        scales = []
        for finite in steps + [True]:
            _train_step(scaler, model, optimizer, X if finite else _poisoned())
            scales.append(scaler.get_scale())
        return scales, [p.detach() for p in model.parameters()]

    stock_scales, stock_weights = weights_after(torch.amp.GradScaler("cpu"))
    with pytest.warns(UserWarning, match="every step is skipped from now on") as caught:
        ours_scales, ours_weights = weights_after(GradScaler("cpu", min_loss_scale=0))
    assert len(caught) == 1 and caught[0].filename == __file__
    assert ours_scales == stock_scales and stock_scales[-2:] == [0.0, 0.0]
    assert all(w.isnan().all() for w in stock_weights)  # the clean step at 0 poisoned them
    assert _same(ours_weights, [p.detach() for p in _mlp().parameters()])

    scaler = GradScaler("cpu", min_loss_scale=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.load_state_dict(torch.amp.GradScaler("cpu").state_dict() | {"scale": 0.0})
    assert scaler.get_scale() == 0.0 and _drive(scaler, [True]) == [0.0]
    assert scaler.last_step_applied is False
    scaler.update(0.25)  # new_scale below 1 where the floor allows it
    assert scaler.get_scale() == 0.25 and _drive(scaler, [True]) == [0.25]
    assert scaler.last_step_applied is True


def test_stuck_run_guard_raises_with_the_rules_message() -> None:
    scaler = GradScaler("cpu", init_scale=4.0, max_skipped_steps_at_floor=3)
    _, rule = DynamicRule.validated(4.0, 2000, 1, 2.0, 0.5, max_skipped_steps_at_floor=3)
    states = run(rule, 4.0, [False] * 10)
    trip = next(i for i, s in enumerate(states) if rule.is_stuck(s))
    model, optimizer = _mlp(), None
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    for _ in range(trip):
        _train_step(scaler, model, optimizer, _poisoned())
    with pytest.raises(RuntimeError, match="consecutive training steps were skipped") as error:
        _train_step(scaler, model, optimizer, _poisoned())
    assert str(error.value) == rule.stuck_message("inf_nan")
    _train_step(scaler, model, optimizer, X)  # still usable after the error
    assert scaler.last_step_applied is True


def test_hysteresis_and_ceiling_follow_the_rule() -> None:
    scaler = GradScaler("cpu", 8.0, 2.0, 0.5, 2, decr_every_n_nan_or_inf=2, max_loss_scale=16.0)
    _, rule = DynamicRule.validated(8.0, 2, 2, 2.0, 0.5, max_loss_scale=16.0)
    steps = [True, True, True, True, False, True, False, False, True]
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.01)
    for finite, want in zip(steps, run(rule, 8.0, steps)):
        _train_step(scaler, model, optimizer, X if finite else _poisoned())
        assert (scaler.get_scale(), scaler.state_dict()["_bad_steps"]) == (want.scale, want.bad)


def test_fixed_scale_still_skips_overflowed_steps() -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scaler = GradScaler("cpu", 128.0, growth_interval=1, dynamic=False)
    for x in (X, X, _poisoned(), X, _poisoned(math.nan)):
        before = _snapshot(model)
        _train_step(scaler, model, optimizer, x)
        assert scaler.get_scale() == 128.0
        assert _same(_snapshot(model), before) is (x is not X)
    assert scaler.skipped_steps == 2


def test_host_reads_per_step_no_more_than_stock() -> None:
    for mode in ("inf_nan", "saturation"):
        counts = []
        for scaler in (GradScaler("cpu", overflow_mode=mode), torch.amp.GradScaler("cpu")):
            model = _mlp()
            optimizer = torch.optim.SGD(model.parameters(), 0.1)
            _train_step(scaler, model, optimizer, X)
            counts.append(
                _host_reads(lambda s=scaler, m=model, o=optimizer: _train_step(s, m, o, X))
            )
        assert counts[0] <= counts[1] == 1, mode


def test_update_with_a_new_scale_and_pickling_mid_iteration() -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scaler = GradScaler("cpu", min_loss_scale=4.0)
    scaler.scale(_loss(model, X)).backward()
    scaler.step(optimizer)
    with pytest.raises(AssertionError, match="pickled"):
        pickle.dumps(scaler)
    scaler.update(8.0)
    assert scaler.get_scale() == 8.0 and scaler.scale(torch.ones(())).item() == 8.0
    _train_step(scaler, model, optimizer, _poisoned())
    assert scaler.get_scale() == 4.0  # the floor
    scaler.scale(_loss(model, X)).backward()
    scaler.step(optimizer)
    with pytest.raises(ValueError, match="min_loss_scale"):
        scaler.update(2.0)


def test_disabled_scaler_is_a_pass_through() -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    scaler = GradScaler("cpu", enabled=False)
    loss = _loss(model, X)
    assert scaler.scale(loss) is loss
    before = _snapshot(model)
    loss.backward()
    scaler.step(optimizer)
    scaler.update()
    assert not _same(_snapshot(model), before)
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}


# -- checkpoints and managers ---------------------------------------------------------------------


def _drive(scaler: GradScaler, steps: list[bool]) -> list[float]:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), 0.01)
    scales = []
    for finite in steps:
        _train_step(scaler, model, optimizer, X if finite else _poisoned())
        scales.append(scaler.get_scale())
    return scales


def test_state_dict_round_trips_through_torch_save(tmp_path: object) -> None:
    settings = dict(decr_every_n_nan_or_inf=2, max_loss_scale=2.0**12, max_skipped_steps_at_floor=9)
    scaler = GradScaler("cpu", 1024.0, 2.0, 0.8, 3, **settings)
    _drive(scaler, [True, False, True, True, False])
    path = tmp_path / "scaler.pt"
    torch.save(scaler.state_dict(), path)
    resumed = GradScaler("cpu")
    resumed.load_state_dict(torch.load(path, weights_only=True))
    assert resumed.state_dict() == scaler.state_dict()
    later = [False, False, True, True, True, True]
    assert _drive(resumed, later) == _drive(scaler, later)

    pickled = pickle.loads(pickle.dumps(scaler))
    assert pickled.state_dict() == scaler.state_dict()
    assert _drive(pickled, later) == _drive(scaler, later)


def test_loads_a_stock_state_dict_and_continues_like_stock() -> None:
    stock = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=4)
    _drive(stock, [True, True, True])
    ours = GradScaler("cpu")
    ours.load_state_dict(stock.state_dict())
    assert (ours.get_scale(), ours.get_growth_interval(), ours._get_growth_tracker()) == (
        1024,
        4,
        3,
    )
    assert _drive(ours, [True, False, True]) == _drive(stock, [True, False, True])

    collapsed = {**stock.state_dict(), "scale": 0.0}  # what stock reaches after many overflows
    with pytest.warns(UserWarning, match="below min_loss_scale") as caught:
        ours.load_state_dict(collapsed)
    assert caught[0].filename == __file__  # points at the caller's line
    assert ours.get_scale() == 1.0  # resumes from the floor, so gradients are not all 0
    assert _drive(ours, [True]) == [1.0] and ours.last_step_applied is True
    with pytest.raises(ValueError, match=r"state_dict\['scale'\]"):
        ours.load_state_dict({**stock.state_dict(), "scale": float("nan")})
    with pytest.raises(RuntimeError, match="empty"):
        ours.load_state_dict({})


def test_load_state_dict_refuses_what_is_not_a_scalers_state_and_names_it() -> None:
    """Stock raises KeyError: 'scale' for a whole checkpoint or an optimizer's state dict; ours
    says which it is and where the scaler's state is. A malformed counter names its entry.
    Nothing is loaded from a refused dict."""
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters())
    scaler = GradScaler("cpu", 64.0, growth_interval=7)
    _drive(scaler, [True, True])
    before = scaler.state_dict()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": GradScaler("cpu", 8.0).state_dict(),
        "epoch": 3,
    }
    with pytest.raises(KeyError) as stock_error:
        torch.amp.GradScaler("cpu").load_state_dict(checkpoint)
    assert stock_error.value.args == ("scale",)
    with pytest.raises(KeyError, match=r"whole checkpoint.*checkpoint\['scaler'\]"):
        scaler.load_state_dict(checkpoint)
    with pytest.raises(KeyError, match="an optimizer's state dict"):
        scaler.load_state_dict(optimizer.state_dict())
    with pytest.raises(KeyError, match=r"keys \['epoch'\]"):
        scaler.load_state_dict({"epoch": 3})
    for key in ("_growth_tracker", "_bad_steps", "_skipped_steps", "_skips_at_floor"):
        for bad in ("abc", -1, 2.5, True):
            with pytest.raises(ValueError, match=rf"state_dict\['{key}'\] must be a non-neg"):
                scaler.load_state_dict({**before, key: bad})
    with pytest.raises(ValueError, match=r"state_dict\['growth_interval'\]"):
        scaler.load_state_dict({**before, "growth_interval": 0})
    with pytest.raises(ValueError, match=r"state_dict\['dynamic'\]"):
        scaler.load_state_dict({**before, "dynamic": "yes"})
    assert scaler.state_dict() == before
    scaler.load_state_dict({**before, "_growth_tracker": torch.tensor(3), "_bad_steps": 1.0})
    assert scaler.state_dict() == {**before, "_growth_tracker": 3, "_bad_steps": 1}


def test_loads_a_torch_npu_state_dict_with_its_dynamic_key() -> None:
    # What torch_npu.npu.amp.GradScaler.state_dict() returns: stock's entries plus "dynamic".
    torch_npu_state = {
        "scale": 512.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 100,
        "_growth_tracker": 5,
        "dynamic": False,
    }
    scaler = GradScaler("cpu")
    scaler.load_state_dict(torch_npu_state)
    assert scaler.dynamic is False and scaler.get_growth_interval() == 100
    assert _drive(scaler, [False, True, False]) == [512.0] * 3
    assert scaler.skipped_steps == 2
    assert {k: v for k, v in scaler.state_dict().items() if k in torch_npu_state} == {
        **torch_npu_state,
        "_growth_tracker": 5,
    }


def test_from_manager_takes_the_adapters_rule_and_settings() -> None:
    manager = ExponentialUpdateLossScaleManager(
        2.0**10,
        3,
        decr_every_n_nan_or_inf=2,
        decr_ratio=0.8,
        overflow_mode="saturation",
        is_distributed=False,
        max_skipped_steps_at_floor=50,
    )
    scaler = GradScaler.from_manager(manager, device="cpu")
    assert scaler.overflow_mode is OverflowMode.SATURATION and scaler.is_distributed is False
    assert (scaler.get_scale(), scaler.get_growth_interval(), scaler.get_backoff_factor()) == (
        1024.0,
        3,
        0.8,
    )
    assert scaler.state_dict()["decr_every_n_nan_or_inf"] == 2
    assert scaler.state_dict()["max_skipped_steps_at_floor"] == 50
    assert GradScaler.from_manager(manager, device="cpu", is_distributed=True).is_distributed

    fixed = GradScaler.from_manager(
        FixedLossScaleManager(128, overflow_mode="inf_nan"), device="cpu"
    )
    assert fixed.dynamic is False and fixed.get_scale() == 128.0 and fixed.is_distributed is None
    with pytest.raises(ValueError, match="enable_overflow_check"):
        GradScaler.from_manager(FixedLossScaleManager(128, False))
    with pytest.raises(ValueError, match="manager must be"):
        GradScaler.from_manager(GradScaler("cpu"))


def test_managers_driven_by_hand_follow_the_rule() -> None:
    manager = ExponentialUpdateLossScaleManager(1024, 2, decr_every_n_nan_or_inf=2)
    steps = [True, True, False, False, True, False, True, True]
    states = run(manager.rule, 1024.0, steps)
    for finite, want in zip(steps, states):
        assert manager().dtype == torch.float32
        manager.update_loss_scale(torch.tensor(finite) if finite else finite)
        assert (manager.get_loss_scale().item(), manager.skipped_steps) == (
            want.scale,
            want.skipped,
        )
    fixed = FixedLossScaleManager(64)
    for finite in steps:
        fixed.update_loss_scale(finite)
    assert fixed.get_loss_scale().item() == 64.0 and fixed.skipped_steps == 3
    with pytest.raises(ValueError, match="finite_grads"):
        fixed.update_loss_scale(torch.tensor([1.0]))


def test_a_gan_loop_alternating_optimizers_skips_only_the_overflowed_update() -> None:
    """One scaler, an update() after D's step and another after G's (the torch AMP docs' GAN
    pattern): an overflow in D's update must not skip G's clean step through the stale inf
    left in D's gradients, which G's backward adds to. Decisions and scales as stock's."""

    def run(scaler: torch.amp.GradScaler) -> list[tuple[bool, bool, float]]:
        torch.manual_seed(0)
        generator, critic = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        opt_g = torch.optim.SGD(generator.parameters(), 0.1)
        opt_d = torch.optim.SGD(critic.parameters(), 0.1)
        trace = []
        for step in range(3):
            noise, real = torch.randn(8, 4), torch.randn(8, 4)
            critic.zero_grad()
            loss_d = critic(real).mean() - critic(generator(noise).detach()).mean()
            if step == 1:
                loss_d = loss_d * float("inf")
            d_before = critic.weight.detach().clone()
            scaler.scale(loss_d).backward()
            scaler.step(opt_d)
            scaler.update()
            generator.zero_grad()
            g_before = generator.weight.detach().clone()
            scaler.scale(-critic(generator(noise)).mean()).backward()
            scaler.step(opt_g)
            scaler.update()
            trace.append(
                (
                    not torch.equal(d_before, critic.weight),
                    not torch.equal(g_before, generator.weight),
                    scaler.get_scale(),
                )
            )
        return trace

    ours = run(GradScaler("cpu", init_scale=1024.0))
    assert ours == run(torch.amp.GradScaler("cpu", init_scale=1024.0))
    assert [applied_g for _, applied_g, _ in ours] == [True, True, True]
    assert ours[1][0] is False  # D's own overflowed step was skipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_scaler_without_cuda_says_it_is_disabled_and_what_to_pass() -> None:
    with pytest.warns(UserWarning) as caught:  # stock's own, and ours saying what to pass
        scaler = GradScaler("cuda")
    assert any("device='npu' or leave the default" in str(w.message) for w in caught)
    assert scaler.is_enabled() is False


def test_a_scaler_pickled_before_the_per_scaler_op_lookup_still_steps() -> None:
    # Such a pickle's state has no _fused (what the op lookup is kept in since), nor what was
    # added later; defaults are.
    # The state goes through pickle as a real one would: __getstate__'s shallow copy shares the
    # live scaler's objects.
    scaler = GradScaler("cpu", 1024.0)
    _drive(scaler, [True])
    state = pickle.loads(pickle.dumps(scaler.__getstate__()))
    for added_since in ("_fused", "per_optimizer", "_uninvertible", "_decision"):
        del state[added_since]
    resumed = pickle.loads(pickle.dumps(scaler))
    resumed.__dict__.clear()
    resumed.__setstate__(state)
    later = [True, False, True]
    assert _drive(resumed, later) == _drive(scaler, later)


def test_overflow_mode_set_after_construction_decides_every_gradient() -> None:
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([weight], 0.1)
    scaler = GradScaler("cpu", 1.0, overflow_mode="inf_nan")
    for mode, skipped in ((OverflowMode.INF_NAN, 0), (OverflowMode.SATURATION, 1)):
        scaler.overflow_mode = mode
        optimizer.zero_grad()
        scaler.scale((weight * 70000.0).sum()).backward()  # finite, past 65504
        scaler.step(optimizer)
        scaler.update()
        assert scaler.skipped_steps == skipped, mode


def _vits_loop(
    scaler: torch.amp.GradScaler, unscale_first: bool, overflow_at: tuple[str, int]
) -> list[tuple[bool, bool, float, list[torch.Tensor]]]:
    """A GAN/TTS iteration as VITS writes it: D's backward and step, then G's backward (through
    D, so D's gradients gain G's terms after D stepped) and step, one update() per iteration.
    Per iteration: whether D stepped, whether G stepped (Adam's step counts), the scale, and
    every weight."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(4, 4), nn.Linear(4, 1)
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), 0.1), torch.optim.Adam(disc.parameters(), 0.1)

    def steps(optimizer: torch.optim.Optimizer) -> float:
        return sum(float(s["step"]) for s in optimizer.state.values())

    def backward_and_step(loss: torch.Tensor, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad()
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
            torch.stack([p.grad.norm() for p in model.parameters()]).norm()  # VITS's grad norm
        scaler.step(opt)

    trace = []
    for it in range(5):
        noise, real = torch.randn(8, 4), torch.randn(8, 4)
        d_steps, g_steps = steps(opt_d), steps(opt_g)
        loss_d = disc(gen(noise).detach()).mean() - disc(real).mean()
        if overflow_at == ("d", it):
            loss_d = loss_d * INF
        backward_and_step(loss_d, disc, opt_d)
        loss_g = -disc(gen(noise)).mean()
        if overflow_at == ("g", it):
            loss_g = loss_g * INF
        backward_and_step(loss_g, gen, opt_g)
        scaler.update()
        weights = [p.detach().clone() for p in [*gen.parameters(), *disc.parameters()]]
        trace.append((steps(opt_d) > d_steps, steps(opt_g) > g_steps, scaler.get_scale(), weights))
    return trace


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize("unscale_first", [True, False])
@pytest.mark.parametrize("overflow_at", [("g", 1), ("d", 1), ("g", 0), ("g", 4)])
def test_a_gan_loop_with_one_update_per_iteration_decides_as_stock(
    mode: str, unscale_first: bool, overflow_at: tuple[str, int]
) -> None:
    """VITS-style loop, one scaler, one update() per iteration, D stepped before G's backward:
    after G overflows, D's next step must not read G's stale inf gradients (which G only zeroes
    after D has stepped) and skip, halving the scale a second time. Every iteration as stock:
    which optimizers stepped, the scale, bitwise the weights."""
    ours = _vits_loop(GradScaler("cpu", 1024.0, overflow_mode=mode), unscale_first, overflow_at)
    stock = _vits_loop(torch.amp.GradScaler("cpu", 1024.0), unscale_first, overflow_at)
    for it, (mine, theirs) in enumerate(zip(ours, stock)):
        assert mine[:3] == theirs[:3], it
        assert _same(mine[3], theirs[3]), it
    who, at = overflow_at
    assert [(d, g) for d, g, _, _ in ours] == [
        (not (who == "d" and it == at), not (who == "g" and it == at)) for it in range(5)
    ]
