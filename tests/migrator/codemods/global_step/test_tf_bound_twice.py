"""A TF 1 script made to run on TF 2 binds `tf` twice: a try/except import of
`tensorflow.compat.v1` and `tensorflow`, or `tf = tf.compat.v1` (alone or chosen by the version)
after `import tensorflow as tf`.
Both bindings spell the same API, so NVIDIA BERT's optimizer set-up written that way is ported
as the single-import one is (its contrib loss scaling replaced, the step increment moved into
LAMB), where it had been left with "bound to more than one thing" and a global-step reason that
quoted the right shape as the wrong one. Proven by training the port: the numpy LAMB of
test_lamb_step_reads, on this TensorFlow and on TF 1.15's reference variables where built.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json
from test_lamb_step_reads import STEPS, _assert_trains_like_reference

FIXTURE = MIGRATOR_FIXTURES / "bert_lamb"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
IMPORT = "import tensorflow as tf\n"
BINDINGS = {
    "try_import": (
        "try:\n  import tensorflow.compat.v1 as tf\n"
        "except ImportError:\n  import tensorflow as tf\n"
    ),
    "chosen": 'import tensorflow as tf\n\ntf = tf.compat.v1 if tf.__version__[0] == "2" else tf\n',
    "rebound": (
        'import tensorflow as tf\n\nif not tf.__version__.startswith("1."):\n  tf = tf.compat.v1\n'
    ),
}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fixture as written (one import), ported: what the bound-twice ports must match."""
    src = tmp_path_factory.mktemp("single_src")
    shutil.copy(FIXTURE / "optimization.py", src / "optimization.py")
    proc = run_cli("--write", src)
    assert proc.returncode == 0, proc.stderr
    return (src / "optimization.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module", params=sorted(BINDINGS))
def ported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    src = tmp_path_factory.mktemp(f"{request.param}_src")
    out = tmp_path_factory.mktemp(f"{request.param}_out")
    original = (FIXTURE / "optimization.py").read_text(encoding="utf-8")
    assert original.count(IMPORT) == 1
    (src / "optimization.py").write_text(original.replace(IMPORT, BINDINGS[request.param]))
    shutil.copy(FIXTURE / "train_steps.py", src / "train_steps.py")
    report = src.parent / f"{request.param}_report.json"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    return {"out": out, "findings": findings, "binding": BINDINGS[request.param]}


def _from_first_def(code: str) -> str:
    return code[code.index("\ndef ") :]


def test_the_port_is_the_single_import_ones(ported: dict, single: str) -> None:
    code = (ported["out"] / "optimization.py").read_text(encoding="utf-8")
    bindings = [line for line in ported["binding"].splitlines() if line]
    assert all(f"{line}\n" in code for line in bindings)  # both bindings stay as written
    assert "from npu_lossscale import ExponentialUpdateLossScaleManager, NPU" in code
    assert "contrib" not in code
    assert _from_first_def(code) == _from_first_def(single)  # manager, optimizer, step moved
    rules = {f["rule"] for f in ported["findings"]}
    assert "unresolved-access" not in rules and "global-step-manual" not in rules


def test_the_port_trains_like_the_reference_here(ported: dict) -> None:
    configs = ["lamb:ref:fp16", "lamb:resource:fp16", "adam:resource:fp16"]
    results = run_json(sys.executable, ported["out"], "train_steps.py", str(STEPS), *configs)
    _assert_trains_like_reference(results["results"])


@pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
def test_on_tf115_the_port_trains_like_the_reference(ported: dict) -> None:
    results = run_json(TF115, ported["out"], "train_steps.py", str(STEPS), "lamb:ref:fp16")
    _assert_trains_like_reference(results["results"])


def test_two_imports_of_different_modules_stay_unresolved(tmp_path: Path) -> None:
    """Only bindings of one API are followed: a name that may be TensorFlow or another module
    is still left for a person."""
    source = (
        "try:\n    import tensorflow as tf\nexcept ImportError:\n    import mytf as tf\n\n"
        "opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)\n"
    )
    (tmp_path / "train.py").write_text(source)
    proc = run_cli("--check", tmp_path / "train.py")
    assert "train.py:6: unresolved-access: " in proc.stderr
