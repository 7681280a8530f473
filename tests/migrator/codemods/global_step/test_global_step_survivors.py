"""The global-step move's edges the mutation run (benchmarks/mutation.py, issue 30) found unpinned.

Each case is one small change to a BERT-shaped script (`SCRIPT`: a custom tf.train optimizer whose
apply_gradients returns `tf.group(*updates)`, wrapped in contrib's loss-scale optimizer, and the
step advanced by hand after it). Shapes the move must leave alone are checked on the ported text
(the update kept, no increment added, the reason reported); shapes it moves are also trained
under TensorFlow with npu_lossscale: over a clean, an overflowed and a clean step the step must
reach 2 and the weights move twice (SGD at 0.1 on 0.5*|w|^2: w * 0.9**2), as the hand-written
update would have on a GPU run that skipped the overflowed step.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

from migrator.pipeline.transform import migrate_source

SCRIPT = """import tensorflow.compat.v1 as tf


class Opt(tf.train.Optimizer):
    def __init__(self, lr):
        super().__init__(False, "Opt")
        self.lr = lr

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = [v.assign_sub(self.lr * g) for g, v in grads_and_vars]
        return tf.group(*updates, name=name)


def create_optimizer(loss):
    global_step = tf.train.get_or_create_global_step()
    optimizer = Opt(0.1)
    manager = tf.contrib.mixed_precision.FixedLossScaleManager(8)
    optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, manager)
    grads_and_vars = optimizer.compute_gradients(loss)
    train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    new_global_step = global_step + 1
    train_op = tf.group(train_op, [global_step.assign(new_global_step)])
    return train_op
"""
UPDATE = """    new_global_step = global_step + 1
    train_op = tf.group(train_op, [global_step.assign(new_global_step)])
"""
FINITE = "    finite = tf.reduce_all([tf.reduce_all(tf.is_finite(g)) for g, _ in grads_and_vars])\n"
NOT_PASSED = (
    "apply_gradients(grads_and_vars, global_step=global_step)",
    "apply_gradients(grads_and_vars)",
)


def _variant(*replacements: tuple[str, str]) -> str:
    text = SCRIPT
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _port(source: str) -> tuple[str, list]:
    result = migrate_source(source.encode(), path="train.py")
    return result.new_source.decode(), result.findings


def _rules(findings: list, kind: str) -> list[str]:
    return [f"{f.rule}: {f.message}" for f in findings if f.kind == kind]


def _train(ported: str) -> tuple[int, np.ndarray]:
    """Run the ported create_optimizer for a clean, an overflowed and a clean step."""
    import tensorflow as tf

    namespace: dict = {}
    exec(compile(ported, "train.py", "exec"), namespace)
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0])
        poison = tf.compat.v1.placeholder(tf.float32, [])
        train_op = namespace["create_optimizer"](0.5 * tf.reduce_sum(w * w) * poison)
        step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in (1.0, math.inf, 1.0):
                session.run(train_op, {poison: value})
            return int(session.run(step)), session.run(w)


# -- shapes the move must leave to the user -----------------------------------------------------

LEFT_ALONE = {
    "optimizer handed in": (
        ("def create_optimizer(loss):", "def create_optimizer(loss, optimizer):"),
        "the optimizer `optimizer` comes from outside the function",
    ),
    "advances by 2": (("global_step + 1", "global_step + 2"), "neither `global_step + 1`"),
    "assign_add by 2": (
        (UPDATE, "    train_op = tf.group(train_op, [tf.assign_add(global_step, 2)])\n"),
        "advances the step by something other than 1",
    ),
    # The moved increment adds 1: a step the script holds still (adds 0) would start counting.
    "assign_add by 0": (
        (UPDATE, "    train_op = tf.group(train_op, [tf.assign_add(global_step, 0)])\n"),
        "advances the step by something other than 1",
    ),
    "tf.cond advancing on both branches": (
        (
            "    new_global_step = global_step + 1\n",
            FINITE + "    new_global_step = tf.cond(finite, lambda: global_step + 1, "
            "lambda: global_step + 1)\n",
        ),
        "neither `global_step + 1`",
    ),
    "class already advancing": (
        (
            "        return tf.group(*updates, name=name)",
            "        updates.append(global_step.assign_add(1))\n"
            "        return tf.group(*updates, name=name)",
        ),
        "already advances global_step in apply_gradients",
    ),
    "tf.train optimizer given the step": (
        ("optimizer = Opt(0.1)", "optimizer = tf.train.GradientDescentOptimizer(0.1)"),
        "would advance twice",
    ),
    "another step passed": (
        ("global_step=global_step)", "global_step=other_step)"),
        "receives `other_step` as global_step",
    ),
    "new step read elsewhere": (
        (
            "    return train_op",
            "    tf.summary.scalar('step', new_global_step)\n    return train_op",
        ),
        "`new_global_step` is also used outside the step update",
    ),
    # Moving it would comment out the whole line, and the summary written beside it with it.
    "new step computed beside another statement": (
        (
            "    new_global_step = global_step + 1\n",
            "    new_global_step = global_step + 1; tf.summary.scalar('lr', 0.1)\n",
        ),
        "`new_global_step` is computed in a shape the tool does not know",
    ),
    # Habana's BERT: the update sits in the header of a `with`, no statement of its own.
    "update in a with header": (
        (
            "    train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n",
            "    with tf.control_dependencies([global_step.assign(new_global_step)]):\n"
            "        train_op = tf.identity(train_op)\n",
        ),
        "outside a statement of its own (in the header of a `with`",
    ),
    "Keras optimizer": (
        ("optimizer = Opt(0.1)", "optimizer = tf.keras.optimizers.Optimizer(0.1)"),
        "cannot tell where `tf.keras.optimizers.Optimizer` is defined",
    ),
}


@pytest.mark.parametrize("case", sorted(LEFT_ALONE))
def test_unsafe_shapes_keep_the_hand_made_update(case: str) -> None:
    replacement, reason = LEFT_ALONE[case]
    extra = [NOT_PASSED] if case == "Keras optimizer" else []
    if case == "optimizer handed in":
        extra.append(("    optimizer = Opt(0.1)\n", ""))
    source = _variant(replacement, *extra)
    if case == "another step passed":
        source = source.replace(
            "    optimizer = Opt(0.1)\n",
            "    optimizer = Opt(0.1)\n    other_step = tf.Variable(0)\n",
        )
    ported, findings = _port(source)
    warnings = _rules(findings, "warning")
    assert any(w.startswith("global-step-manual") and reason in w for w in warnings), warnings
    assert not any(r.startswith("global-step") for r in _rules(findings, "change"))
    # The script's own update still runs, and no increment went into an apply_gradients.
    original_update = [line for line in source.splitlines() if "global_step" in line]
    ported_lines = ported.splitlines()
    for line in original_update:
        if "contrib" not in line:
            assert line in ported_lines, line
    assert "npu-migrate: global_step" not in ported
    assert ported.count("global_step.assign") == source.count("global_step.assign")


def test_an_update_in_a_with_header_is_warned_at_its_own_line() -> None:
    header = "    with tf.control_dependencies([global_step.assign(new_global_step)]):\n"
    source = _variant(
        (
            "    train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n",
            header + "        train_op = tf.identity(train_op)\n",
        )
    )
    _, findings = _port(source)
    (manual,) = [f for f in findings if f.rule == "global-step-manual"]
    assert manual.line == source.splitlines().index(header.rstrip("\n")) + 1


NESTED_UPDATE = (
    """    train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    new_global_step = global_step + 1
    train_op = tf.group(train_op, [global_step.assign(new_global_step)])
    return train_op
""",
    """
    def update():
        train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        new_global_step = global_step + 1
        train_op = tf.group(train_op, [global_step.assign(new_global_step)])
        return train_op

    return update()
""",
)


def _manual(findings: list) -> list:
    return [f for f in findings if f.rule == "global-step-manual"]


def test_a_closure_of_the_function_that_builds_the_optimizer_gets_its_own_reason() -> None:
    """Habana's BERT advances the step in a `def update` nested in `create_optimizer`, whose
    loss-scale optimizer it uses: not "a function that builds no loss-scale optimizer"."""
    source = _variant(NESTED_UPDATE)
    ported, findings = _port(source)
    (manual,) = _manual(findings)
    assert "comes from outside the function" in manual.message
    assert manual.line == source.splitlines().index(NESTED_UPDATE[1].splitlines()[2]) + 1
    assert ported.count("global_step.assign") == 1
    assert "npu-migrate: global_step" not in ported

    header = "        with tf.control_dependencies([global_step.assign(new_global_step)]):"
    source = _variant(
        NESTED_UPDATE,
        (
            "        train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n",
            header + "\n            train_op = tf.identity(train_op)\n",
        ),
    )
    (manual,) = _manual(_port(source)[1])
    assert "in the header of a `with`" in manual.message
    assert manual.line == source.splitlines().index(header) + 1


def test_a_closure_of_a_function_without_loss_scaling_builds_none() -> None:
    source = _variant(NESTED_UPDATE).replace(
        "    optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, manager)\n", ""
    )
    source += (
        "\n\ndef scaled(optimizer):\n"
        "    manager = tf.contrib.mixed_precision.FixedLossScaleManager(8)\n"
        "    return tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, manager)\n"
    )
    (manual,) = _manual(_port(source)[1])
    assert "update advances global_step itself but builds no loss-scale optimizer" in (
        manual.message
    )


def test_a_keras_subclass_gets_no_global_step_keyword() -> None:
    """Keras's apply_gradients takes no global_step: passing one would be a TypeError."""
    source = _variant(
        (
            """    def __init__(self, lr):
        super().__init__(False, "Opt")
        self.lr = lr

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = [v.assign_sub(self.lr * g) for g, v in grads_and_vars]
        return tf.group(*updates, name=name)""",
            "    pass",
        ),
        ("(tf.train.Optimizer)", "(tf.keras.optimizers.Optimizer)"),
        NOT_PASSED,
    )
    ported, findings = _port(source)
    assert "apply_gradients(grads_and_vars)\n" in ported
    assert "global_step=global_step" not in ported
    assert any("global-step-manual" in w for w in _rules(findings, "warning"))


def test_a_step_bound_on_the_same_line_after_the_call_is_not_passed() -> None:
    """`train_op = opt.apply_gradients(gv); global_step = ...`: the name is bound only after the
    call runs, so adding `global_step=global_step` there would raise UnboundLocalError."""
    source = _variant(
        ("    global_step = tf.train.get_or_create_global_step()\n", ""),
        (
            "train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)",
            "train_op = optimizer.apply_gradients(grads_and_vars); "
            "global_step = tf.train.get_or_create_global_step()",
        ),
    )
    ported, findings = _port(source)
    assert "global_step=global_step" not in ported
    warnings = _rules(findings, "warning")
    assert any("is assigned only after `apply_gradients`" in w for w in warnings), warnings


def test_updates_built_by_a_module_function_leave_the_step_update_to_the_user() -> None:
    """apply_gradients collects its updates from a module-level helper: the tool cannot see that
    the helper returns a list, so the increment has nowhere provable to go. The file is still
    ported (the contrib optimizer becomes npu_lossscale's) and the report says why the step
    update stays; it must not fail the whole file."""
    source = _variant(
        (
            "        updates = [v.assign_sub(self.lr * g) for g, v in grads_and_vars]\n",
            "        updates = sgd_updates(self.lr, grads_and_vars)\n",
        ),
        (
            "\n\nclass Opt",
            "\n\ndef sgd_updates(lr, grads_and_vars):\n"
            "    return [v.assign_sub(lr * g) for g, v in grads_and_vars]\n\n\nclass Opt",
        ),
    )
    ported, findings = _port(source)
    assert "optimizer = NPULossScaleOptimizer(optimizer, manager)\n" in ported
    assert UPDATE in ported
    (manual,) = [w for w in _rules(findings, "warning") if w.startswith("global-step-manual")]
    assert "does not return `tf.group(*updates, ...)` over a list" in manual


# -- shapes the move takes: the ported text, then its training ----------------------------------

MOVED = {
    "accumulated finiteness flag": (
        (
            "    new_global_step = global_step + 1\n",
            FINITE
            + "    all_finite = tf.Variable(True, trainable=False)\n"
            + "    all_finite = all_finite.assign(tf.logical_and(all_finite, finite))\n"
            + "    new_global_step = tf.cond("
            "all_finite, lambda: global_step + 1, lambda: global_step)\n",
        ),
    ),
    "as written": (),
    "assign_add by 1": (
        (UPDATE, "    train_op = tf.group(train_op, [tf.assign_add(global_step, 1)])\n"),
    ),
    "tf.cond on finiteness": (
        (
            "    new_global_step = global_step + 1\n",
            FINITE + "    new_global_step = tf.cond("
            "finite, lambda: global_step + 1, lambda: global_step)\n",
        ),
    ),
    "positional step parameter": (("global_step=None, name=None", "step=None, name=None"),),
    "step not passed": (NOT_PASSED,),
    "tf.train optimizer not given the step": (
        ("optimizer = Opt(0.1)", "optimizer = tf.train.GradientDescentOptimizer(0.1)"),
        NOT_PASSED,
    ),
}


@pytest.mark.parametrize("case", sorted(MOVED))
def test_moved_updates_advance_once_per_applied_step(case: str) -> None:
    source = _variant(*MOVED[case])
    ported, findings = _port(source)
    assert not _rules(findings, "warning")
    # The note, then the original update commented out line by line, in place.
    lines = ported.splitlines()
    note = next(
        i for i, line in enumerate(lines) if "# npu-migrate: global_step now advances" in line
    )
    # The note may be wrapped over several comment lines; it ends where the update begins.
    end = next(i for i in range(note, len(lines)) if lines[i].endswith("Original update:"))
    text = " ".join(line.strip().lstrip("#").strip() for line in lines[note : end + 1])
    assert text.endswith("(skipped on overflow). Original update:"), text
    kept = [line for line in source.splitlines() if "global_step" in line and "= tf.group" in line]
    assert kept and f"    # {kept[0].strip()}" in lines[end + 1 : end + 4]
    if case == "positional step parameter":
        assert "        if step is not None:" in lines
        assert "            updates.extend([step.assign(new_global_step)])" in lines
    step, weights = _train(ported)
    assert step == 2
    np.testing.assert_allclose(weights, [0.81, -1.62], rtol=1e-6)


def test_the_control_a_hand_made_update_left_in_place_counts_the_skipped_step() -> None:
    """Why the move matters: run unported (contrib spelled by npu_lossscale, the update kept),
    the step advances on the overflowed step too."""
    source = (
        SCRIPT.replace("tf.contrib.mixed_precision.", "npu_lossscale.")
        .replace(
            "import tensorflow.compat.v1 as tf\n",
            "import tensorflow.compat.v1 as tf\nimport npu_lossscale\n",
        )
        .replace("LossScaleOptimizer(optimizer", "NPULossScaleOptimizer(optimizer")
    )
    step, weights = _train(source)
    assert step == 3
    np.testing.assert_allclose(weights, [0.81, -1.62], rtol=1e-6)


@pytest.mark.parametrize(
    ("strings", "quote"),
    [(("'Opt'", '"sgd"'), '"'), (("'Opt'", "'sgd'"), "'"), (('"Opt"', '"sgd"'), '"')],
    ids=["tie", "single", "double"],
)
def test_the_inserted_op_name_follows_the_files_quotes_double_on_a_tie(strings, quote) -> None:
    first, second = strings
    source = _variant(
        (
            'super().__init__(False, "Opt")',
            f"super().__init__(False, {first})\n        self.kind = {second}",
        ),
    )
    ported, _ = _port(source)
    assert f"tf.identity(new_global_step, name={quote}step_update{quote})" in ported


OPT_MODULE = "gs_parallel_opt"  # a name no other test imports: the ported class's own module
# The project's other scripts: each has a loss-scale optimizer to port, and no step update.
OTHER_SCRIPT = """import tensorflow.compat.v1 as tf


def build_{i}(loss):
    manager = tf.contrib.mixed_precision.FixedLossScaleManager(8)
    sgd = tf.train.GradientDescentOptimizer(0.1)
    return tf.contrib.mixed_precision.LossScaleOptimizer(sgd, manager).minimize(loss)
"""


def _port_tree(tmp_path: Path, jobs: str) -> dict[str, str]:
    """SCRIPT split in two (the optimizer class in its own module, imported by the trainer) in a
    project of 8 files, ported by the CLI with `--jobs`; the ported texts by file name."""
    opt_part, _, train_part = SCRIPT.partition("\n\n\ndef create_optimizer")
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / f"{OPT_MODULE}.py").write_text(opt_part + "\n", encoding="utf-8")
    (src / "train.py").write_text(
        f"import tensorflow.compat.v1 as tf\n\nfrom {OPT_MODULE} import Opt\n\n\n"
        "def create_optimizer" + train_part,
        encoding="utf-8",
    )
    for i in range(6):  # 4 files to port per worker: with 8, `--jobs 2` starts two workers
        (src / f"other{i}.py").write_text(OTHER_SCRIPT.format(i=i), encoding="utf-8")
    out = tmp_path / f"out-j{jobs}"
    proc = run_cli("--output-dir", out, "--copy-unchanged", "--jobs", jobs, src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(out.iterdir()) if p.is_file()}


def test_a_class_imported_from_another_file_gets_the_step_when_files_are_ported_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `--jobs 2` each file is read in a worker process, and the plan is built from what
    the workers send back: the trainer's `from gs_parallel_opt import Opt` must still lead the
    increment into Opt's apply_gradients, the same port one process makes, and it trains."""
    parallel = _port_tree(tmp_path, "2")
    assert parallel == _port_tree(tmp_path, "1")
    assert "        if global_step is not None:" in parallel[f"{OPT_MODULE}.py"]
    assert "# npu-migrate: global_step now advances" in parallel["train.py"]
    monkeypatch.syspath_prepend(str(tmp_path / "out-j2"))
    monkeypatch.delitem(sys.modules, OPT_MODULE, raising=False)
    try:
        step, weights = _train(parallel["train.py"])
    finally:
        sys.modules.pop(OPT_MODULE, None)
    assert step == 2
    np.testing.assert_allclose(weights, [0.81, -1.62], rtol=1e-6)


def test_a_none_test_of_the_step_parameter_stays_a_test_of_the_parameter() -> None:
    """apply_gradients takes the step as `t` (the step's name in Adam's paper) and tests it for
    None; that test is no read of the step value, so the move must leave it on `t`: rewritten to
    read the advanced step, it would name a tensor made only when a step is passed, and the
    ported optimizer would fail (UnboundLocalError) wherever it is called without one."""
    source = _variant(
        ("global_step=None, name=None", "t=None, name=None"),
        (
            "        updates = [v.assign_sub(self.lr * g) for g, v in grads_and_vars]\n",
            "        lr = self.lr if t is None else self.lr * 1.0\n"
            "        updates = [v.assign_sub(lr * g) for g, v in grads_and_vars]\n",
        ),
    )
    ported, findings = _port(source)
    assert not _rules(findings, "warning")
    assert "        lr = self.lr if t is None else self.lr * 1.0\n" in ported
    step, weights = _train(ported)
    assert step == 2
    np.testing.assert_allclose(weights, [0.81, -1.62], rtol=1e-6)
    import tensorflow as tf

    namespace: dict = {}
    exec(compile(ported, "train.py", "exec"), namespace)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0])
        opt = namespace["Opt"](0.1)
        train_op = opt.apply_gradients([(w, w)])  # no step: nothing to advance
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            np.testing.assert_allclose(session.run(w), [0.9, -1.8], rtol=1e-6)


HALF_MODULE = "gs_half_opt"  # a name no other test imports: the class's own module


def test_a_move_left_half_applied_is_completed_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed between the two writes of a move (or the class file restored by hand) leaves
    the trainer's update commented out and the class without its increment: the step would never
    advance. The next `--write` must put the increment back into the class (the tree is then
    what one uninterrupted run writes), and the step advances once per clean step again."""
    opt_part, _, train_part = SCRIPT.partition("\n\n\ndef create_optimizer")
    tree = tmp_path / "tree"
    tree.mkdir()
    class_file, trainer = tree / f"{HALF_MODULE}.py", tree / "train.py"
    class_file.write_text(opt_part + "\n", encoding="utf-8")
    trainer.write_text(
        f"import tensorflow.compat.v1 as tf\n\nfrom {HALF_MODULE} import Opt\n\n\n"
        "def create_optimizer" + train_part,
        encoding="utf-8",
    )
    original_class = class_file.read_bytes()
    assert run_cli("--write", tree).returncode == 0
    ported = {p: p.read_bytes() for p in (class_file, trainer)}
    assert b"if global_step is not None:" in ported[class_file]
    class_file.write_bytes(original_class)
    proc = run_cli("--write", tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p: p.read_bytes() for p in (class_file, trainer)} == ported
    monkeypatch.syspath_prepend(str(tree))
    monkeypatch.delitem(sys.modules, HALF_MODULE, raising=False)
    try:
        step, weights = _train(trainer.read_text(encoding="utf-8"))
    finally:
        sys.modules.pop(HALF_MODULE, None)
    assert step == 2
    np.testing.assert_allclose(weights, [0.81, -1.62], rtol=1e-6)


def test_a_reason_quoting_code_over_several_lines_is_one_line_of_output(tmp_path: Path) -> None:
    """The CLI prints a finding as PATH:LINE: RULE: MESSAGE, one per line: code the reason quotes
    from a condition written over several lines is folded onto one (sitecao's BERT fork)."""
    condition = (
        "tf.cond(\n        tf.logical_and(finite,\n"
        "                       tf.cast(tf.reduce_any(finite), tf.bool)),\n"
        "        lambda: global_step + 1, lambda: global_step)"
    )
    source = _variant(
        ("    new_global_step = global_step + 1\n", FINITE + f"    new_global_step = {condition}\n")
    )
    (tmp_path / "train.py").write_text(source, encoding="utf-8")
    done = run_cli("--no-color", tmp_path / "train.py")
    assert done.returncode == 0, done.stderr
    (line,) = [text for text in done.stderr.splitlines() if ": global-step-manual: " in text]
    assert (
        "the step advances only when `tf.logical_and(finite, tf.cast(tf.reduce_any(finite), "
        "tf.bool))` holds, which is not a gradient-finiteness check"
    ) in line
