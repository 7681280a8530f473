"""A loss-scale optimizer whose apply_gradients is fed tf.gradients of the plain loss never scales
the loss: the port keeps the file's shape (its optimizer is ported as usual) and warns once, at
the tf.gradients call; gradients taken from the wrapper's compute_gradients, tf.gradients
feeding a plain optimizer (also in the other branch of the `if` that wraps it) or of a loss scaled
by hand, get no warning. All through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree

FIXTURE = MIGRATOR_FIXTURES / "unscaled_gradients"
RULE = "tf-unscaled-gradients"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    done = port_fixture_tree(tmp_path_factory.mktemp("unscaled_gradients"), FIXTURE)
    done["warned"] = {}  # file name -> its findings of the rule
    for found in done["findings"]:
        if found["rule"] == RULE:
            done["warned"].setdefault(Path(found["path"]).name, []).append(found)
    return done


def _warned(ported: dict, name: str) -> list[dict]:
    return ported["warned"].get(name, [])


def _line(name: str, text: str) -> int:
    lines = (FIXTURE / name).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize(
    ("name", "call", "optimizer"),
    [
        ("rewrite_tf_gradients.py", "tf.gradients(loss, tvars)", "optimizer"),
        ("contrib_alias.py", "tf.compat.v1.gradients(loss, params)", "opt"),
        # taken inside the value bound (`list(zip(tf.gradients(...), v))`); once per file
        ("zipped_inline.py", "tf.gradients(ys=loss, xs=variables)", "opt"),
    ],
)
def test_tf_gradients_into_the_wrapper_are_warned_at_the_call(ported, name, call, optimizer):
    (found,) = _warned(ported, name)
    assert (found["kind"], found["line"]) == ("warning", _line(name, call))
    message = found["message"]
    assert f"`{call}` feeds `{optimizer}.apply_gradients`" in message
    assert "never scaled" in message and f"`{optimizer}.compute_gradients`" in message
    ported_text = (ported["out"] / name).read_text(encoding="utf-8")
    assert "NPULossScaleOptimizer(" in ported_text and call in ported_text


def test_tf_gradients_inside_apply_gradients_itself_are_warned(tmp_path) -> None:
    """The second function of zipped_inline.py alone: the call sits in apply_gradients' argument."""
    source = (FIXTURE / "zipped_inline.py").read_text(encoding="utf-8")
    head, tail = source.index("\n\ndef optimize_loss"), source.index("\n\ndef optimize_inline")
    alone = source[:head] + source[tail:]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "inline.py").write_text(alone, encoding="utf-8")
    done = port_fixture_tree(tmp_path / "run", tmp_path / "in")
    (found,) = [f for f in done["findings"] if f["rule"] == RULE]
    assert "`tf.gradients(loss, variables)` feeds `opt.apply_gradients`" in found["message"]
    line = next(n for n, text in enumerate(alone.splitlines(), 1) if "tf.gradients(" in text)
    assert found["line"] == line


def test_the_warning_is_at_the_first_tf_gradients_call_whichever_apply_it_feeds() -> None:
    from migrator.selection import unscaled_gradients

    source = (
        "import tensorflow as tf\n\n\n"
        "def step(loss, other, tvars):\n"
        "    opt = tf.compat.v1.train.experimental.MixedPrecisionLossScaleOptimizer(\n"
        "        tf.compat.v1.train.AdamOptimizer(1e-3), 'dynamic')\n"
        "    first = tf.gradients(loss, tvars)\n"
        "    second = tf.gradients(other, tvars)\n"
        "    late = opt.apply_gradients(zip(second, tvars))\n"
        "    return late, opt.apply_gradients(zip(first, tvars))\n"
    )
    found = unscaled_gradients.finding(source.encode(), "step.py")
    assert found is not None and found.line == 7
    assert found.message.startswith("`tf.gradients(loss, tvars)` feeds `opt.apply_gradients`")


@pytest.mark.parametrize(
    "name",
    [
        "compute_gradients.py",
        "rebound.py",
        "other_branch.py",  # wrapped under `if`, tf.gradients in its `else`
        "hand_scaled.py",  # tf.gradients(loss * 1024.0, ...): scaled by hand
    ],
)
def test_gradients_from_compute_gradients_are_not_warned(ported, name) -> None:
    assert _warned(ported, name) == []
    assert "NPULossScaleOptimizer(" in (ported["out"] / name).read_text()


def test_the_port_is_stable(ported) -> None:
    assert ported["again"].returncode == 0
