"""A module that only re-exports tf.contrib's LossScaleOptimizer for another file of the run
(`from project_scaling import LossScaleOptimizer`) is rebound to npu_lossscale's class, as a
module that also uses the name is. Before, it got an `unported-api` warning and stayed as it was,
so the importing file's port was half done: tf.contrib's optimizer around npu_lossscale's manager,
which fails on every TensorFlow without tf.contrib. The ported pair is then trained on TF 2.21 and,
where the stack is built, on TF 1.15 beside the unported original."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, port_fixture_tree
from script_runs import run_json

FIXTURE = MIGRATOR_FIXTURES / "reexport_pure"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
# w = [1, 2], loss = sum(w * x), SGD at 0.1: a clean step takes 0.1 off each weight; the
# overflowed step (x holds inf) changes nothing.
EXPECTED = [[0.9, 1.9], [0.9, 1.9], [0.8, 1.8]]


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("reexport"), FIXTURE)


def test_a_pure_reexport_is_rebound_not_left(ported) -> None:
    out = ported["out"]
    module = (out / "project_scaling.py").read_text(encoding="utf-8")
    assert "from npu_lossscale import NPULossScaleOptimizer as LossScaleOptimizer" in module
    assert "tensorflow.contrib" not in module
    user = (out / "uses_project_scaling.py").read_text(encoding="utf-8")
    assert "from project_scaling import LossScaleOptimizer" in user
    assert "from npu_lossscale import FixedLossScaleManager" in user
    assert ported["again"].returncode == 0  # nothing changes a second time
    mine = [f for f in ported["findings"] if Path(f["path"]).name == "project_scaling.py"]
    assert {(f["rule"], f["kind"]) for f in mine} == {("reexport", "change")}


def test_the_ported_pair_trains_and_skips_the_overflowed_step(ported) -> None:
    result = run_json(sys.executable, ported["out"], "run_steps.py")
    assert result == {"optimizer": "NPULossScaleOptimizer", "weights": EXPECTED}


@pytest.mark.skipif(not TF115.exists(), reason="the TF 1.15 stack is not built")
def test_on_tf115_the_port_steps_as_the_unported_original(ported) -> None:
    original = run_json(str(TF115), ported["src"], "run_steps.py")
    port = run_json(str(TF115), ported["out"], "run_steps.py")
    assert original == {"optimizer": "LossScaleOptimizer", "weights": EXPECTED}
    assert port == {"optimizer": "NPULossScaleOptimizer", "weights": EXPECTED}
