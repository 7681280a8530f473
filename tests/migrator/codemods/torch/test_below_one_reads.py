"""Scripts that rely on the scale going below 1 read it in icefall's ways: `scaler._scale.item()`
into a variable, compared with a number below 1, or regrown by hand (`scaler.update(cur * 2.0)`);
and their scaler may come from a helper another file of the run defines (icefall's
create_grad_scaler in icefall/utils.py). Ported with the real CLI, then trained against stock
torch with an overflow injected at scale 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree, run_cli
from script_runs import json_lines

from migrator.selection.scaler_helpers import ScalerHelper, scaler_helpers

PROJECT = MIGRATOR_FIXTURES / "below_one_helper" / "project"
BELOW_ONE = "torch-scale-below-one"


def _warnings(findings: list, name: str) -> list[dict]:
    return [
        f
        for f in findings
        if f["rule"] == BELOW_ONE and f["kind"] == "warning" and Path(f["path"]).name == name
    ]


def _guard_line(text: str, guard: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if guard in line)


def test_a_guard_on_a_helper_built_scaler_is_warned_where_it_is(tmp_path: Path) -> None:
    ported = port_fixture_tree(tmp_path, PROJECT)
    source = (PROJECT / "train.py").read_text(encoding="utf-8")
    warned = _warnings(ported["findings"], "train.py")
    assert [f["line"] for f in warned] == [_guard_line(source, "if cur_grad_scale < 0.5:")]
    message = warned[0]["message"]
    assert "create_grad_scaler()" in message and "scalers.py" in message
    assert "min_loss_scale=0" in message
    assert not _warnings(ported["findings"], "scalers.py")  # no guard there
    assert (ported["out"] / "train.py").read_text(encoding="utf-8") == source  # nothing to port
    assert "npu_lossscale.torch.GradScaler(device=device, **kwargs)" in (
        ported["out"] / "scalers.py"
    ).read_text(encoding="utf-8")

    stock = json_lines(sys.executable, PROJECT, "train.py")
    assert min(row["scale"] for row in stock if "scale" in row) < 1  # torch's went below 1
    # as ported, the floor of 1 keeps the guard from firing: what the warning is for
    floored = json_lines(sys.executable, ported["out"], "train.py")
    assert min(row["scale"] for row in floored if "scale" in row) == 1.0
    assert floored[-1] == {"small": []}
    # following the warning: min_loss_scale=0 through the helper's **kwargs gives torch's run
    train = ported["out"] / "train.py"
    call = "create_grad_scaler(init_scale=1.0, growth_interval=1000)"
    lowered = call.replace(")", ", min_loss_scale=0)")
    train.write_text(train.read_text(encoding="utf-8").replace(call, lowered), encoding="utf-8")
    assert json_lines(sys.executable, ported["out"], "train.py") == stock


def test_ported_alone_the_guard_file_has_nothing_to_warn(tmp_path: Path) -> None:
    """Only the files of the run are read: without scalers.py nothing says who builds it."""
    report = tmp_path / "report.json"
    done = run_cli("--output-dir", tmp_path / "out", "--report", report, PROJECT / "train.py")
    assert done.returncode == 0, done.stderr
    assert not _warnings(json.loads(report.read_text(encoding="utf-8"))["findings"], "train.py")


SAME_FILE = """\
import json
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1000)
for batch_idx in range(1, 9):
    x = torch.full((64, 4), 0.5)
    if batch_idx in (2, 3, 4):
        x.fill_(1e38)  # sum-reduced: overflows at scale 1 and below
    opt.zero_grad(set_to_none=True)
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
    scaler.update()
    {read}
    {guard}
    print(json.dumps({{"scale": scaler.get_scale(), "weight": model.weight.tolist()}}))
"""

READS = [
    ("cur = scaler._scale.item()", "if cur < 1e-5: sys.exit('too small')"),
    ("cur = float(scaler._scale)", "assert not cur < 1e-5"),
    ("cur = scaler._scale.item() if True else 1.0", "assert not 0.001 > cur"),
    ("cur = scaler.get_scale()", "assert not cur < 1e-5"),
    ("pass", "assert not scaler._scale < 1e-5"),
    # icefall's hand regrowth: it only makes sense where the scale falls below 1
    ("cur = scaler._scale.item()", "scaler.update(cur * 2.0) if batch_idx % 4 == 0 else None"),
]


@pytest.mark.parametrize(("read", "guard"), READS)
def test_a_scale_read_then_compared_below_one_keeps_torchs_rule(
    tmp_path: Path, read: str, guard: str
) -> None:
    (tmp_path / "t.py").write_text(SAME_FILE.format(read=read, guard=guard), encoding="utf-8")
    stock = json_lines(sys.executable, tmp_path, "t.py")
    assert min(row["scale"] for row in stock) < 1
    report = tmp_path / "report.json"
    assert run_cli("--write", "--report", report, tmp_path / "t.py").returncode == 0
    ported = (tmp_path / "t.py").read_text(encoding="utf-8")
    assert "GradScaler(\"cpu\", init_scale=1.0, growth_interval=1000, min_loss_scale=0)" in ported
    warned = _warnings(json.loads(report.read_text(encoding="utf-8"))["findings"], "t.py")
    assert [f["line"] for f in warned] == [19]
    assert json_lines(sys.executable, tmp_path, "t.py") == stock


@pytest.mark.parametrize(
    ("read", "guard"),
    [
        ("cur = scaler._scale.item()", "assert not cur <= 0"),  # never true at a floor of 1
        ("cur = self_scale = 0.5", "assert not cur < 0.01"),  # not a read of the scale
        ("pass", "scaler.update(2.0 ** 10) if batch_idx == 9 else None"),  # a fixed new scale
    ],
)
def test_other_reads_leave_the_floor(tmp_path: Path, read: str, guard: str) -> None:
    (tmp_path / "t.py").write_text(SAME_FILE.format(read=read, guard=guard), encoding="utf-8")
    report = tmp_path / "report.json"
    assert run_cli("--write", "--report", report, tmp_path / "t.py").returncode == 0
    assert "min_loss_scale" not in (tmp_path / "t.py").read_text(encoding="utf-8")
    assert not _warnings(json.loads(report.read_text(encoding="utf-8"))["findings"], "t.py")


def test_the_scan_finds_module_level_functions_that_build_a_scaler() -> None:
    data = (PROJECT / "scalers.py").read_bytes()
    assert scaler_helpers("p/scalers.py", data) == {
        ScalerHelper("scalers", "create_grad_scaler", "p/scalers.py")
    }
    lowered = data.replace(b"**kwargs)\n", b"min_loss_scale=0, **kwargs)\n")
    assert scaler_helpers("p/scalers.py", lowered) == set()  # its floor is set already
    assert scaler_helpers("t.py", b"scaler = torch.amp.GradScaler()\n") == set()
