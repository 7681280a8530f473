"""Another library's TensorFlow LossScaleOptimizer (an embedding toolkit's look-alike) is left as
it is and warned: its inf/NaN check misses the overflows an NPU in saturation mode clamps to the
fp16 maximum, and nothing else in such a file names a loss-scale API the port would report."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree

FIXTURES = MIGRATOR_FIXTURES / "foreign_loss_scale"
RULE = "tf-foreign-loss-scale"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("foreign"), FIXTURES)


def _findings(ported: dict, name: str) -> list[dict]:
    return [f for f in ported["findings"] if Path(f["path"]).name == name]


def test_toolkit_wrapper_in_a_graph_is_warned_once_and_the_file_left(ported: dict) -> None:
    name = "sok_graph.py"
    assert (ported["out"] / name).read_bytes() == (FIXTURES / name).read_bytes()
    found = _findings(ported, name)
    # line 13 wraps the embedding optimizer; line 31's second wrapper of the same library is
    # covered by that warning; the mixed_float16 policy is not warned as Keras's implicit
    # scaling, since the file wraps its optimizer itself
    assert [(f["line"], f["rule"], f["kind"]) for f in found] == [(13, RULE, "warning")]
    message = found[0]["message"]
    assert "SparseOperationKit" in message and "inf/NaN only" in message
    assert "saturation mode" in message and "left as it is" in message


def test_toolkit_wrapper_beside_keras_s_own_only_keras_s_is_ported(ported: dict) -> None:
    name = "sok_keras_step.py"
    original = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    text = (ported["out"] / name).read_text(encoding="utf-8").splitlines()
    # the port adds one import line and rewrites Keras's wrapper (line 10); every other line,
    # the toolkit's import and its wrapper among them, is as it was
    assert original[9].startswith("    dense = tf.keras.mixed_precision.LossScaleOptimizer(")
    expected = original[:6] + ["from npu_lossscale.keras import LossScaleOptimizer"] + original[6:]
    expected[10] = "    dense = LossScaleOptimizer(tf.keras.optimizers.Adam(lr))"
    assert text == expected
    warned = [(f["line"], f["kind"]) for f in _findings(ported, name) if f["rule"] == RULE]
    assert warned == [(11, "warning")]  # `EmbeddingLSO(...)`, the toolkit's class by its alias


def test_the_port_is_stable(ported: dict) -> None:
    assert ported["again"].returncode == 0, ported["again"].stdout + ported["again"].stderr
