"""The PyTorch port (torch's GradScaler -> npu_lossscale.torch.GradScaler) through the real CLI.

Fixtures in tests/migrator/fixtures/torch/cases are training scripts in the shapes real code uses
(a plain loop, `from torch.cuda.amp import GradScaler, autocast` with positional settings,
`torch.amp.GradScaler("cuda", ...)`, yolov5's `from torch.cuda import amp`, detectron2's trainer
with a `grad_scaler=None` parameter, aliases, torch-npu, look-alikes, unportable uses); their
ported forms in ../expected were checked by hand against the rules. Structural checks re-read
the output with `ast`, so a wrong port cannot pass by matching a wrong expected file. The DDP
fixture is ported and then trained on two CPU workers with the library's GradScaler.
"""

from __future__ import annotations

import ast
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, cli_env, run_cli

FIXTURES = MIGRATOR_FIXTURES / "torch"
EXPECTED = sorted(p.name for p in (FIXTURES / "expected").glob("*.py"))
UNCHANGED = ["not_torch.py", "on_torch_npu.py", "unportable.py", "uses_shared.py"]
TORCH_SCALERS = ("torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cpu.amp.GradScaler")


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Port every case once (one CLI run), then check the whole output tree again (must be a
    no-op: shared_scaler.py keeps its torch name only because uses_shared.py imports it)."""
    root = tmp_path_factory.mktemp("torch")
    src, out = root / "src", root / "out"
    shutil.copytree(FIXTURES / "cases", src)
    first = run_cli(
        "--output-dir", out, "--copy-unchanged", "--report", root / "report.json", "--no-color", src
    )
    assert first.returncode == 0, first.stderr
    again = run_cli("--check", "--report", root / "again.json", out)
    return {
        "src": src,
        "out": out,
        "stderr": first.stderr,
        "report": json.loads((root / "report.json").read_text(encoding="utf-8")),
        "again": again,
        "again_report": json.loads((root / "again.json").read_text(encoding="utf-8")),
    }


def _findings(report: dict, name: str, kind: str | None = None) -> list[dict]:
    return [
        f
        for f in report["findings"]
        if Path(f["path"]).name == name and (kind is None or f["kind"] == kind)
    ]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


@pytest.mark.parametrize("name", EXPECTED)
def test_ported_file_matches_expected(ported: dict, name: str) -> None:
    out = (ported["out"] / name).read_bytes()
    assert out == (FIXTURES / "expected" / name).read_bytes()
    assert out != (FIXTURES / "cases" / name).read_bytes()


@pytest.mark.parametrize("name", EXPECTED)
def test_ported_file_names_no_torch_scaler_and_imports_the_library(ported: dict, name: str) -> None:
    """Independent of the expected files: no torch scaler is reached any more, every scaler call
    goes to a name the file imports from npu_lossscale.torch, and the file still compiles."""
    source = (ported["out"] / name).read_text(encoding="utf-8")
    tree = ast.parse(source)
    compile(source, name, "exec")
    # The class an isinstance()/issubclass() test or a registry's key names may be
    # torch.amp.GradScaler, the base of the ported class and of torch's; nowhere else may a
    # torch scaler be reached.
    compared = [
        call.args[1]
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and _dotted(call.func) in ("isinstance", "issubclass")
    ]
    compared += [k for d in ast.walk(tree) if isinstance(d, ast.Dict) for k in d.keys if k]
    tested = {id(n) for c in compared for n in ast.walk(c) if _dotted(n) == "torch.amp.GradScaler"}
    dotted = {
        _dotted(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in tested
    }
    assert not dotted & set(TORCH_SCALERS)
    from_library = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "npu_lossscale.torch"
        for a in n.names
    }
    module_imported = any(
        isinstance(n, ast.Import) and any(a.name == "npu_lossscale.torch" for a in n.names)
        for n in ast.walk(tree)
    )
    calls = [
        _dotted(n.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and _dotted(n.func).endswith(("GradScaler", "Scaler"))
        and _dotted(n.func) != "ShardedGradScaler"  # fairscale's: no counterpart, left
    ]
    assert calls
    for func in calls:
        assert func in from_library or (
            func == "npu_lossscale.torch.GradScaler" and module_imported
        )
    torch_import = any(
        isinstance(n, ast.ImportFrom)
        and n.module in ("torch.cuda.amp", "torch.amp")
        and any(a.name == "GradScaler" for a in n.names)
        for n in ast.walk(tree)
    )
    # shared_scaler.py keeps torch's name for uses_shared.py, which imports it from there
    assert torch_import is (name == "shared_scaler.py")


def test_second_run_changes_nothing(ported: dict) -> None:
    assert ported["again"].returncode == 0, ported["again"].stdout
    assert ported["again"].stdout == ""
    assert not [f for f in ported["again_report"]["findings"] if f["kind"] == "change"]


@pytest.mark.parametrize("name", UNCHANGED)
def test_unportable_or_foreign_files_stay_byte_identical(ported: dict, name: str) -> None:
    assert (ported["out"] / name).read_bytes() == (FIXTURES / "cases" / name).read_bytes()
    assert not _findings(ported["report"], name, "change")


def test_scaler_tests_and_shared_names_hold_after_the_port(ported: dict) -> None:
    """Run the ported modules: the isinstance test holds for the ported scaler and for stock
    torch's (one a library built); the helper's scaler name stays torch's, so the module that
    imports it and calls it with torch's positional order still starts; the calls beside it
    build the ported class; the TYPE_CHECKING import did not take the new import with it."""
    check = (
        "import json, torch\n"
        "import scaler_checks, shared_scaler, uses_shared\n"
        "from npu_lossscale.torch import GradScaler\n"
        "own = scaler_checks.own_scaler()\n"
        "print(json.dumps([\n"
        "    type(own) is GradScaler, own.get_scale(),\n"
        "    scaler_checks.uses_scaling(own),\n"
        "    scaler_checks.uses_scaling(torch.amp.GradScaler('cpu')),\n"
        "    scaler_checks.uses_scaling(object()),\n"
        "    type(uses_shared.SCALER) is torch.cuda.amp.GradScaler,\n"
        "    type(uses_shared.DEFAULT) is GradScaler,\n"
        "]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", check],
        cwd=ported["out"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [True, 1024.0, True, True, False, True, True]
    found = {(f["line"], f["rule"]) for f in _findings(ported["report"], "shared_scaler.py")}
    assert (2, "torch-grad-scaler") in found  # the name kept, and why


def test_positional_settings_are_passed_by_name(ported: dict) -> None:
    tree = ast.parse((ported["out"] / "from_import_positional.py").read_text(encoding="utf-8"))
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and _dotted(n.func) == "GradScaler"
    ]
    assert not call.args
    given = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert given == {
        "init_scale": "2.0 ** 14",
        "growth_factor": "2.0",
        "backoff_factor": "0.5",
        "growth_interval": "1000",
        "enabled": "cfg.fp16",
    }


def test_cuda_device_is_dropped_and_later_positionals_named(ported: dict) -> None:
    tree = ast.parse((ported["out"] / "amp_device.py").read_text(encoding="utf-8"))
    calls = {
        ast.unparse(n.targets[0]): n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
    }
    keywords = {name: {k.arg for k in call.keywords} for name, call in calls.items()}
    assert all(not c.args for c in calls.values())
    assert keywords["main"] == {"init_scale", "growth_interval"}
    assert keywords["keyword"] == {"enabled"}
    assert keywords["moved"] == {"init_scale", "growth_factor"}
    assert keywords["default"] == set()
    assert keywords["chosen"] == {"device", "enabled"}  # an expression is kept, with a warning
    warnings = _findings(ported["report"], "amp_device.py", "warning")
    assert any(f["rule"] == "torch-device" and f["line"] == 11 for f in warnings)
    drops = [
        f
        for f in _findings(ported["report"], "amp_device.py", "change")
        if "dropped" in f["message"]
    ]
    assert [f["line"] for f in drops] == [6, 7, 8, 17]


def test_report_has_each_change_with_its_line(ported: dict) -> None:
    changes = {
        (f["line"], f["rule"]) for f in _findings(ported["report"], "trainer_class.py", "change")
    }
    assert changes == {
        (5, "torch-import"),  # `GradScaler` moves from torch.cuda.amp to npu_lossscale.torch
        (26, "torch-grad-scaler"),  # the Optional[...] annotation
        (30, "torch-grad-scaler"),  # GradScaler() in __init__
        (47, "torch-grad-scaler"),  # isinstance()
    }
    yolo = {(f["line"], f["rule"]) for f in _findings(ported["report"], "yolo_style.py", "change")}
    # line 3: `import torch`, read only by the scaler the port rewrote, goes too
    assert yolo == {(3, "torch-import"), (6, "torch-import"), (12, "torch-grad-scaler")}


def test_transfer_to_npu_note_once_per_ported_file(ported: dict) -> None:
    notes = [f for f in ported["report"]["findings"] if "transfer_to_npu" in f["message"]]
    assert sorted(Path(f["path"]).name for f in notes) == EXPECTED
    assert all(f["kind"] == "warning" and f["rule"] == "torch-device" for f in notes)


def test_torch_npu_file_is_left_with_a_note(ported: dict) -> None:
    (note,) = _findings(ported["report"], "on_torch_npu.py")
    assert (note["line"], note["rule"], note["kind"]) == (7, "torch-npu", "warning")
    assert "torch_npu.npu.amp.GradScaler" in note["message"]


def test_a_torch_npu_file_says_nothing_of_the_devices_of_scalers_it_leaves(
    tmp_path: Path,
) -> None:
    """ultralytics' trainer: torch-npu's scaler on an NPU, torch.amp's with a computed device
    elsewhere; the file is left as it is, so the device of a scaler not ported is not warned."""
    source = (
        "import torch\n\n\n"
        "def build(device):\n"
        "    if device.type == 'npu':\n"
        "        import torch_npu\n\n"
        "        return torch_npu.npu.amp.GradScaler(enabled=True)\n"
        "    return torch.amp.GradScaler(device.type, enabled=True)\n"
    )
    (tmp_path / "t.py").write_text(source, encoding="utf-8")
    proc = run_cli("--check", "--report", tmp_path / "r.json", tmp_path)
    assert proc.returncode == 0, proc.stdout
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    found = [(f["line"], f["rule"], f["kind"]) for f in _findings(report, "t.py")]
    assert found == [(8, "torch-npu", "warning"), (9, "torch-grad-scaler", "warning")]


def test_look_alikes_are_not_touched_or_reported(ported: dict) -> None:
    assert _findings(ported["report"], "not_torch.py") == []


def test_unportable_uses_are_reported_where_they_are(ported: dict) -> None:
    found = {(f["line"], f["rule"]) for f in _findings(ported["report"], "unportable.py")}
    assert found == {
        (8, "torch-grad-scaler"),  # subclassed
        (14, "torch-grad-scaler"),  # GradScaler and ShardedGradScaler stored as values
        (19, "torch-grad-scaler"),  # torch.amp.GradScaler(**kwargs): may hold the device
        (20, "torch-grad-scaler"),  # functools.partial(torch.cuda.amp.GradScaler, ...)
    }
    messages = " ".join(f["message"] for f in _findings(ported["report"], "unportable.py"))
    for reason in ("subclasses", "as a value", "**-arguments", "no npu_lossscale counterpart"):
        assert reason in messages


def test_library_shapes_guarded_import_registry_key_and_sharded_scaler(ported: dict) -> None:
    """The import put inside `try: ... except ImportError` is warned (a missing npu_lossscale
    would be swallowed); a registry keyed by torch.amp.GradScaler is left quietly (the ported
    class is a subclass); fairscale's sharded scaler has no counterpart and says so."""
    found = {
        (f["line"], f["rule"], f["kind"])
        for f in _findings(ported["report"], "guarded_and_keyed.py")
    }
    assert (6, "torch-import", "warning") in found
    assert (17, "torch-grad-scaler", "warning") in found
    assert not [f for f in found if f[0] == 12]  # STATE_SAVERS = {torch.amp.GradScaler: ...}


def test_value_use_keeps_torch_name_and_ports_the_rest(tmp_path: Path) -> None:
    """A name that must stay torch's (used as a value) is kept; the call next to it gets the
    ported class under another name, so neither use changes meaning behind the user's back."""
    (tmp_path / "t.py").write_text(
        "from torch.cuda.amp import GradScaler\n\n"
        "FACTORY = GradScaler\n"
        "scaler = GradScaler(enabled=True)\n",
        encoding="utf-8",
    )
    proc = run_cli("--write", tmp_path / "t.py")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t.py").read_text(encoding="utf-8") == (
        "from torch.cuda.amp import GradScaler\n"
        "from npu_lossscale.torch import GradScaler as NPUGradScaler\n\n"
        "FACTORY = GradScaler\n"
        "scaler = NPUGradScaler(enabled=True)\n"
    )
    assert "t.py:3: torch-grad-scaler:" in proc.stderr


EDGES = {
    # name: (source, (line, rule) of its one finding); none of them may change
    "npu_device.py": (
        'import torch\ns = torch.amp.GradScaler("npu", init_scale=1024)\n',
        (2, "torch-npu"),
    ),
    "try_import.py": (  # a cpu scaler or torch.amp's: no fallback for old torch
        "try:\n    from torch.amp import GradScaler\nexcept ImportError:\n"
        "    from torch.cpu.amp import GradScaler\ns = GradScaler()\n",
        (5, "torch-grad-scaler"),
    ),
    "star.py": ("from torch.cuda.amp import *\ns = GradScaler()\n", (2, "torch-grad-scaler")),
    "taken.py": (
        "import torch\nnpu_lossscale = None\ns = torch.cuda.amp.GradScaler()\n",
        (3, "name-conflict"),
    ),
    "reexport.py": (
        "from torch.cuda.amp import GradScaler, autocast\nwith autocast():\n    pass\n",
        (1, "torch-grad-scaler"),
    ),
}


def test_edge_shapes_are_reported_and_left_unchanged(tmp_path: Path) -> None:
    for name, (source, _) in EDGES.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    proc = run_cli("--check", "--report", tmp_path / "r.json", tmp_path)
    assert proc.returncode == 0, proc.stdout  # nothing would change
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    for name, (_, expected) in EDGES.items():
        found = [(f["line"], f["rule"], f["kind"]) for f in _findings(report, name)]
        assert found == [(*expected, "warning")], name


def test_existing_library_import_is_reused(tmp_path: Path) -> None:
    source = (
        "import torch\nimport npu_lossscale.torch\n\n"
        "a = torch.cuda.amp.GradScaler()\nb = npu_lossscale.torch.GradScaler()\n"
    )
    (tmp_path / "t.py").write_text(source, encoding="utf-8")
    assert run_cli("--write", tmp_path / "t.py").returncode == 0
    assert (tmp_path / "t.py").read_text(encoding="utf-8") == source.replace(
        "torch.cuda.amp.GradScaler()", "npu_lossscale.torch.GradScaler()"
    )


def test_crlf_and_encoding_survive(tmp_path: Path) -> None:
    source = (
        "# -*- coding: gbk -*-\r\n# 混合精度\r\nimport torch\r\n\r\n"
        "scaler = torch.cuda.amp.GradScaler(enabled=True)  # 缩放\r\n"
    ).encode("gbk")
    (tmp_path / "g.py").write_bytes(source)
    proc = run_cli("--write", tmp_path / "g.py")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "g.py").read_bytes() == (
        "# -*- coding: gbk -*-\r\n# 混合精度\r\nimport npu_lossscale.torch\r\n\r\n"
        "scaler = npu_lossscale.torch.GradScaler(enabled=True)  # 缩放\r\n"
    ).encode("gbk")


def test_run_on_torch_scripts_never_imports_torch(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "cases", tmp_path / "cases")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "migrator", "cases"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "migrator.codemods.torch.analysis" in modules
    assert not any(m.split(".")[0] in {"torch", "torch_npu", "tensorflow"} for m in modules)


@pytest.mark.parametrize(
    "source",
    [
        b"from torch.cuda.amp import GradScaler\ns = GradScaler()\n",
        b"import torch\ns = torch.amp.GradScaler('cuda')\n",
        b"from torch.cuda import amp\ns = amp.GradScaler()\n",
        b"import torch.cuda.amp as A\ns = A.GradScaler()\n",
        b"from torch.cuda.amp import GradScaler as S\ns = S()\n",
    ],
)
def test_triage_lets_scaler_files_through(source: bytes) -> None:
    from migrator.selection.prefilter import might_need_migration
    from migrator.selection.triage import verdict

    assert might_need_migration(source)
    assert verdict(source) == "full"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ported_ddp_script_trains_on_cpu_with_the_library_scaler(tmp_path: Path) -> None:
    """Port the DDP fixture, then train it on two gloo workers on the CPU with an infinite loss
    on rank 0 at step 5: the ported scaler skips that step on both ranks (weights untouched,
    scale halved), the ranks end with identical weights, and the loss still falls."""
    script = tmp_path / "train_ddp.py"
    shutil.copy(FIXTURES / "ddp" / "train_ddp.py", script)
    proc = run_cli("--write", script)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text(encoding="utf-8")
    assert "scaler = npu_lossscale.torch.GradScaler(enabled=args.amp)" in text
    assert "torch.cuda.amp" not in text
    summary = tmp_path / "summary.json"
    args = ["--world-size", "2", "--device", "cpu", "--inf-at", "5", "--steps", "16"]
    run = subprocess.run(
        [sys.executable, str(script), *args, "--port", str(_free_port()), "--summary", summary],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(summary.read_text(encoding="utf-8"))
    assert result["scaler"].startswith("npu_lossscale.torch.")
    scales, norms, losses = result["scales"], result["norms"], result["losses"]
    assert scales[:5] == [2.0**16] * 5 and scales[5] == 2.0**15
    assert norms[5] == norms[4]  # the overflowed step changed no weight
    assert norms[6] != norms[5]  # the next clean step did
    assert result["finite"] and result["ranks_agree"]
    assert max(losses[-3:]) < losses[0] / 4


BELOW_ONE = """\
import json
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2 ** -4, growth_interval=3)
rows = []
for step in range(12):
    x = torch.full((8, 4), 1e38 if step in (2, 3, 4) else 0.5)
    loss = model(x).sum()  # sum-reduced: overflows at any scale on the poisoned steps
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() < 1e-3:
        sys.exit("minimum loss scale reached")
    rows.append([scaler.get_scale(), model.weight.detach().tolist()])
print(json.dumps(rows))
"""


def test_a_script_relying_on_a_scale_below_one_keeps_torchs_rule(tmp_path: Path) -> None:
    """torch's scale has no floor; ours floors at 1 by default. A script that starts below 1
    (and stops when the scale falls under 1e-3, as fairseq does) gets min_loss_scale=0, torch's
    rule, and a warning on each reason; it then trains exactly as under stock torch."""
    (tmp_path / "t.py").write_text(BELOW_ONE, encoding="utf-8")
    env = cli_env()

    def train() -> list:
        done = subprocess.run(
            [sys.executable, "t.py"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    stock = train()
    report = tmp_path / "report.json"
    assert run_cli("--write", "--report", report, tmp_path / "t.py").returncode == 0
    ported = (tmp_path / "t.py").read_text(encoding="utf-8")
    assert 'GradScaler("cpu", init_scale=2 ** -4, growth_interval=3, min_loss_scale=0)' in ported
    warned = [
        (f["line"], f["message"])
        for f in json.loads(report.read_text(encoding="utf-8"))["findings"]
        if f["rule"] == "torch-scale-below-one" and f["kind"] == "warning"
    ]
    assert [line for line, _ in warned] == [9, 18]
    assert "2 ** -4" in warned[0][1] and "1e-3" in warned[1][1]
    ours = train()
    assert [row[0] for row in ours] == [row[0] for row in stock]
    assert min(row[0] for row in stock) < 1  # the scale really went below 1
    assert ours == stock


def test_device_added_to_a_one_argument_per_line_call_gets_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    # torch.cpu.amp's scaler implies its device, which the port passes as `device="cpu"`. A call
    # laid out one argument per line without a trailing comma once got `, device="cpu"` at
    # column 0 after the last argument's line, which kept a trailing space.
    source = (
        "import torch\n\n"
        "scaler = torch.cpu.amp.GradScaler(\n"
        "    init_scale=1024.0,\n"
        "    growth_interval=100\n"
        ")\n"
    )
    (tmp_path / "t.py").write_text(source, encoding="utf-8")
    assert run_cli("--write", tmp_path / "t.py").returncode == 0
    ported = (tmp_path / "t.py").read_text(encoding="utf-8")
    assert ported.endswith(
        "scaler = npu_lossscale.torch.GradScaler(\n"
        "    init_scale=1024.0,\n"
        "    growth_interval=100,\n"
        '    device="cpu"\n'
        ")\n"
    )
    assert all(line == line.rstrip() for line in ported.splitlines())
