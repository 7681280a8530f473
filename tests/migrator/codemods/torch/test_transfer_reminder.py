"""The torch port's device reminder (`transfer_to_npu`) holds for as long as the script lacks it:
the run that ports says it, and so does every later run over the ported file (a `--check` in CI).

Real CLI on real files in a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

REMINDER = "from torch_npu.contrib import transfer_to_npu"
SCRIPTS = {
    "module import": (
        "import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
    ),
    "name import": (
        "import torch\nfrom torch.cuda.amp import GradScaler\n\n"
        "model = torch.nn.Linear(2, 2)\nscaler = GradScaler(init_scale=1024)\n"
    ),
}


def _reminders(report: Path) -> list[tuple[str, int]]:
    findings = json.loads(report.read_text())["findings"]
    return [
        (Path(f["path"]).name, f["line"])
        for f in findings
        if f["rule"] == "torch-device" and REMINDER in f["message"]
    ]


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_the_reminder_stays_on_later_checks(tmp_path: Path, kind: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPTS[kind])
    line = SCRIPTS[kind].splitlines().index(SCRIPTS[kind].splitlines()[-1]) + 1
    first = run_cli("--write", "--report", tmp_path / "first.json", script)
    assert first.returncode == 0, first.stderr
    assert "npu_lossscale.torch" in script.read_text()
    assert _reminders(tmp_path / "first.json") == [("train.py", line)]

    ported = script.read_bytes()
    # The ported file's scaler line (an import was added above it in the first layout).
    (line,) = [n for n, t in enumerate(ported.decode().splitlines(), 1) if "GradScaler(" in t]
    check = run_cli("--check", "--report", tmp_path / "check.json", script)
    assert check.returncode == 0, check.stderr  # nothing to change: the reminder is a warning
    assert f"train.py:{line}: torch-device:" in check.stderr and REMINDER in check.stderr
    assert _reminders(tmp_path / "check.json") == [("train.py", line)]
    assert script.read_bytes() == ported


def test_a_ported_script_with_transfer_to_npu_gets_no_reminder(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"
        "import npu_lossscale.torch\n\n"
        "scaler = npu_lossscale.torch.GradScaler.from_manager(None)\n"
    )
    check = run_cli("--check", "--report", tmp_path / "check.json", script)
    assert check.returncode == 0, check.stderr
    assert _reminders(tmp_path / "check.json") == []
    # The same file without transfer_to_npu is reminded, from_manager being a ported scaler too.
    script.write_text(script.read_text().replace(REMINDER + "\n", ""))
    check = run_cli("--check", "--report", tmp_path / "again.json", script)
    assert _reminders(tmp_path / "again.json") == [("train.py", 5)]
