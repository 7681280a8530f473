"""A scaler attribute annotated in one file and given another scaler in another file of the run
(allenai/tango: the torch engine annotates `self.grad_scaler` with torch's class, the fairscale
subclass stores `ShardedGradScaler()` there). Ported by the real CLI (fixtures/torch_project):
the annotation stays torch's, which describes both scalers; the call is ported and runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree, run_cli
from script_runs import run_json

from migrator.selection.scaler_attrs import other_scaler_attrs

FIXTURES = MIGRATOR_FIXTURES / "torch_project"
TORCH_ANNOTATION = "self.grad_scaler: Optional[torch.cuda.amp.GradScaler] = ("
OUR_CALL = "None if not amp else npu_lossscale.torch.GradScaler(init_scale=512.0, enabled=False)"


def test_an_attribute_a_subclass_elsewhere_gives_another_scaler_keeps_its_annotation(
    tmp_path: Path,
) -> None:
    ported = port_fixture_tree(tmp_path, FIXTURES)
    text = (ported["out"] / "engine.py").read_text(encoding="utf-8")
    assert TORCH_ANNOTATION in text and OUR_CALL in text
    assert "import torch\n" in text  # the annotation still reads torch
    assert ported["again"].returncode == 0, ported["again"].stdout
    built = run_json(sys.executable, ported["out"], "engine.py")
    assert built["class"] == "npu_lossscale.torch.scaler.GradScaler"


def test_ported_alone_the_engine_cannot_see_the_subclass(tmp_path: Path) -> None:
    """Only the files of the run are read: alone, the annotation follows the port."""
    done = run_cli("--output-dir", tmp_path / "out", FIXTURES / "engine.py")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "engine.py").read_text(encoding="utf-8")
    assert "self.grad_scaler: Optional[npu_lossscale.torch.GradScaler] = (" in text


@pytest.mark.parametrize(
    ("line", "attrs"),
    [
        ("        self.grad_scaler = ShardedGradScaler()\n", {"grad_scaler"}),
        ("        self._scaler: Any = wrapper.init_grad_scaler()\n", {"_scaler"}),
        ("        self.scaler = torch.cuda.amp.GradScaler()\n", set()),  # ported: not other
        ("        self.scaler = amp.GradScaler()\n", set()),
        ("        self.scaler = GradScaler(enabled=amp)\n", set()),
        ("        self.model = build_model()\n", set()),  # not a scaler
    ],
)
def test_the_scan_finds_the_scalers_the_port_does_not_build(line: str, attrs: set) -> None:
    assert other_scaler_attrs(line.encode()) == attrs
