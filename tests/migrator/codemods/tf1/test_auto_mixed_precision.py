"""NVIDIA TensorFlow's automatic mixed precision, switched on through the environment (NCF,
ConvNets, GNMT), is read by no TensorFlow on Ascend: the file is left as it is and warned once, at
the store that turns it on, whether or not anything else in it is ported; a store that turns it
off, or a dict key that is not the environment, is not warned. All through the real CLI, with one
worker and with two."""

from __future__ import annotations

import json

import pytest
from cli_runner import MIGRATOR_FIXTURES, findings_of, port_fixture_tree, run_cli

FIXTURES = MIGRATOR_FIXTURES / "auto_mixed_precision"
RULE = "tf-auto-mixed-precision"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("auto_mixed_precision"), FIXTURES)


def _line(name: str, text: str) -> int:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return next(n for n, held in enumerate(lines, 1) if text in held)


def _warned(ported: dict, name: str) -> list[dict]:
    return [f for f in findings_of(ported, name) if f["rule"] == RULE]


def test_a_switch_turned_on_is_warned_where_it_is_set_and_the_file_is_left(ported) -> None:
    (found,) = _warned(ported, "ncf_style.py")
    assert (found["kind"], found["line"]) == ("warning", _line("ncf_style.py", "os.environ["))
    message = found["message"]
    assert message.startswith(
        "`os.environ['TF_ENABLE_AUTO_MIXED_PRECISION'] = '1'` switches on NVIDIA TensorFlow's "
        "automatic mixed precision (its graph rewrite computes in fp16 and scales the loss itself)"
    )
    assert "on Ascend the model runs in float32" in message
    assert "NPULossScaleOptimizer" in message and "--add-loss-scale dynamic" in message
    for name in ("ncf_style.py", "computed.py"):
        assert (ported["out"] / name).read_bytes() == (FIXTURES / name).read_bytes()


def test_a_computed_value_is_warned_with_its_condition(ported) -> None:
    (found,) = _warned(ported, "computed.py")
    assert "automatic mixed precision when `'1' if args.amp else '0'` is '1'" in found["message"]


@pytest.mark.parametrize("name", ["turned_off.py", "not_environ.py"])
def test_no_switch_turned_on_means_no_warning(ported, name: str) -> None:
    assert findings_of(ported, name) == []


def test_a_ported_file_gets_the_warning_beside_its_changes(ported) -> None:
    name = "with_contrib.py"
    (found,) = _warned(ported, name)
    assert found["line"] == _line(name, "environ.setdefault")
    assert (
        "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE is read only by NVIDIA's builds"
        in (found["message"])
    )
    assert any(f["kind"] == "change" for f in findings_of(ported, name))
    assert "NPULossScaleOptimizer" in (ported["out"] / name).read_text(encoding="utf-8")


def test_one_worker_says_what_two_say(ported, tmp_path) -> None:
    done = run_cli("--check", "-j", "1", "--report", tmp_path / "r.json", ported["src"])
    assert done.returncode == 1, done.stderr  # with_contrib.py would change
    alone = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))["findings"]
    assert [f for f in alone if f["rule"] == RULE] == [
        f for f in ported["findings"] if f["rule"] == RULE
    ]
    assert len([f for f in alone if f["rule"] == RULE]) == 3
