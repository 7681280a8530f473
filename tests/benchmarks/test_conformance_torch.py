"""benchmarks/conformance/torch.py and the driver on a snapshot of our own in the upstream files'
shape (the upstream texts are never in this repository): the class under test is ours on our
side and stock's on the other, the tests the script leaves out are left out, and the driver
fails on a failure that is not a deliberate difference.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT

pytest.importorskip("expecttest", reason="torch's test helpers import expecttest (dev extra)")

SCRIPT = REPO_ROOT / "benchmarks" / "conformance" / "torch.py"

TEST_TORCH = '''
import torch
import torch_npu
from torch.testing._internal.common_utils import TestCase


class TestTorchDeviceType(TestCase):
    def test_grad_scaling_is_ours(self, device):
        from npu_lossscale.torch import GradScaler

        self.assertIsInstance(torch.GradScaler(device=device), GradScaler)

    def test_grad_scaling_update_scale(self, device):  # torch's kernel alone: not run
        self.fail("not run")

    def test_unrelated(self, device):
        self.fail("not a grad-scaling test")
'''

TEST_AMP = '''
import torch
import torch_npu
from torch_npu.npu.amp import GradScaler
from torch_npu.testing.common_utils import SupportedDevices
from torch_npu.testing.testcase import TestCase, run_tests


class TestAmp(TestCase):
    def test_grad_scaling_scale_on_the_device(self):
        scaler = GradScaler(init_scale=4.0)
        self.assertTrue(scaler.scale(torch.ones(1, device="npu")).item() == 4.0)
        self.assertRtolEqual(torch.ones(2).numpy(), torch.ones(2).numpy())
        from npu_lossscale.torch import GradScaler as Ours

        self.assertIsInstance(scaler, Ours)

    @SupportedDevices(["Ascend910A"])
    def test_grad_scaling_float_status(self):
        self.fail("needs the chip")

    def test_autocast_custom(self):
        self.fail("not a grad-scaling test")


if __name__ == "__main__":
    run_tests()
'''


def _snapshot(root: Path) -> Path:
    tests = root / "Ascend+pytorch" / "test"
    (tests / "npu").mkdir(parents=True)
    (tests / "test_torch.py").write_text(textwrap.dedent(TEST_TORCH))
    (tests / "npu" / "test_amp.py").write_text(textwrap.dedent(TEST_AMP))
    return root


def test_the_torch_suites_bind_our_class_on_our_side_only(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(_snapshot(tmp_path)), "-v"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"{suite}[{mode}]: ours 1/1, stock 0/1"
        for suite in ("torch", "torch-npu")
        for mode in ("inf_nan", "saturation", "per_optimizer")
    ]
    assert "--- stock fails torch test_grad_scaling_is_ours_cpu" in done.stderr
    assert "--- ours fails" not in done.stderr


def test_the_torch_script_says_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "--materialize" in done.stderr
