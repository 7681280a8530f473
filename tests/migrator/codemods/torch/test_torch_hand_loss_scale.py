"""PyTorch code that scales its loss by hand (THUMT's LossScalingOptimizer) is left as it is with
one warning: at its inf/NaN-only check where it has one, else at the multiplication with the
harder words (no overflow mode helps); a loss weighted for logging gets none. Through the real
CLI; every file stays byte-identical. The scale may reach the loss and the gradients under
different spellings (a local name, a power of the attribute), and the check may be a function of
the module that compares with infinity."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree

FIXTURE = MIGRATOR_FIXTURES / "torch_hand_loss_scale"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("torch_hand_loss_scale"), FIXTURE)


def _line(name: str, text: str) -> int:
    source = (FIXTURE / name).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(source, 1) if text in line)


def _findings(ported: dict, name: str) -> list[dict]:
    return [f for f in ported["findings"] if Path(f["path"]).name == name]


def _warning_at(ported: dict, name: str, text: str) -> str:
    """The message of the file's one finding, checked to be this rule's warning at `text`."""
    (found,) = _findings(ported, name)
    assert (found["rule"], found["kind"], found["line"]) == (
        "torch-hand-loss-scale",
        "warning",
        _line(name, text),
    )
    return found["message"]


def test_a_scaler_class_is_warned_at_its_check(ported) -> None:
    message = _warning_at(ported, "scaling_optimizer.py", "torch.isfinite(grad.norm())")
    assert "(`loss * self._scale`" in message
    assert "finds inf/NaN only" in message and "INF/NAN mode" in message
    assert "npu_lossscale.torch.GradScaler" in message


def test_without_a_check_it_is_warned_at_the_multiplication(ported) -> None:
    message = _warning_at(ported, "static_scaler.py", "(loss * loss_scale).backward()")
    assert "either overflow mode" in message and "INF/NAN mode" not in message


def test_a_scale_spelled_as_a_power_is_warned_at_the_modules_check(ported) -> None:
    # The loss through a local name, the gradients by the power spelled out again; the check a
    # function of the module comparing with infinity and with itself.
    message = _warning_at(ported, "exponent_scale.py", "if found_inf_or_nan(norm):")
    assert "(`loss * loss_scale`" in message
    assert "(`found_inf_or_nan(norm)`) finds inf/NaN only" in message


def test_a_scale_read_into_a_local_name_is_matched_with_the_attribute(ported) -> None:
    message = _warning_at(ported, "aliased_scale.py", "(loss * current_scale).backward()")
    assert "(`loss * current_scale`" in message and "either overflow mode" in message


def test_a_loss_weighted_for_logging_is_not_warned(ported) -> None:
    assert _findings(ported, "loss_logging.py") == []


@pytest.mark.parametrize("name", [p.name for p in sorted(FIXTURE.glob("*.py"))])
def test_every_file_is_left_byte_identical(ported, name: str) -> None:
    assert (ported["out"] / name).read_bytes() == (FIXTURE / name).read_bytes()
    assert ported["again"].returncode == 0


_CLASS = """import math
import torch


class Scaled:
    def backward(self, loss):
        (loss * self.loss_scale).backward()

    def step(self, optimizer, params):
        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        if {test}:
            return False
        for p in params:
            p.grad.div_(self.loss_scale)
        optimizer.step()
"""


@pytest.mark.parametrize(
    ("test", "shown"),
    [
        ("norm != norm", "norm != norm"),
        ('norm == float("inf")', "norm == float('inf')"),
        ("norm == -math.inf", "norm == -math.inf"),
        ("math.isinf(norm)", "math.isinf(norm)"),
        ("torch.isnan(norm).any()", "torch.isnan(norm)"),
    ],
)
def test_each_inf_or_nan_test_is_the_check(test: str, shown: str) -> None:
    from migrator.selection import torch_hand_loss_scale

    source = _CLASS.format(test=test).encode()
    assert torch_hand_loss_scale.site(source) == (11, "loss * self.loss_scale", shown)


def test_a_bound_on_the_norm_is_not_an_inf_or_nan_check() -> None:
    from migrator.selection import torch_hand_loss_scale

    source = _CLASS.format(test="norm > 1e4").encode()
    assert torch_hand_loss_scale.site(source) == (7, "loss * self.loss_scale", None)
