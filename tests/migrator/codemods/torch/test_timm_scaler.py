"""Scripts that take their loss scaler from timm (DeiT's `from timm.utils import NativeScaler`):
the scaler is torch's own GradScaler built inside timm, which the port does not reach, so the
file is left byte-identical and warned once, saying the loop keeps torch's scaler; timm's
ApexScaler gets apex's warning; other timm names in a ported file are not warned. Real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

RULE = "torch-foreign-loss-scale"
SOURCES = {
    "deit_main.py": (
        "import torch\n"
        "from timm.utils import NativeScaler, get_state_dict\n\n\n"
        "def main(model, optimizer, loader, criterion):\n"
        "    loss_scaler = NativeScaler()\n"
        "    for samples, targets in loader:\n"
        "        with torch.cuda.amp.autocast():\n"
        "            loss = criterion(model(samples), targets)\n"
        "        optimizer.zero_grad()\n"
        "        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters())\n"
        "    return get_state_dict(model), loss_scaler.state_dict()\n"
    ),
    "cuda_module.py": ("from timm.utils.cuda import NativeScaler as Scaler\n\nSCALER = Scaler()\n"),
    "apex_scaler.py": "from timm.utils import ApexScaler\n\nSCALER = ApexScaler()\n",
    "own_scaler.py": (
        "import torch\n"
        "from timm.utils import ModelEma\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "ema = ModelEma\n"
    ),
}


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("timm_scaler")
    src, out = root / "src", root / "out"
    src.mkdir()
    for name, text in SOURCES.items():
        (src / name).write_text(text, encoding="utf-8")
    proc = run_cli("--output-dir", out, "--copy-unchanged", "--report", root / "r.json", src)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((root / "r.json").read_text(encoding="utf-8"))["findings"]
    return {"out": out, "findings": findings}


def _warned(ported: dict, name: str) -> list[dict]:
    return [f for f in ported["findings"] if Path(f["path"]).name == name and f["rule"] == RULE]


@pytest.mark.parametrize(
    ("name", "line", "code"),
    [("deit_main.py", 6, "NativeScaler"), ("cuda_module.py", 3, "Scaler")],
)
def test_timm_native_scaler_is_left_and_warned_once(ported, name, line, code) -> None:
    assert (ported["out"] / name).read_text(encoding="utf-8") == SOURCES[name]
    (found,) = _warned(ported, name)
    assert (found["line"], found["kind"]) == (line, "warning")
    message = found["message"]
    assert message.startswith(f"`{code}` (timm's NativeScaler) is left as it is")
    assert "torch's own GradScaler inside timm" in message
    assert "npu_lossscale.torch.GradScaler" in message and "INF/NAN" not in message


def test_timm_apex_scaler_gets_apex_warning(ported) -> None:
    (found,) = _warned(ported, "apex_scaler.py")
    assert "timm's ApexScaler, apex's amp inside timm" in found["message"]
    assert "inf/NaN only" in found["message"]


def test_other_timm_names_beside_a_ported_scaler_are_not_warned(ported) -> None:
    assert _warned(ported, "own_scaler.py") == []
    text = (ported["out"] / "own_scaler.py").read_text(encoding="utf-8")
    assert "scaler = npu_lossscale.torch.GradScaler()" in text
    assert "from timm.utils import ModelEma" in text
