"""The PyTorch port's edges the mutation run (benchmarks/mutation.py, issue 30) found unpinned.

Each script is ported in-process (the CLI's own per-file function); the ported text is checked
and, where it builds scalers, run: the ported scalers must construct and hold the scale the
script asked for (device "auto" is the CPU here).
"""

from __future__ import annotations

import ast

import pytest

import npu_lossscale.torch
from migrator.pipeline.transform import migrate_source


def _port(source: str) -> tuple[str, list]:
    result = migrate_source(source.encode(), path="train.py")
    return result.new_source.decode(), result.findings


def _messages(findings: list, kind: str, rule: str) -> list[str]:
    return [f.message for f in findings if f.kind == kind and f.rule == rule]


def _run(ported: str) -> dict:
    namespace: dict = {}
    exec(compile(ported, "train.py", "exec"), namespace)
    return namespace


ISINSTANCE = (
    "from torch.cuda.amp import GradScaler\n\n"
    "scaler = GradScaler()\n\n\n"
    "def is_scaler(obj):\n"
    "    return isinstance(obj, GradScaler)\n"
)


def test_isinstance_is_not_rewritten_to_torch_where_torch_is_not_imported() -> None:
    ported, findings = _port(ISINSTANCE)
    assert "    return isinstance(obj, GradScaler)\n" in ported
    assert "torch.amp" not in ported
    assert any("isinstance()" in m for m in _messages(findings, "warning", "torch-grad-scaler"))
    _run(ported)["is_scaler"](None)  # no NameError: the test still runs


def test_isinstance_becomes_the_common_base_where_torch_is_imported() -> None:
    ported, _ = _port("import torch\n" + ISINSTANCE)
    assert "    return isinstance(obj, torch.amp.GradScaler)\n" in ported
    namespace = _run(ported)
    assert namespace["is_scaler"](namespace["scaler"])


@pytest.mark.parametrize("init", ["0.5", "0.75", "0.999", "2 ** -1"])
def test_an_init_scale_below_one_keeps_torchs_rule_and_says_so(init: str) -> None:
    ported, findings = _port(
        f"import torch\n\nscaler = torch.cuda.amp.GradScaler(init_scale={init})\n"
    )
    assert f"GradScaler(init_scale={init}, min_loss_scale=0)" in ported
    assert len(_messages(findings, "warning", "torch-scale-below-one")) == 1
    expected = eval(init)  # noqa: S307
    assert _run(ported)["scaler"].get_scale() == pytest.approx(expected, rel=1e-6)


def test_an_init_scale_of_one_needs_no_floor_change() -> None:
    ported, findings = _port("import torch\n\nscaler = torch.cuda.amp.GradScaler(init_scale=1.0)\n")
    assert "GradScaler(init_scale=1.0)\n" in ported
    assert not _messages(findings, "warning", "torch-scale-below-one")


TWO_SCALERS = 'scaler = torch.amp.GradScaler("cuda")\nother = torch.cuda.amp.GradScaler()\n'


def test_the_device_note_comes_once_and_not_where_transfer_to_npu_is_imported() -> None:
    _, findings = _port("import torch\n\n" + TWO_SCALERS)
    assert len(_messages(findings, "warning", "torch-device")) == 1
    _, findings = _port(
        "import torch\nfrom torch_npu.contrib import transfer_to_npu\n\n" + TWO_SCALERS
    )
    assert not _messages(findings, "warning", "torch-device")


def test_dropping_the_last_argument_leaves_no_dangling_comma() -> None:
    ported, _ = _port(
        'import torch\n\nscaler = torch.amp.GradScaler(init_scale=1024.0, device="cuda")\n'
    )
    assert "scaler = npu_lossscale.torch.GradScaler(init_scale=1024.0)\n" in ported
    assert _run(ported)["scaler"].get_scale() == 1024.0


def test_dropping_the_last_imported_name_leaves_a_valid_import() -> None:
    ported, _ = _port(
        "import torch\nfrom torch.cuda.amp import autocast, GradScaler\n\n"
        "scaler = GradScaler()\nwith autocast(enabled=False):\n    pass\n"
    )
    ast.parse(ported)
    assert "from torch.cuda.amp import autocast\n" in ported
    assert "from npu_lossscale.torch import GradScaler\n" in ported


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nfrom torch_npu.npu.amp.sharded_grad_scaler import ShardedGradScaler\n\n"
        "scaler = ShardedGradScaler()\nother = torch.cuda.amp.GradScaler()\n",
        'import torch\n\nscaler = torch.amp.GradScaler("npu:0")\n',
        'import torch\n\nscaler = torch.amp.GradScaler(device="npu:1")\n',
    ],
    ids=["torch-npu-sharded", "npu:0", "device=npu:1"],
)
def test_a_script_already_on_the_npu_is_left_byte_identical_with_a_note(source: str) -> None:
    ported, findings = _port(source)
    assert ported == source
    assert len(_messages(findings, "warning", "torch-npu")) == 1


def test_a_reference_inside_a_scope_that_rebinds_the_name_gets_the_dotted_name() -> None:
    """The rewritten `from ... import GradScaler` does not reach build(), whose parameter is
    also called GradScaler: there the scaler is spelled out in full."""
    ported, _ = _port(
        "import torch\nfrom torch.cuda.amp import GradScaler\n\nscaler = GradScaler()\n\n\n"
        "def build(GradScaler=None):\n    return torch.cuda.amp.GradScaler(init_scale=8.0)\n\n\n"
        "other = torch.cuda.amp.GradScaler(init_scale=4.0)\n"
    )
    assert "    return npu_lossscale.torch.GradScaler(init_scale=8.0)\n" in ported
    assert "other = GradScaler(init_scale=4.0)\n" in ported
    namespace = _run(ported)
    assert namespace["build"]().get_scale() == 8.0
    assert namespace["other"].get_scale() == 4.0


def test_the_report_names_the_positionals_passed_by_name_not_the_dropped_device() -> None:
    ported, findings = _port('import torch\n\nscaler = torch.amp.GradScaler("cuda", 1024.0)\n')
    assert "scaler = npu_lossscale.torch.GradScaler(init_scale=1024.0)\n" in ported
    (change,) = _messages(findings, "change", "torch-grad-scaler")
    assert change.endswith("positional arguments passed by name (init_scale)"), change


CUDA_NOTE = "device='auto' (the NPU) instead of CUDA"


@pytest.mark.parametrize(
    ("call", "ported_call", "details", "scale"),
    [
        ("torch.cuda.amp.GradScaler()", "GradScaler()", CUDA_NOTE, 2.0**16),
        (
            "torch.cuda.amp.GradScaler(1024.0)",
            "GradScaler(init_scale=1024.0)",
            CUDA_NOTE + "; positional arguments passed by name (init_scale)",
            1024.0,
        ),
        (
            'torch.amp.GradScaler("cpu", 1024.0)',
            'GradScaler("cpu", 1024.0)',
            'device `"cpu"` kept',
            1024.0,
        ),
    ],
    ids=["no-arguments", "positional-made-keyword", "positional-kept"],
)
def test_the_report_claims_positionals_passed_by_name_only_where_the_port_names_them(
    call: str, ported_call: str, details: str, scale: float
) -> None:
    """A call with nothing positional, or whose positionals stay positional (torch.amp's
    parameter order is the ported class's), gets no "passed by name" note."""
    ported, findings = _port(f"import torch\n\nscaler = {call}\n")
    assert f"scaler = npu_lossscale.torch.{ported_call}\n" in ported
    what = call.partition("(")[0]
    assert _messages(findings, "change", "torch-grad-scaler") == [
        f"`{what}(...)` -> npu_lossscale.torch.GradScaler(...), settings kept; {details}"
    ]
    assert _run(ported)["scaler"].get_scale() == scale


def test_the_report_says_when_double_star_arguments_are_passed_on() -> None:
    source = "import torch\n\ncfg = {}\nscaler = torch.cuda.amp.GradScaler(**cfg)\n"
    ported, findings = _port(source)
    assert "scaler = npu_lossscale.torch.GradScaler(**cfg)\n" in ported
    (change,) = _messages(findings, "change", "torch-grad-scaler")
    assert "**-arguments passed on as written" in change
    (plain,) = _messages(_port(source.replace("**cfg", ""))[1], "change", "torch-grad-scaler")
    assert "**-arguments" not in plain


def test_an_import_dropped_between_semicolons_leaves_the_others_valid() -> None:
    ported, _ = _port(
        "import os; from torch.cuda.amp import GradScaler; import sys\n\nscaler = GradScaler()\n"
    )
    assert ported.startswith("import os; import sys\nfrom npu_lossscale.torch import GradScaler\n")
    assert _run(ported)["scaler"].get_scale() == 2.0**16


def test_the_running_import_is_the_home_of_a_name_also_imported_for_type_checking() -> None:
    ported, _ = _port(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from torch.cuda import amp\n"
        "from torch.cuda import amp\n\nscaler = amp.GradScaler()\n"
    )
    assert "\nimport npu_lossscale.torch\n" in ported  # at module level, where it runs
    assert _run(ported)["scaler"].get_scale() == 2.0**16


def test_a_use_above_the_imports_gets_the_library_import_after_the_providing_one() -> None:
    """The first use sits in a function defined above the imports: the new import goes where
    `import torch`, the import the reference resolves through, is (after it, or in its place
    where the port drops it), before the file's later torch imports."""
    ported, _ = _port(
        "def make():\n    return torch.cuda.amp.GradScaler()\n\n\n"
        "import torch\nimport torch.nn\n\nscaler = make()\nlayer = torch.nn.Linear(1, 1)\n"
    )
    assert "\nimport npu_lossscale.torch\nimport torch.nn\n" in ported
    assert _run(ported)["scaler"].get_scale() == 2.0**16


GUARDED = (
    "import random\n\nimport torch\n\nscaler = torch.cuda.amp.GradScaler()\n\n\n"
    "def step():\n    if {test}:\n        raise RuntimeError('stop')\n"
)


@pytest.mark.parametrize(
    ("test", "floor"),
    [
        ("scaler.get_scale() < 1e-4", True),  # fairseq's "minimum loss scale reached"
        ("float(scaler.get_scale()) <= 0.5", True),
        ("random.random() < 0.5", False),  # another zero-argument call: not the scale
        ("scaler.get_scale() <= 0", False),  # never true at a floor of 1: nothing to keep
        # fairseq's amp_optimizer.py: the minimum is configured (1e-4 by default)
        ("scaler.get_scale() * scaler.get_backoff_factor() <= cfg.min_loss_scale", True),
        ("scaler.get_scale() >= cfg.max_loss_scale", False),
        ("self.next_loss_scale <= self.min_loss_scale", True),  # read through a property
    ],
)
def test_only_a_scale_compared_with_a_number_in_0_1_or_a_minimum_keeps_torchs_rule(
    test: str, floor: bool
):
    ported, findings = _port(GUARDED.format(test=test))
    assert ("min_loss_scale=0" in ported) is floor
    assert bool(_messages(findings, "warning", "torch-scale-below-one")) is floor


@pytest.mark.parametrize(
    ("source", "kept"),
    [
        # every read of torch was the scaler: the dotted import goes, as `import torch` would
        ("import torch.cuda.amp\n\nscaler = torch.cuda.amp.GradScaler(enabled=False)\n", False),
        # torch.cuda.amp is still read (autocast): the import stays
        (
            "import torch.cuda.amp\n\nscaler = torch.cuda.amp.GradScaler(enabled=False)\n"
            "cast = torch.cuda.amp.autocast\n",
            True,
        ),
    ],
)
def test_a_dotted_torch_import_goes_only_when_the_port_left_it_unused(
    source: str, kept: bool
) -> None:
    ported, findings = _port(source)
    assert ("import torch.cuda.amp\n" in ported) is kept
    assert _run(ported)["scaler"].get_scale() == 1.0  # disabled: the scale reads 1.0
    said = _messages(findings, "change", "torch-import")
    gone = ("removed this import", "this import becomes")
    assert any(m.startswith(gone) for m in said) is not kept


def test_a_dotted_scaler_is_ported_where_the_bare_name_must_stay_torchs() -> None:
    """`GradScaler` is also used as a value, so its import stays torch's and the call beside it
    gets NPUGradScaler; the dotted call further down must become the ported class, not the bare
    `GradScaler` that still means torch.cuda.amp's (on an NPU a CUDA scaler, here a disabled one
    whose scale reads 1.0)."""
    ported, _ = _port(
        "import torch\nfrom torch.cuda.amp import GradScaler\n\n"
        'SCALERS = {"cuda": GradScaler}\nscaler = GradScaler(init_scale=8.0)\n'
        "other = torch.cuda.amp.GradScaler(init_scale=4.0)\n"
    )
    assert "other = npu_lossscale.torch.GradScaler(init_scale=4.0)\n" in ported
    namespace = _run(ported)
    for name, scale in (("scaler", 8.0), ("other", 4.0)):
        assert isinstance(namespace[name], npu_lossscale.torch.GradScaler), name
        assert namespace[name].get_scale() == scale


def test_a_star_import_is_not_blamed_where_only_another_devices_scaler_is_spelled_out() -> None:
    """`from torch.cuda.amp import *` only matters where the file reads a bare `GradScaler`;
    here the only one is the tail of Cambricon's `torch.mlu.amp.GradScaler`, which is not
    torch's class nor the star-bound name: the report must not ask the user to import a
    `GradScaler` the file never reads. The torch.amp call beside it is ported and builds."""
    ported, findings = _port(
        "import torch\nfrom torch.cuda.amp import *\n\n\n"
        'def make_scaler(device):\n    if device == "mlu":\n'
        "        return torch.mlu.amp.GradScaler()\n"
        "    return torch.amp.GradScaler(device, init_scale=8.0)\n"
    )
    assert "        return torch.mlu.amp.GradScaler()\n" in ported
    assert not [m for m in _messages(findings, "warning", "torch-grad-scaler") if "*" in m]
    scaler = _run(ported)["make_scaler"]("cpu")
    assert isinstance(scaler, npu_lossscale.torch.GradScaler)
    assert scaler.get_scale() == 8.0


def test_the_fallback_of_a_try_importing_another_librarys_scaler_is_still_reported() -> None:
    """Only a `try:` importing torch.amp's scaler succeeds on every torch the port runs on; one
    importing fairscale's fails wherever fairscale is missing, so its `except` runs on the
    NPU and the torch scaler kept there as a value needs the user's hand."""
    _, findings = _port(
        "import torch\n\ntry:\n"
        "    from fairscale.optim.grad_scaler import GradScaler as FSDPScaler\n"
        "except ImportError:  # no fairscale: torch's own\n"
        "    FSDPScaler = torch.cuda.amp.GradScaler\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
    )
    warned = [f for f in findings if f.kind == "warning" and f.rule == "torch-grad-scaler"]
    assert [f.line for f in warned] == [6]
    assert "is used as a value" in warned[0].message


def test_a_patch_of_torchs_scaler_class_is_reported_where_it_stops_reaching_the_port() -> None:
    """A script that patches or borrows a method of torch's class (`torch.cuda.amp.GradScaler.step
    = ...`, `torch.amp.GradScaler.unscale_`) keeps pointing at torch's class while its scaler
    becomes npu_lossscale's: the patch no longer applies to it, so each such line is reported
    (dotted names of four and of five parts alike) and left as written."""
    source = (
        "import torch\n\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "original_step = torch.cuda.amp.GradScaler.step\n"
        "torch.amp.GradScaler.unscale_ = lambda self, optimizer: None\n"
    )
    ported, findings = _port(source)
    assert "scaler = npu_lossscale.torch.GradScaler()\n" in ported
    assert "original_step = torch.cuda.amp.GradScaler.step\n" in ported
    reported = {
        (f.line, f.message)
        for f in findings
        if f.kind == "warning" and f.rule == "torch-grad-scaler"
    }
    assert {line for line, _ in reported} == {4, 5}
    assert all("reaches into torch's torch." in m for _, m in reported)


@pytest.mark.parametrize(
    ("guard", "below_one"),
    [("args.dropout < 0.5", False), ("scaler._scale.item() < 0.5", True)],
    ids=["another-objects-attribute", "the-scalers-own-scale"],
)
def test_only_the_scalers_scale_compared_below_one_keeps_torchs_rule(
    guard: str, below_one: bool
) -> None:
    """`args.dropout < 0.5` beside a GradScaler is the script's own setting, not a sign that it
    relies on the scale going below 1: only a read of the scale (`._scale`, `get_scale()`)
    keeps torch's rule (min_loss_scale=0, said in a warning)."""
    ported, findings = _port(
        f"import torch\n\nscaler = torch.cuda.amp.GradScaler()\n\nif {guard}:\n    pass\n"
    )
    kept = "npu_lossscale.torch.GradScaler(min_loss_scale=0)" in ported
    assert kept is below_one
    assert bool(_messages(findings, "warning", "torch-scale-below-one")) is below_one
    assert "npu_lossscale.torch.GradScaler(" in ported


def test_a_name_imported_beside_the_scaler_is_not_counted_as_a_use_of_it() -> None:
    """`from torch.cuda.amp import GradScaler, autocast as AMP`: the uses of `AMP` are
    autocast's, so once the scaler's only use is ported `GradScaler` leaves torch's import and
    the script builds npu_lossscale's under its own name (no dead torch import, no alias)."""
    ported, _ = _port(
        "from torch.cuda.amp import GradScaler, autocast as AMP\n\n"
        "scaler = GradScaler(init_scale=64.0)\n"
        "with AMP(enabled=False):\n    pass\n"
    )
    assert ported.startswith(
        "from torch.cuda.amp import autocast as AMP\nfrom npu_lossscale.torch import GradScaler\n"
    )
    scaler = _run(ported)["scaler"]
    assert type(scaler) is npu_lossscale.torch.GradScaler and scaler.get_scale() == 64.0
