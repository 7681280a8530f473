"""The outline of a file kept for the plan alone (migrator.pipeline.outline) must give the plan
exactly the facts the whole file gives.

Every fixture is read both ways; hand-written modules pin down what is blanked and what is kept:
step functions, names imports bind to what the facts are read from, `global` statements, and
names defined twice.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.pipeline import outline, transform

FIXTURES = sorted(
    p
    for p in MIGRATOR_FIXTURES.rglob("*.py")
    if "expected" not in p.parts and b"npu-migrate:" not in p.read_bytes()
)
OUTLINED = [p for p in FIXTURES if outline.outline(p.read_bytes()) is not None]


def test_enough_fixtures_have_an_outline_for_the_comparison_to_mean_something() -> None:
    assert len(OUTLINED) >= 20


@pytest.mark.parametrize("fixture", OUTLINED, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_the_outline_gives_every_fixture_the_plan_facts_of_the_whole_file(fixture: Path) -> None:
    source = fixture.read_bytes()
    prepared = transform.prepare_source(source, path=fixture.name, facts_only=True)
    assert prepared.facts == transform.scan_source(source, path=fixture.name)
    assert prepared.source == source
    assert prepared.ported.new_source == source and prepared.ported.findings == []


MODULE = b"""\
import tensorflow as tf
from opt.lib import Base


@tf.function
def schedule(step,
             total):
    warm = step / total
    return warm


def one_liner(x): return x


class Plain(Base):
    \"\"\"Read for its bases only.\"\"\"

    def __init__(self):
        @tf.function
        def inner():
            return 1
        self.inner = inner


class Steps(Base):
    def apply_gradients(self, grads_and_vars, step=None, name=None):
        updates = [v.assign_sub(g) for g, v in grads_and_vars]
        return tf.group(*updates, name=name)


def last(): pass
"""


def test_bodies_are_blanked_and_every_kept_line_stays_where_it_was() -> None:
    short = outline.outline(MODULE)
    assert short is not None
    lines, kept = MODULE.splitlines(), short.splitlines()
    assert len(kept) == len(lines)
    changed = {i + 1 for i, (a, b) in enumerate(zip(lines, kept)) if a != b}
    # schedule's body (lines 8-9) and Plain's (16-22; 17 was blank); the first line of each
    # becomes `pass`.
    assert changed == {8, 9, 16, *range(18, 23)}
    assert kept[7] == b"    pass" and kept[8] == b""
    assert kept[15] == b"    pass" and all(line == b"" for line in kept[16:22])
    # A body on its header's line, a class spelling apply_gradients: as they were.
    assert kept[11] == lines[11] and kept[24:28] == lines[24:28] and kept[-1] == lines[-1]
    ast.parse(short)


def test_line_endings_are_kept() -> None:
    source = MODULE.replace(b"\n", b"\r\n")
    short = outline.outline(source)
    assert short is not None
    assert short.count(b"\r\n") == source.count(b"\r\n") and short.count(b"\n") == short.count(
        b"\r\n"
    )


def test_a_module_facts_come_from_its_outline_with_its_own_lines() -> None:
    prepared = transform.prepare_source(MODULE, path="opt.py", facts_only=True)
    whole = transform.scan_source(MODULE, path="opt.py")
    assert prepared.facts == whole
    assert [(c.name, c.line, c.state) for c in whole.classes] == [
        ("Plain", 15, "follows_bases"),
        ("Steps", 25, "insertable"),
    ]


# `Base` is bound at module level twice (once by the function's `global`), so the class's base is
# ambiguous; without the function it would be the module-level `None`.
GLOBAL_BASE = b"""\
Base = None


def setup():
    global Base
    from opt.lib import Fancy as Base


class Mine(Base):
    def step(self):
        return 1
"""


def test_a_function_saying_global_is_kept_whole() -> None:
    short = outline.outline(GLOBAL_BASE)
    assert short is not None
    assert b"    global Base\n    from opt.lib import Fancy as Base\n" in short
    assert b"return 1" not in short  # the class body is blanked
    prepared = transform.prepare_source(GLOBAL_BASE, path="opt.py", facts_only=True)
    assert prepared.facts == transform.scan_source(GLOBAL_BASE, path="opt.py")


def _without(monkeypatch: pytest.MonkeyPatch, pattern: bytes) -> None:
    """Let the outline blank bodies that spell `pattern` (what the tests below show it must not)."""
    kept = outline._KEEP.pattern.replace(pattern + b"|", b"")
    assert kept != outline._KEEP.pattern
    monkeypatch.setattr(outline, "_KEEP", re.compile(kept))


def test_the_facts_would_differ_without_keeping_global(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = transform.scan_source(GLOBAL_BASE, path="opt.py")
    _without(monkeypatch, rb"\bglobal\b")
    unguarded = outline.outline(GLOBAL_BASE)
    assert unguarded is not None
    assert [b.kind for b in whole.classes[0].bases] == ["unknown"]
    assert [b.kind for b in transform.scan_source(unguarded, path="opt.py").classes[0].bases] == [
        "local"
    ]


# A step function (kept, with its optimizer class), another that reaches the step getter only
# through an import's alias, and a helper that can hold no fact (blanked).
STEPS = b"""\
import tensorflow as tf
from tensorflow.compat.v1.train import get_or_create_global_step as step_of

from opt.lib import Fancy


def build(loss):
    global_step = tf.train.get_or_create_global_step()
    optimizer = Fancy(0.1)
    train_op = optimizer.minimize(loss)
    return tf.group(train_op, global_step.assign_add(1))


def build_aliased(loss):
    step = step_of()
    optimizer = Fancy(0.1)
    train_op = optimizer.minimize(loss)
    return tf.group(train_op, step.assign_add(1))


def helper(x):
    y = x * 2
    return y


class Trainer(object):
    def train(self, loss, optimizer):
        global_step = tf.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss)
        return tf.group(train_op, global_step.assign_add(1))

    def log(self, value):
        print("loss", value)
"""


def test_step_functions_and_aliased_getters_are_kept_and_give_the_same_facts() -> None:
    short = outline.outline(STEPS)
    assert short is not None
    assert b"global_step.assign_add(1)" in short and b"step.assign_add(1)" in short
    assert b"y = x * 2" not in short and b'print("loss", value)' not in short
    whole = transform.scan_source(STEPS, path="train.py")
    assert [f.key for f in whole.functions] == ["build", "build_aliased", "Trainer.train"]
    prepared = transform.prepare_source(STEPS, path="train.py", facts_only=True)
    assert prepared.facts == whole


def test_the_facts_would_differ_without_following_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outline, "_ALIAS", re.compile(rb"(?!)(\w+)(\w+)"))
    unfollowed = outline.outline(STEPS)
    assert unfollowed is not None
    assert [f.key for f in transform.scan_source(unfollowed, path="train.py").functions] == [
        "build",
        "Trainer.train",
    ]


# The second `build` holds the step function `build.inner`, which the plan knows as
# `build.inner#2` because the first `build` has an `inner` too.
TWICE = b"""\
import tensorflow as tf


def build(loss):
    def inner():
        return loss
    return inner


def build(loss):
    def inner(optimizer):
        global_step = tf.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss)
        return tf.group(train_op, global_step.assign_add(1))
    return inner
"""


def test_a_name_defined_twice_is_kept_whole() -> None:
    assert outline.outline(TWICE) is None
    whole = transform.scan_source(TWICE, path="train.py")
    assert [f.key for f in whole.functions] == ["build.inner#2"]
    prepared = transform.prepare_source(TWICE, path="train.py", facts_only=True)
    assert prepared.facts == whole


def test_files_without_a_body_to_blank_or_that_do_not_parse_have_no_outline() -> None:
    assert outline.outline(b"import tensorflow as tf\nx = 1\n") is None
    assert outline.outline(b"class A: pass\ndef f(): return 1\n") is None
    assert outline.outline(b"def f(:\n    pass\n") is None
    assert outline.outline(b"def f():\r    return 1\r") is None  # lone CR: lines would differ
