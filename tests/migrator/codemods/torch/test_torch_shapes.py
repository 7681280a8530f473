"""Port shapes from new real code (issue 23, items 9-11), through the real CLI.

The fixtures in tests/migrator/fixtures/torch/shapes build their scaler the ways real code
supports torch older than 2.3: a helper with a version check whose new-torch branch passes
`device=` and `**kwargs` (accelerate's `get_grad_scaler`), a `try: from torch import GradScaler /
except ImportError: from torch.cuda.amp import GradScaler` fallback, and ignite's annotations-only
import under TYPE_CHECKING beside a guarded local import; others leave a scaler torch's
(fairscale's sharded and FSDP scalers, allennlp's trainer attribute that may hold one). Each is
ported with the real CLI; every runnable one and its unported original (stock torch) then train
side by side on the CPU through the same loop (loop.py: two optimizers, step 3 overflows the
generator only): scale, which optimizer stepped and every weight must agree at every step.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, cli_env, run_cli

FIXTURES = MIGRATOR_FIXTURES / "torch" / "shapes"
SCRIPTS = [
    "scaler_helper.py",
    "try_fallback.py",
    "type_checking.py",
    "trainer_attr.py",
    "torch_only_for_scaler.py",
]


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("versions")
    src, out = root / "src", root / "out"
    shutil.copytree(FIXTURES, src)
    proc = run_cli("--output-dir", out, "--copy-unchanged", "--report", root / "r.json", src)
    assert proc.returncode == 0, proc.stderr
    again = run_cli("--check", out)
    report = json.loads((root / "r.json").read_text(encoding="utf-8"))
    return {"src": src, "out": out, "report": report, "again": again}


def _findings(report: dict, name: str) -> list[dict]:
    return [f for f in report["findings"] if Path(f["path"]).name == name]


def _train(folder: Path, script: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-W", "ignore", script],
        cwd=folder,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_version_helper_ports_both_branches_and_warns_nothing_for_the_dead_one(
    ported: dict,
) -> None:
    text = (ported["out"] / "scaler_helper.py").read_text(encoding="utf-8")
    # the new-torch branch: device passed explicitly, so **kwargs cannot hold a second one
    assert "        from npu_lossscale.torch import GradScaler\n" in text
    assert "return GradScaler(device=device, **kwargs)" in text
    # the old-torch branch is ported too (it never runs on torch 2.4+, where the port does)
    assert "return npu_lossscale.torch.GradScaler(**kwargs)" in text
    found = {(f["rule"], f["kind"]) for f in _findings(ported["report"], "scaler_helper.py")}
    assert ("torch-grad-scaler", "warning") not in found  # the dict key in the dead branch
    assert ("torch-device", "warning") in found  # device kept as an expression: must be 'npu'


def test_a_scaler_chosen_between_torch_npus_and_cudas_is_left_and_both_are_named(
    ported: dict,
) -> None:
    name = "npu_or_cuda.py"
    assert (ported["out"] / name).read_bytes() == (FIXTURES / name).read_bytes()
    (warning,) = {f["message"] for f in _findings(ported["report"], name)}
    assert warning.startswith(
        "`GradScaler` is bound to more than one scaler here (`torch.cuda.amp.GradScaler`, "
        "`torch.npu.amp.GradScaler`), one of them torch-npu's (`torch.npu.amp.GradScaler`)"
    )
    lines = sorted(f["line"] for f in _findings(ported["report"], name))
    assert lines == [17]


def test_try_fallback_import_becomes_one_import(ported: dict) -> None:
    text = (ported["out"] / "try_fallback.py").read_text(encoding="utf-8")
    assert "\ntry:\n" not in text and "\nexcept ImportError" not in text
    assert "\nfrom npu_lossscale.torch import GradScaler\n" in text
    assert 'GradScaler("cpu", 2.0**12, growth_interval=3)' in text  # device first, as torch's
    rules = {
        (f["line"], f["rule"], f["kind"]) for f in _findings(ported["report"], "try_fallback.py")
    }
    assert (3, "torch-import", "change") in rules
    assert not [r for r in rules if r[1] == "torch-grad-scaler" and r[2] == "warning"]


def test_type_checking_fallback_stays_and_the_local_import_is_ported(ported: dict) -> None:
    source = (FIXTURES / "type_checking.py").read_text(encoding="utf-8")
    text = (ported["out"] / "type_checking.py").read_text(encoding="utf-8")
    head = source.split("from loop import train")[0]
    assert text.startswith(head)  # the TYPE_CHECKING block and the annotations stay
    assert "bool | GradScaler | None) -> GradScaler | None:" in text
    assert "            from npu_lossscale.torch import GradScaler\n" in text
    found = _findings(ported["report"], "type_checking.py")
    assert not [f for f in found if f["rule"] == "torch-grad-scaler" and f["kind"] == "warning"]


def test_second_run_changes_nothing(ported: dict) -> None:
    assert ported["again"].returncode == 0, ported["again"].stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_ported_script_trains_exactly_like_stock_torch(ported: dict, script: str) -> None:
    stock = _train(ported["src"], script)
    ours = _train(ported["out"], script)
    assert [row["scaler"] for row in stock] == ["torch.amp.grad_scaler.GradScaler"] * 8
    assert {row["scaler"] for row in ours} == {"npu_lossscale.torch.scaler.GradScaler"}
    # the overflow at step 3 skipped the generator's optimizer only and backed the scale off
    assert stock[3]["stepped"] == [3, 4] and stock[3]["scale"] == stock[2]["scale"] / 2
    for row in (*stock, *ours):
        del row["scaler"]
    assert ours == stock


@pytest.mark.parametrize("name", ["fsdp_accelerator.py", "sharded_only.py"])
def test_fairscale_scalers_are_left_byte_identical_and_warned(ported: dict, name: str) -> None:
    """Both of fairscale's scalers are left (no counterpart), each warned on its own even in a
    file with no other scaler; the return annotation of fairscale's stays torch.cuda.amp's."""
    assert (ported["out"] / name).read_bytes() == (FIXTURES / name).read_bytes()
    found = _findings(ported["report"], name)
    assert [(f["rule"], f["kind"]) for f in found] == [("torch-grad-scaler", "warning")]
    assert "fairscale's" in found[0]["message"] and "saturation" in found[0]["message"]


def test_annotation_of_an_attribute_that_may_hold_a_left_scaler_stays(ported: dict) -> None:
    text = (ported["out"] / "trainer_attr.py").read_text(encoding="utf-8")
    assert "self._scaler: Optional[amp.GradScaler] = None" in text
    assert "from torch.cuda import amp\n" in text
    assert 'npu_lossscale.torch.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)' in text


def test_apex_loss_scaling_is_left_with_what_it_misses(ported: dict) -> None:
    assert (ported["out"] / "apex_loop.py").read_bytes() == (FIXTURES / "apex_loop.py").read_bytes()
    found = _findings(ported["report"], "apex_loop.py")
    assert [(f["line"], f["rule"], f["kind"]) for f in found] == [
        (8, "torch-foreign-loss-scale", "warning")  # once per file, at the first apex amp call
    ]
    assert "inf/NaN only" in found[0]["message"] and "saturation" in found[0]["message"]


def test_apex_given_a_model_alone_scales_no_loss_and_is_not_warned(ported: dict) -> None:
    assert _findings(ported["report"], "apex_inference.py") == []
    found = _findings(ported["report"], "apex_eval_then_train.py")
    assert [(f["line"], f["rule"]) for f in found] == [(12, "torch-foreign-loss-scale")]


def test_import_torch_read_only_by_the_scaler_is_removed(ported: dict) -> None:
    text = (ported["out"] / "torch_only_for_scaler.py").read_text(encoding="utf-8")
    assert "import torch\n" not in text
    assert "\n\nimport npu_lossscale.torch\n" in text  # in its place, the blank line kept
    assert 'train(npu_lossscale.torch.GradScaler("cpu", init_scale=2.0**8' in text
    found = {
        (f["line"], f["rule"]) for f in _findings(ported["report"], "torch_only_for_scaler.py")
    }
    assert (5, "torch-import") in found


# Each a test that holds on every torch the port runs on (2.4 and later): a scaler class used as
# a value in its fallback branch needs nothing from the user.
NEW_TORCH_TESTS = [
    'version.parse(torch.__version__) >= version.parse("2.3")',
    "TORCH_VERSION >= (2, 4)",
    'is_torch_version(">=", "2.4.0")',
    '"2.3" <= torch.__version__',
    "_TORCH_GREATER_EQUAL_2_3",
    'hasattr(torch, "GradScaler")',
    'not is_torch_version("<", "2.3")',
]
# ...and tests whose fallback still runs on a torch the port supports, or that are not versions.
# `hasattr(torch, "npu")` tests for torch-npu, not for a version: its else runs on any torch.
# diffusers' `is_peft_version(">=", "0.6.0")` has is_torch_version's shape but reads another
# library's version: a peft too old takes the else on any torch, so its scaler use is reported.
OTHER_TESTS = [
    'is_torch_version(">=", "2.5")',
    "TORCH_VERSION > (2, 4)",
    "args.amp",
    'hasattr(torch, "npu")',
    'is_peft_version(">=", "0.6.0")',
]


def _warned_branches(tmp_path: Path, tests: list[str], old_scaler_first: bool) -> list[int]:
    """Check a file with one `if TEST: S = {scaler: n} / else: S = {other scaler: n}` per test
    (torch.cuda.amp's in the body if `old_scaler_first`, else in the else); the branch numbers
    (0: the first test's body, 1: its else, 2: the second test's body, ...) whose scaler use the
    report asks the user to port by hand."""
    new, old = "torch.amp.GradScaler", "torch.cuda.amp.GradScaler"
    first, second = (old, new) if old_scaler_first else (new, old)
    lines = ["import torch", "from packaging import version", ""]
    for number, test in enumerate(tests):
        lines += [
            f"if {test}:",
            f"    S{number} = {{{first}: {number}}}",
            "else:",
            f"    S{number} = {{{second}: {number}}}",
        ]
    (tmp_path / "t.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli("--check", "--report", tmp_path / "r.json", tmp_path)
    assert proc.returncode == 0, proc.stdout
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    warned = sorted(f["line"] for f in report["findings"] if f["rule"] == "torch-grad-scaler")
    return [(line - 5) // 2 for line in warned]  # body lines are 5, 9, ...; else lines 7, 11, ...


def test_only_fallbacks_for_torch_older_than_the_ports_go_unreported(tmp_path: Path) -> None:
    warned = _warned_branches(tmp_path, NEW_TORCH_TESTS + OTHER_TESTS, old_scaler_first=False)
    others = range(len(NEW_TORCH_TESTS), len(NEW_TORCH_TESTS + OTHER_TESTS))
    assert warned == [2 * i + 1 for i in others]  # the else branches of the other tests


# Tests false on every torch the port runs on (only torch older than 2.4 enters the body)...
OLD_TORCH_TESTS = [
    "TORCH_VERSION < (2, 4)",
    "(2, 4) > TORCH_VERSION",
    'is_torch_version("<", "2.3")',
]
# ...and tests that hold on torch 2.4 itself: their bodies are reported like any other use.
AT_THE_MINIMUM = ["TORCH_VERSION <= (2, 4)", "(2, 4) >= TORCH_VERSION"]


def test_a_body_only_torch_older_than_the_ports_enters_goes_unreported(tmp_path: Path) -> None:
    warned = _warned_branches(tmp_path, OLD_TORCH_TESTS + AT_THE_MINIMUM, old_scaler_first=True)
    at_minimum = range(len(OLD_TORCH_TESTS), len(OLD_TORCH_TESTS + AT_THE_MINIMUM))
    assert warned == [2 * i for i in at_minimum]  # the bodies of the tests true on torch 2.4


def test_annotation_follows_the_port_where_only_a_parameter_is_assigned_besides(
    tmp_path: Path,
) -> None:
    """RT-DETR's config: the attribute is set from a setter's parameter, whose own annotation
    the port rewrites, so the attribute's annotation follows the port too."""
    source = (
        "import torch\n"
        "from torch.cuda.amp.grad_scaler import GradScaler\n\n\n"
        "class Config:\n"
        "    def __init__(self):\n"
        "        self._scaler: GradScaler = None\n\n"
        "    def build(self) -> GradScaler:\n"
        "        if self._scaler is None and torch.cuda.is_available():\n"
        "            self._scaler = GradScaler()\n"
        "        return self._scaler\n\n"
        "    def set_scaler(self, obj: GradScaler):\n"
        "        self._scaler = obj\n"
    )
    (tmp_path / "config.py").write_text(source, encoding="utf-8")
    assert run_cli("--write", tmp_path / "config.py").returncode == 0
    text = (tmp_path / "config.py").read_text(encoding="utf-8")
    assert text == source.replace(
        "from torch.cuda.amp.grad_scaler import GradScaler",
        "from npu_lossscale.torch import GradScaler",
    )


@pytest.mark.parametrize(
    "spelling",
    [
        "from apex.contrib.optimizers import FP16_Optimizer",  # CLUE's MRC baseline
        "from apex.contrib.optimizers.fp16_optimizer import FP16_Optimizer",
        "from apex.optimizers import FP16_Optimizer",  # apex in 2019
    ],
)
def test_apexs_fused_fp16_optimizer_is_warned_from_each_of_its_modules(
    tmp_path: Path, spelling: str
) -> None:
    # Its overflow check reads the gradient norm kernel's inf/NaN flag: saturation mode misses it.
    (tmp_path / "opt.py").write_text(
        f"{spelling}\n\n\ndef wrap(optimizer):\n"
        "    return FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n",
        encoding="utf-8",
    )
    report = tmp_path / "r.json"
    assert run_cli("--check", "--report", report, tmp_path / "opt.py").returncode == 0
    found = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert [(f["line"], f["rule"], f["kind"]) for f in found] == [
        (5, "torch-foreign-loss-scale", "warning")
    ]
    assert "apex's FP16_Optimizer" in found[0]["message"] and "saturation" in found[0]["message"]
