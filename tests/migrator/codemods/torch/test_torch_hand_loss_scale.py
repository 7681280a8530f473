"""PyTorch code that scales its loss by hand (THUMT's LossScalingOptimizer) is left as it is with
one warning: at its inf/NaN-only check where it has one, else at the multiplication with the
harder words (no overflow mode helps); a loss weighted for logging gets none. Through the real
CLI; every file stays byte-identical. The scale may reach the loss and the gradients under
different spellings (a local name, a power of the attribute), and the check may be a function of
the module that compares with infinity."""

from __future__ import annotations

import ast

import pytest
from cli_runner import MIGRATOR_FIXTURES, findings_of, only_warning, port_fixture_tree

from migrator.selection.hand_loss_scale import divisions

FIXTURE = MIGRATOR_FIXTURES / "torch_hand_loss_scale"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("torch_hand_loss_scale"), FIXTURE)


def _warning_at(ported: dict, name: str, text: str) -> str:
    """The message of the file's one finding, checked to be this rule's warning at `text`."""
    return only_warning(ported, FIXTURE, name, text, "torch-hand-loss-scale")


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
    assert findings_of(ported, "loss_logging.py") == []


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
    assert torch_hand_loss_scale.site(source) == (
        11,
        "loss * self.loss_scale",
        shown,
        True,
        True,
        False,
    )


def test_a_bound_on_the_norm_is_not_an_inf_or_nan_check() -> None:
    from migrator.selection import torch_hand_loss_scale

    source = _CLASS.format(test="norm > 1e4").encode()
    assert torch_hand_loss_scale.site(source) == (
        7,
        "loss * self.loss_scale",
        None,
        True,
        True,
        False,
    )


_SPELLED = """import torch


class Scaled:
    def backward(self, loss):
        scaled = {loss} * self.loss_scale
        scaled.backward()

    def step(self, optimizer, params):
        for p in params:
            {unscale}
        if torch.isinf(p.grad).any():
            return False
        optimizer.step()
"""


@pytest.mark.parametrize(
    ("loss", "shown"),
    [
        # cast to fp32 first: jukebox, pytext, apex's and Megatron's first fp16 optimizers
        ("loss.float()", "loss.float() * self.loss_scale"),
        ("(loss.float())", "loss.float() * self.loss_scale"),
        ("loss.to(torch.float32)", "loss.to(torch.float32) * self.loss_scale"),
    ],
)
def test_a_loss_cast_before_it_is_scaled_is_the_scaled_loss(loss: str, shown: str) -> None:
    from migrator.selection import torch_hand_loss_scale

    source = _SPELLED.format(loss=loss, unscale="p.grad.div_(self.loss_scale)").encode()
    assert torch_hand_loss_scale.site(source) == (
        12,
        shown,
        "torch.isinf(p.grad)",
        True,
        True,
        False,
    )


@pytest.mark.parametrize(
    "unscale", ["p.grad /= self.loss_scale", "p.grad *= 1.0 / self.loss_scale"]
)
def test_gradients_divided_in_place_by_an_operator_are_scaled_back(unscale: str) -> None:
    # ParlAI's SafeFP16Optimizer: `multiply_grads /= self.scaler.loss_scale`
    from migrator.selection import torch_hand_loss_scale

    source = _SPELLED.format(loss="loss", unscale=unscale).encode()
    assert torch_hand_loss_scale.site(source) == (
        12,
        "loss * self.loss_scale",
        "torch.isinf(p.grad)",
        True,
        True,
        False,
    )
    # what is divided in place must be a gradient
    assert [ast.unparse(d) for d in divisions(ast.parse(unscale).body[0], any_value=False)] == [
        "self.loss_scale"
    ]
    assert list(divisions(ast.parse("p.data /= s").body[0], any_value=False)) == []


_ELSEWHERE = """import torch
from fairseq.optim.fp16_optimizer import DynamicLossScaler
{defined}

class Scaled:
    def backward(self, loss):
        (loss * self.loss_scale).backward()

    def step(self, optimizer, params, norm):
        for p in params:
            p.grad.div_(self.loss_scale)
        if DynamicLossScaler.has_overflow(norm):
            return False
        optimizer.step()
"""


def test_a_check_named_for_overflows_but_defined_elsewhere_is_said_to_be_unseen() -> None:
    # pytext's fairseq mixin: the test itself is in fairseq, so nothing here says what it finds
    from migrator.selection import torch_hand_loss_scale

    source = _ELSEWHERE.format(defined="").encode()
    assert torch_hand_loss_scale.site(source) == (
        12,
        "loss * self.loss_scale",
        "DynamicLossScaler.has_overflow(norm)",
        False,
        True,
        False,
    )
    found = torch_hand_loss_scale.finding(source, "mixin.py")
    assert found is not None and found.line == 12
    assert "(`DynamicLossScaler.has_overflow(norm)`) is defined in another module" in found.message
    assert "either overflow mode" not in found.message
    # defined in the module with no inf/NaN test in it (a device status read): no check at all
    own = "\ndef has_overflow(norm):\n    return read_device_status()\n"
    source = _ELSEWHERE.format(defined=own).encode()
    assert torch_hand_loss_scale.site(source) == (
        10,
        "loss * self.loss_scale",
        None,
        True,
        True,
        False,
    )


_SCALER_CLASS = """import torch


class DynamicLossScaler:
    def upscale(self, loss):
        return loss.float() * self.scale

    def unscale(self, grad):
        grad.div_(self.scale)

    def check_overflow(self, grad):
        total = float(grad.float().sum())
        self.is_overflow = total == float("inf") or total != total


class FP16Optimizer:
    def backward(self, loss):
        {backward}
"""


def test_a_scaler_class_handing_the_loss_back_is_warned_where_the_file_calls_backward() -> None:
    # pytext's fp16_optimizer.py: the scaler class scales and checks, another class calls backward
    from migrator.selection import torch_hand_loss_scale

    source = _SCALER_CLASS.format(backward="self.loss_scaler.upscale(loss).backward()").encode()
    found = torch_hand_loss_scale.site(source)
    assert found == (13, "loss.float() * self.scale", "total == float('inf')", True, True, False)
    without = _SCALER_CLASS.format(backward="return self.loss_scaler.upscale(loss)").encode()
    assert torch_hand_loss_scale.site(without) is None  # no backward in the file: not training


_APEX_SCALER = """import torch


class DynamicLossScaler:
    def has_overflow(self, params):
        for p in params:
            if p.grad is not None and {check}:
                return True
        return False

    @staticmethod
    def _has_inf_or_nan(x):
        cpu_sum = float(x.float().sum())
        return cpu_sum == float("inf") or cpu_sum != cpu_sum

    def backward(self, loss):
        scaled_loss = loss * self.loss_scale
        scaled_loss.backward()
"""


def test_a_scaler_leaving_the_gradients_to_another_class_is_warned_at_its_check() -> None:
    # apex's fp16_utils loss_scaler.py, copied by GLM and Megatron's forks: the FP16_Optimizer
    # of another file divides the gradients; this class scales, backpropagates and checks them
    from migrator.selection import torch_hand_loss_scale

    check = "DynamicLossScaler._has_inf_or_nan(p.grad.data)"
    source = _APEX_SCALER.format(check=check).encode()
    # at the test itself: the method's call reads the gradients, the comparison finds inf/NaN
    shown = "cpu_sum == float('inf')"
    assert torch_hand_loss_scale.site(source) == (
        14,
        "loss * self.loss_scale",
        shown,
        True,
        False,
        False,
    )
    found = torch_hand_loss_scale.finding(source, "loss_scaler.py")
    assert found is not None
    assert "(`loss * self.loss_scale`, another class scales the gradients back)" in found.message
    # a weighted loss with a NaN guard on the loss, not on gradients: not loss scaling
    guarded = _APEX_SCALER.format(check="torch.isnan(loss).any()").encode()
    assert torch_hand_loss_scale.site(guarded) is None


def test_a_loss_scaled_in_place_is_the_scaled_loss() -> None:
    # NVIDIA's MLPerf GNMT (seq2seq/train/fp_optimizers.py): `loss *= self.loss_scale`
    from migrator.selection import torch_hand_loss_scale

    source = _SPELLED.replace("scaled = {loss} * self.loss_scale", "{loss} *= self.loss_scale")
    source = source.replace("scaled.backward()", "{loss}.backward()")
    found = torch_hand_loss_scale.site(
        source.format(loss="loss", unscale="p.grad.data /= self.loss_scale").encode()
    )
    assert found == (12, "loss *= self.loss_scale", "torch.isinf(p.grad)", True, True, False)


@pytest.mark.parametrize(
    "product", ["loss.mul(self.loss_scale)", "torch.mul(loss, self.loss_scale)"]
)
def test_a_loss_scaled_by_a_mul_call_is_the_scaled_loss(product: str) -> None:
    from migrator.selection import torch_hand_loss_scale

    source = _SPELLED.replace("{loss} * self.loss_scale", product)
    found = torch_hand_loss_scale.site(
        source.format(unscale="p.grad.div_(self.loss_scale)").encode()
    )
    assert found == (12, product, "torch.isinf(p.grad)", True, True, False)


# Framework trainers: the loss scale kept by one class, the gradients tested by another, the
# loss multiplied in a third (or in another file). Shapes of fairseq/metaseq, Megatron, BMTrain
# and ColossalAI, written small.
_SPREAD = {
    # fairseq's FP16Optimizer: the scaler object is another module's
    "scaler object": (
        """import torch
from .scaler import Scaler


class FP16Optimizer:
    def backward(self, loss):
        loss = self.scaler.scale(loss)
        loss.backward()

    def clip(self, params, max_norm):
        norm = self.factor * torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.scaler.check_overflow(norm)

    def zero_grad(self):
        self.factor = 1.0 / float(self.scaler.loss_scale)
""",
        (12, "self.scaler.loss_scale", "self.scaler.check_overflow(norm)", False),
    ),
    # ...and with the scaler class in the same file: its own test is seen
    "scaler class beside it": (
        """import torch


class Scaler:
    def check_overflow(self, grad_norm):
        if grad_norm == float("inf") or grad_norm != grad_norm:
            self.loss_scale /= 2
            raise OverflowError


class FP16Optimizer:
    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def zero_grad(self):
        self.factor = 1.0 / float(self.scaler.loss_scale)
""",
        (6, "self.loss_scale", "grad_norm == float('inf')", True),
    ),
    # Megatron: torch's private fused unscale-and-check, backward() in another file
    "fused unscale": (
        """import torch


class MixedPrecisionOptimizer:
    def scale_loss(self, loss):
        return self.get_loss_scale() * loss

    def step(self):
        grads = [p.grad for p in self.params]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self.inv_scale)
        if self.found_inf.item() > 0:
            return False
        self.optimizer.step()
""",
        (
            10,
            "self.get_loss_scale() * loss",
            "torch._amp_foreach_non_finite_check_and_unscale_"
            "(grads, self.found_inf, self.inv_scale)",
            True,
        ),
    ),
    # BMTrain: module functions divide and check (the latter through an imported kernel)
    "module helpers and a kernel": (
        """import torch
from .kernels import has_inf_nan


def check_overflow(groups):
    found = torch.zeros(1)
    for group in groups:
        for p in group["params"]:
            has_inf_nan(p.grad, found)
    if found > 0:
        raise OverflowError


def rescale(groups, scale):
    for group in groups:
        for p in group["params"]:
            p.grad /= scale


class Manager:
    def backward(self, loss):
        (loss * (self.loss_scale / self.grad_scale)).backward()

    def step(self, optimizer):
        check_overflow(optimizer.param_groups)
        rescale(optimizer.param_groups, self.loss_scale)
""",
        (9, "p.grad /= scale", "has_inf_nan(p.grad, found)", True),
    ),
    # ColossalAI: the loss is scaled by a mixin of another file; only the unscaling shows here
    "gradients unscaled for a mixin": (
        """import torch


class Mixin:
    def local_overflow(self):
        return any(not torch.isfinite(p.grad).all() for p in self.params)


class Optimizer:
    def backward(self, loss):
        self.mixed_precision.pre_backward(loss).backward()

    def step(self):
        div_scale = self.mixed_precision.get_grad_div_scale()
        for p in self.params:
            p.grad.data.mul_(1.0 / div_scale)
""",
        (6, "p.grad.data.mul_(1.0 / div_scale)", "torch.isfinite(p.grad)", True),
    ),
}


@pytest.mark.parametrize("case", sorted(_SPREAD))
def test_loss_scaling_spread_over_classes_is_warned_at_its_check(case: str) -> None:
    from migrator.selection import torch_hand_loss_scale

    source, (line, shown, check, seen) = _SPREAD[case]
    assert torch_hand_loss_scale.site(source.encode()) == (line, shown, check, seen, True, True)
    found = torch_hand_loss_scale.finding(source.encode(), "optim.py")
    assert found is not None and found.line == line
    assert f"the file does its own loss scaling (`{shown}`)" in found.message
    assert ("is defined in another module" in found.message) is not seen


_GRADSCALER_LOOP = """import math
import torch


def train_one_epoch(model, loader, optimizer, scaler):
    for batch in loader:
        loss = model(batch)
        if not math.isfinite(loss.item()):
            raise SystemExit("loss is {}".format(loss.item()))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        log(loss_scale=scaler.get_scale(), finite=NORM)
"""


@pytest.mark.parametrize("norm", ["None", "torch.isfinite(norm)"])
def test_a_loop_driving_a_scaler_built_elsewhere_is_not_warned(norm: str) -> None:
    """A GradScaler handed in (the file never names the class), a loss-scale figure logged and a
    NaN guard on the loss: the scaler's check is torch's, ported where the scaler is built, and a
    finiteness test of what is not a gradient is no overflow check."""
    from migrator.selection import torch_hand_loss_scale

    assert torch_hand_loss_scale.site(_GRADSCALER_LOOP.replace("NORM", norm).encode()) is None


def test_a_test_the_module_defines_is_read_not_taken_by_its_name() -> None:
    # Named for inf/NaN but the module's own, and bounding the values (what finds a saturated
    # overflow too): no inf/NaN-only check, so nothing to warn about.
    from migrator.selection import torch_hand_loss_scale

    source, _ = _SPREAD["module helpers and a kernel"]
    own = source.replace(
        "from .kernels import has_inf_nan\n",
        "\n\ndef has_inf_nan(x, found):\n    found += (x.abs() >= 65504).any()\n",
    )
    assert torch_hand_loss_scale.site(own.encode()) is None


_STATIC_CHECK = """import torch


class Scaler:
    @staticmethod
    def has_overflow(grad_norm):
        return grad_norm == float("inf") or grad_norm != grad_norm


class FP16Optimizer:
    def backward(self, loss):
        loss *= self.scaler.loss_scale
        loss.backward()

    def step(self, params):
        for p in params:
            p.grad.data.div_(self.scaler.loss_scale)
        if not self.scaler.{call}(torch.nn.utils.clip_grad_norm_(params, 1.0)):
            self.optimizer.step()
"""


def test_a_check_in_another_class_of_the_file_is_the_check() -> None:
    """mlbench's FP16Optimizer calls its DynamicLossScaler's staticmethod `has_overflow(norm)`:
    the file does check the gradients, for inf/NaN only (not "checks no gradient")."""
    from migrator.selection import torch_hand_loss_scale

    source = _STATIC_CHECK.format(call="has_overflow").encode()
    found = torch_hand_loss_scale.site(source)
    assert found is not None
    assert (found.line, found.check, found.seen) == (
        18,
        "self.scaler.has_overflow(torch.nn.utils.clip_grad_norm_(params, 1.0))",
        True,
    )
    # a method not named for a test is not taken for one
    renamed = _STATIC_CHECK.replace("def has_overflow", "def report").format(call="report")
    found = torch_hand_loss_scale.site(renamed.encode())
    assert found is not None and found.check is None
