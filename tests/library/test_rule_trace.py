"""One reference trace for every front-end: the core rule, the TF1 managers, Keras and PyTorch.

The expected states come from tests/update_rule_reference.py, written out from the rule's text and
independent of the library; the core rule (npu_lossscale.rule) must match it step for step, and so
must each front-end driven through its public API. A front-end's driver takes the settings in the
rule's own words and returns (scale, skipped) after every step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import rule_driver
from update_rule_reference import reference_run

from npu_lossscale import rule

# name -> (init_loss_scale, rule settings, steps as finite flags)
TRACES: dict[str, tuple[float, dict, list[bool]]] = {
    "adapter-defaults": (
        2.0**15,
        dict(incr_every_n_steps=3, decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.8),
        [True, True, True, False, True, False, False, True, True, True, False, False, False],
    ),
    "floor-and-cap": (
        4.0,
        dict(
            incr_every_n_steps=2,
            decr_every_n_nan_or_inf=1,
            incr_ratio=2.0,
            decr_ratio=0.5,
            min_loss_scale=2.0,
            max_loss_scale=16.0,
        ),
        [False, False, False, True, True, True, True, True, True, True, True, False],
    ),
    "float32-ceiling": (
        2.0**126,
        dict(incr_every_n_steps=1, decr_every_n_nan_or_inf=1, incr_ratio=4.0, decr_ratio=0.5),
        [True, True, True, False, True, True],
    ),
}


def _random_steps(seed: int, n: int, p_finite: float) -> list[bool]:
    generator = np.random.default_rng(seed)
    return [bool(x) for x in generator.random(n) < p_finite]


TRACES["random-hysteresis"] = (
    1024.0,
    dict(incr_every_n_steps=4, decr_every_n_nan_or_inf=3, incr_ratio=2.0, decr_ratio=0.8),
    _random_steps(7, 300, 0.7),
)

Driver = Callable[[float, dict, list[bool]], list[tuple[float, int]]]


def _expected(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    return [(float(s.scale), s.skipped) for s in reference_run(init, steps, **hyper)]


def _core(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    _, settings = rule.DynamicRule.validated(
        init,
        hyper["incr_every_n_steps"],
        hyper["decr_every_n_nan_or_inf"],
        hyper["incr_ratio"],
        hyper["decr_ratio"],
        min_loss_scale=hyper.get("min_loss_scale", 1.0),
        max_loss_scale=hyper.get("max_loss_scale"),
    )
    return [(s.scale, s.skipped) for s in rule_driver.run(settings, init, steps)]


def _tf_manager(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    from npu_lossscale import ExponentialUpdateLossScaleManager

    manager = ExponentialUpdateLossScaleManager(init, **hyper)
    states = []
    for finite in steps:
        manager.update_loss_scale(finite)
        states.append((float(manager.get_loss_scale().numpy()), int(manager.skipped_steps.numpy())))
    return states


def _keras(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    """Real training steps of a tiny Keras model; an inf in the input makes a step overflow."""
    import keras
    import tensorflow as tf

    from npu_lossscale.keras import LossScaleOptimizer

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    opt = LossScaleOptimizer(
        keras.optimizers.SGD(1e-6),
        init,
        hyper["incr_every_n_steps"],
        decr_every_n_nan_or_inf=hyper["decr_every_n_nan_or_inf"],
        incr_ratio=hyper["incr_ratio"],
        decr_ratio=hyper["decr_ratio"],
        min_loss_scale=hyper.get("min_loss_scale", 1.0),
        max_loss_scale=hyper.get("max_loss_scale"),
    )

    @tf.function
    def step(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_mean(tf.square(model(x) - 2.0)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return opt.loss_scale, opt.skipped_steps

    clean = tf.constant([[0.5, 0.5]] * 4)
    poisoned = tf.constant([[float("inf"), 0.5]] + [[0.5, 0.5]] * 3)
    states = []
    for finite in steps:
        scale, skipped = step(clean if finite else poisoned)
        states.append((float(scale), int(skipped)))
    return states


def _torch_steps(scaler: object, steps: list[bool]) -> list[tuple[float, int]]:
    """Real backward passes of a tiny torch module; an inf in the input makes a step overflow.
    The input is tiny so that no scale up to float32's largest keeps a clean gradient finite."""
    import torch

    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    clean = torch.full((4, 2), 1e-30)
    poisoned = clean.clone()
    poisoned[0, 0] = float("inf")
    states = []
    for finite in steps:
        optimizer.zero_grad()
        scaler.scale(model(clean if finite else poisoned).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        states.append((scaler.get_scale(), scaler.skipped_steps))
    return states


def _torch(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    """GradScaler with torch's argument names for the rule's settings."""
    from npu_lossscale.torch import GradScaler

    scaler = GradScaler(
        "cpu",
        init,
        hyper["incr_ratio"],
        hyper["decr_ratio"],
        hyper["incr_every_n_steps"],
        decr_every_n_nan_or_inf=hyper["decr_every_n_nan_or_inf"],
        min_loss_scale=hyper.get("min_loss_scale", 1.0),
        max_loss_scale=hyper.get("max_loss_scale"),
    )
    return _torch_steps(scaler, steps)


def _torch_manager(init: float, hyper: dict, steps: list[bool]) -> list[tuple[float, int]]:
    """GradScaler.from_manager: the Ascend adapter's rule through its manager's signature."""
    from npu_lossscale.torch import ExponentialUpdateLossScaleManager, GradScaler

    manager = ExponentialUpdateLossScaleManager(init, **hyper)
    return _torch_steps(GradScaler.from_manager(manager, device="cpu"), steps)


DRIVERS: dict[str, Driver] = {
    "core": _core,
    "tf": _tf_manager,
    "keras": _keras,
    "torch": _torch,
    "torch-manager": _torch_manager,
}


@pytest.mark.parametrize("trace", sorted(TRACES))
@pytest.mark.parametrize("front_end", sorted(DRIVERS))
def test_front_end_follows_the_reference_trace(front_end: str, trace: str) -> None:
    init, hyper, steps = TRACES[trace]
    want = _expected(init, hyper, steps)
    got = DRIVERS[front_end](init, hyper, steps)
    assert len(got) == len(want)
    for i, (actual, expected) in enumerate(zip(got, want)):
        assert actual == expected, f"{front_end}, {trace}, step {i}: {actual} != {expected}"


def test_core_rule_counts_skips_at_the_floor_and_resets_on_a_clean_step() -> None:
    _, settings = rule.DynamicRule.validated(2, 1, 1, 2, 0.5, max_skipped_steps_at_floor=3)
    states = rule_driver.run(settings, 2, [False, False, False, True, False, False, False])
    assert [s.skips_at_floor for s in states] == [0, 1, 2, 0, 0, 1, 2]
    assert not settings.is_stuck(states[-2])
    assert settings.is_stuck(rule.RuleState(1.0, skips_at_floor=3))


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (dict(init_loss_scale=0.5), "init_loss_scale"),
        (dict(incr_every_n_steps=0), "incr_every_n_steps"),
        (dict(incr_ratio=1e50), "incr_ratio"),
        (dict(decr_ratio=1.0), "decr_ratio"),
        (dict(min_loss_scale=8, max_loss_scale=4, init_loss_scale=4), "min_loss_scale"),
    ],
)
def test_core_validation_names_the_argument(arguments: dict, named: str) -> None:
    settings = dict(
        init_loss_scale=16,
        incr_every_n_steps=2,
        decr_every_n_nan_or_inf=1,
        incr_ratio=2,
        decr_ratio=0.5,
    )
    settings.update(arguments)
    positional = [settings.pop(k) for k in list(rule._DEFAULT_NAMES)[:5]]
    with pytest.raises(ValueError, match=named):
        rule.DynamicRule.validated(*positional, **settings)


def test_core_validation_speaks_the_front_ends_words() -> None:
    with pytest.raises(ValueError, match="growth_interval"):
        rule.DynamicRule.validated(2, 0, 1, 2, 0.5, names={"incr_every_n_steps": "growth_interval"})


def test_core_rule_imports_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, npu_lossscale.rule, npu_lossscale.modes; "
        "assert not {'tensorflow', 'torch', 'numpy'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_manager_keywords_carry_every_setting_under_the_front_ends_names():
    """What from_manager passes: each of a dynamic manager's settings, under the front-end's
    argument names (torch's here), and a fixed manager as dynamic=False."""
    _, settings = rule.DynamicRule.validated(
        64, 3, 2, 3.0, 0.25, min_loss_scale=2, max_loss_scale=2**20, max_skipped_steps_at_floor=7
    )
    torch_names = {
        "incr_every_n_steps": "growth_interval",
        "incr_ratio": "growth_factor",
        "decr_ratio": "backoff_factor",
    }
    assert rule.manager_keywords(settings, torch_names) == dict(
        dynamic=True,
        growth_interval=3,
        decr_every_n_nan_or_inf=2,
        growth_factor=3.0,
        backoff_factor=0.25,
        min_loss_scale=2.0,
        max_loss_scale=2.0**20,
        max_skipped_steps_at_floor=7,
    )
    assert rule.manager_keywords(None, torch_names) == {"dynamic": False}


def test_a_fixed_scale_refuses_the_stuck_guard():
    with pytest.raises(ValueError, match="max_skipped_steps_at_floor applies only"):
        rule.DynamicRule.validated(8, 2000, 1, 2, 0.5, max_skipped_steps_at_floor=3, dynamic=False)
    _, settings = rule.DynamicRule.validated(8, 2000, 1, 2, 0.5, dynamic=False)
    assert settings.max_skipped_steps_at_floor is None
