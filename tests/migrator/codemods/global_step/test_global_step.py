"""The global-step move through the real CLI, checked on the parsed output (ast), not on text."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli

FIXTURES = MIGRATOR_FIXTURES / "bert"
MOVE, MANUAL = "global-step-move", "global-step-manual"
# An optimizer class whose apply_gradients can take the increment, for the sharing cases.
SHARED_OPTIMIZER = (
    "import tensorflow as tf\n\n\n"
    "class Shared(tf.train.Optimizer):\n"
    "    def apply_gradients(self, grads_and_vars, global_step=None, name=None):\n"
    "        ops = [v.assign_sub(g) for g, v in grads_and_vars]\n"
    "        return tf.group(*ops, name=name)\n"
)


# A loss-scaled function advancing the step by hand through Shared, which alone would move, and
# a plain fp32 one doing the same in another file, which keeps it from moving.
FP16_STEPPER = (
    SHARED_OPTIMIZER + "\n\n"
    "def fp16(loss, global_step):\n"
    "    manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
    "    opt = tf.contrib.mixed_precision.LossScaleOptimizer(Shared(False, 'a'), manager)\n"
    "    train_op = opt.minimize(loss, global_step=global_step)\n"
    "    new_global_step = global_step + 1\n"
    "    train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n"
    "    return train_op\n"
)
FP32_STEPPER = (
    "import tensorflow as tf\nfrom opt import Shared\n\n\n"
    "def fp32(loss, global_step):\n"
    "    train_op = Shared(False, 'b').minimize(loss, global_step=global_step)\n"
    "    new_global_step = global_step + 1\n"
    "    train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n"
    "    return train_op\n"
)


def _copy(tmp_path: Path, *names: str) -> Path:
    src = tmp_path / "src"
    for name in names:
        target = src / Path(name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, target)
    return src


def _migrate(tmp_path: Path, src: Path, *paths: Path) -> dict:
    report = tmp_path / f"report{len(list(tmp_path.glob('report*.json')))}.json"
    proc = run_cli(*(paths or (src,)), "--write", "--no-color", "--report", report, "-j", "1")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(report.read_text(encoding="utf-8"))


def _findings(report: dict, rule: str, name: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == rule and f["path"].endswith(name)]


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _step_updates(node: ast.AST, step: str = "global_step") -> list[ast.Call]:
    return [
        c
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr in ("assign", "assign_add")
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id == step
    ]


def _assert_guarded_increment_before_return(method: ast.FunctionDef, updates: str) -> None:
    *_, guard, ret = method.body
    assert isinstance(ret, ast.Return)
    assert isinstance(guard, ast.If)
    test = guard.test
    assert isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.IsNot)
    assert isinstance(test.left, ast.Name) and test.left.id == "global_step"
    assert isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
    extend = guard.body[-1].value
    assert isinstance(extend, ast.Call) and ast.unparse(extend.func) == f"{updates}.extend"
    assert len(_step_updates(guard)) == 1
    assert len(_step_updates(method)) == 1  # nothing else advances the step


def _step_code(path: Path) -> list[str]:
    """Every statement that computes or applies the step, and the apply calls, as source."""
    tree = ast.parse(path.read_text())
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.If):
            if "global_step" in ast.unparse(n.test):
                out.append(ast.unparse(n))
        elif isinstance(n, (ast.Assign, ast.Return)):
            code = ast.unparse(n)
            if "global_step" in code or "apply_gradients" in code:
                out.append(code)
    return out


def _line_of(path: Path, text: str, occurrence: int = 0) -> int:
    lines = [i for i, s in enumerate(path.read_text().splitlines(), 1) if text in s]
    return lines[occurrence]


def test_bert_create_optimizer_moves_step_into_both_optimizers(tmp_path):
    src = _copy(tmp_path, "optimization.py")
    original = src / "optimization.py"
    first_update = _line_of(original, "new_global_step = global_step + 1", 0)
    second_update = _line_of(original, "if use_fp16 or manual_fp16:", 1)
    bare_apply = _line_of(original, "train_op = optimizer.apply_gradients(")
    report = _migrate(tmp_path, src)
    tree = ast.parse((src / "optimization.py").read_text())

    create = _function(tree, "create_optimizer")
    assert _step_updates(create) == []
    assert not any(
        isinstance(t, ast.Name) and t.id == "new_global_step"
        for n in ast.walk(create)
        if isinstance(n, ast.Assign)
        for t in n.targets
    )
    for cls in ("AdamWeightDecayOptimizer", "LAMBOptimizer"):
        method = _method(tree, cls, "apply_gradients")
        _assert_guarded_increment_before_return(method, "assignments")
    applies = [
        c
        for c in ast.walk(create)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr == "apply_gradients"
    ]
    assert len(applies) == 2
    for call in applies:
        assert [ast.unparse(k.value) for k in call.keywords if k.arg == "global_step"] == [
            "global_step"
        ]
    # The original update is kept as comments, never lost.
    text = (src / "optimization.py").read_text()
    assert "#   new_global_step = tf.cond(all_are_finite, lambda: global_step + 1" in text

    moves = _findings(report, MOVE, "optimization.py")
    assert {f["line"] for f in moves} >= {first_update, second_update, bare_apply}
    assert len([f for f in moves if "apply_gradients: advances" in f["message"]]) == 2
    assert _findings(report, MANUAL, "optimization.py") == []


def test_second_run_changes_nothing(tmp_path):
    src = _copy(
        tmp_path, "optimization.py", "crossfile/run_pretraining.py", "crossfile/custom_opt.py"
    )
    _migrate(tmp_path, src)
    once = {p.name: p.read_bytes() for p in src.iterdir()}
    report = _migrate(tmp_path, src)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == once
    assert report["summary"]["changes"] == 0
    assert report["findings"] == []


def test_class_in_another_processed_file(tmp_path):
    src = _copy(tmp_path, "crossfile/run_pretraining.py", "crossfile/custom_opt.py")
    increment_line = _line_of(src / "run_pretraining.py", "global_step.assign_add(1)")
    report = _migrate(tmp_path, src)
    trainer = ast.parse((src / "run_pretraining.py").read_text())
    build = _function(trainer, "build_train_op")
    assert _step_updates(build) == []
    (apply,) = [
        c
        for c in ast.walk(build)
        if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "apply_gradients"
    ]
    assert [ast.unparse(k.value) for k in apply.keywords if k.arg == "global_step"] == [
        "global_step"
    ]
    opt_text = (src / "custom_opt.py").read_text()
    _assert_guarded_increment_before_return(
        _method(ast.parse(opt_text), "LambLike", "apply_gradients"), "updates"
    )
    # The inserted lines follow the file's tab indentation and single quotes.
    assert "\t\tif global_step is not None:\n" in opt_text
    assert (
        "\t\t\twith tf.control_dependencies(updates):\n\t\t\t\tnew_global_step = global_step + 1\n"
        in opt_text
    )
    assert "name='step_update'" in opt_text
    assert increment_line in {f["line"] for f in _findings(report, MOVE, "run_pretraining.py")}
    assert _findings(report, MOVE, "custom_opt.py")


def test_class_file_not_processed_is_left_for_review(tmp_path):
    src = _copy(tmp_path, "crossfile/run_pretraining.py", "crossfile/custom_opt.py")
    before = (src / "run_pretraining.py").read_bytes()
    report = _migrate(tmp_path, src, src / "run_pretraining.py")
    assert _step_updates(_function(ast.parse(before), "build_train_op"))
    assert (src / "run_pretraining.py").read_bytes().count(b"global_step.assign_add(1)") == 1
    assert _findings(report, MOVE, "run_pretraining.py") == []
    (warning,) = _findings(report, MANUAL, "run_pretraining.py")
    assert (
        "custom_opt" in warning["message"]
        and "not among the processed files" in (warning["message"])
    )


def test_increment_conditional_on_something_else_is_untouched(tmp_path):
    src = _copy(tmp_path, "negative/cond_other.py")
    before = _step_code(src / "cond_other.py")
    cond_line = _line_of(src / "cond_other.py", "tf.cond(is_training")
    report = _migrate(tmp_path, src)
    assert _step_code(src / "cond_other.py") == before
    (warning,) = _findings(report, MANUAL, "cond_other.py")
    assert warning["line"] == cond_line and warning["kind"] == "warning"
    assert "is_training" in warning["message"]
    assert _findings(report, MOVE, "cond_other.py") == []


def test_class_defined_elsewhere_is_untouched(tmp_path):
    src = _copy(tmp_path, "negative/external_class.py")
    before = _step_code(src / "external_class.py")
    report = _migrate(tmp_path, src)
    assert _step_code(src / "external_class.py") == before
    assert _findings(report, MOVE, "external_class.py") == []
    (warning,) = _findings(report, MANUAL, "external_class.py")
    assert "FancyOptimizer" in warning["message"] and "some_external_lib" in warning["message"]


def test_builtin_optimizer_and_already_moved_code_need_nothing(tmp_path):
    src = _copy(tmp_path, "negative/builtin_momentum.py", "negative/already_moved.py")
    before = {p.name: _step_code(p) for p in src.iterdir()}
    report = _migrate(tmp_path, src)
    assert {p.name: _step_code(p) for p in src.iterdir()} == before
    assert len(before["already_moved.py"]) > 3  # the check sees the existing guarded increment
    rules = {f["rule"] for f in report["findings"]}
    assert not rules & {MOVE, MANUAL}


def test_shared_class_moves_all_or_nothing(tmp_path):
    """One class used by a movable function and by one that is not: nothing changes anywhere."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "opt.py").write_text(SHARED_OPTIMIZER)
    body = (
        "    global_step = tf.train.get_or_create_global_step()\n"
        "    opt = tf.contrib.mixed_precision.LossScaleOptimizer(Shared(False, 's'), manager)\n"
        "    train_op = opt.minimize(loss)\n"
        "    new_global_step = {new}\n"
        "    train_op = tf.group(train_op, [global_step.assign(new_global_step)])\n"
        "    return train_op\n"
    )
    (src / "train.py").write_text(
        "import tensorflow as tf\nfrom opt import Shared\n\n\n"
        "def good(loss, manager):\n" + body.format(new="global_step + 1") + "\n\n"
        "def bad(loss, manager, flag):\n"
        + body.format(new="tf.cond(flag, lambda: global_step + 1, lambda: global_step)")
    )
    before = {p.name: _step_code(p) for p in src.iterdir()}
    report = _migrate(tmp_path, src)
    assert {p.name: _step_code(p) for p in src.iterdir()} == before
    assert report["summary"]["changes"] == sum(len(f["changes"]) for f in report["files"])
    assert not [f for f in report["findings"] if f["rule"] == MOVE]
    messages = [f["message"] for f in _findings(report, MANUAL, "train.py")]
    assert len(messages) == 2
    assert any(m.startswith("good ") and "bad" in m for m in messages)
    assert any(m.startswith("bad ") and "flag" in m for m in messages)


def test_class_shared_with_a_function_that_steps_without_loss_scaling(tmp_path):
    """A plain fp32 function advancing the step by hand through the same class keeps it unchanged:
    with the increment in the class, that function's step would advance twice."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "opt.py").write_text(FP16_STEPPER)
    # No loss-scale API in this file, and the optimizer is used without a name.
    (src / "finetune.py").write_text(FP32_STEPPER)
    before = {p.name: _step_code(p) for p in src.iterdir()}
    report = _migrate(tmp_path, src)
    assert {p.name: _step_code(p) for p in src.iterdir()} == before
    assert not [f for f in report["findings"] if f["rule"] == MOVE]
    (warning,) = _findings(report, MANUAL, "opt.py")
    assert warning["message"].startswith("fp16 ")
    assert "Shared is also used by fp32 (" in warning["message"]
    assert "finetune.py), which cannot be moved" in warning["message"]
    # The loss scaling itself is still ported.
    assert "NPULossScaleOptimizer(Shared(False, 'a'), manager)" in (src / "opt.py").read_text()


def _write(tmp_path: Path, name: str, code: str) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_text(code)
    return src


SCALED = (
    "import tensorflow as tf\n\n\n"
    "def build(loss, lr):\n"
    "    opt = tf.train.AdamOptimizer(lr)\n"
    "    manager = tf.contrib.mixed_precision.FixedLossScaleManager(8)\n"
    "    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)\n"
)


def test_optimizer_call_inside_the_group_still_gets_the_step(tmp_path):
    # `T = tf.group(opt.apply_gradients(gv), incr)` becomes `T = opt.apply_gradients(...)`: that
    # call must receive global_step too, or the step never advances again.
    src = _write(
        tmp_path,
        "grouped.py",
        SCALED.replace(
            "def build(loss, lr):\n",
            "def build(loss, lr):\n    global_step = tf.train.get_or_create_global_step()\n",
        )
        + "    gv = opt.compute_gradients(loss)\n"
        "    train_op = tf.group(opt.apply_gradients(gv), tf.assign_add(global_step, 1))\n"
        "    other = tf.group(opt.minimize(loss), global_step.assign_add(1))\n"
        "    return train_op, other\n",
    )
    report = _migrate(tmp_path, src)
    assert len(_findings(report, MOVE, "grouped.py")) >= 1
    assert _findings(report, MANUAL, "grouped.py") == []
    fn = _function(ast.parse((src / "grouped.py").read_text()), "build")
    assert _step_updates(fn) == []
    assigned = {n.targets[0].id: ast.unparse(n.value) for n in fn.body if isinstance(n, ast.Assign)}
    assert assigned["train_op"] == "opt.apply_gradients(gv, global_step=global_step)"
    assert assigned["other"] == "opt.minimize(loss, global_step=global_step)"


def test_optimizer_imported_from_tensorflow_python_training_is_a_tf_train_optimizer(tmp_path):
    # `from tensorflow.python.training import adam` names tf.train.AdamOptimizer's own class: its
    # apply_gradients advances the step given to it, so the move is the same as for
    # tf.train.AdamOptimizer (it was once warned as an optimizer defined nowhere the tool saw).
    src = _write(
        tmp_path,
        "internal_path.py",
        SCALED.replace(
            "import tensorflow as tf\n",
            "import tensorflow as tf\nfrom tensorflow.python.training import adam\n",
        )
        .replace(
            "def build(loss, lr):\n",
            "def build(loss, lr):\n    global_step = tf.train.get_or_create_global_step()\n",
        )
        .replace("tf.train.AdamOptimizer(lr)", "adam.AdamOptimizer(lr)")
        + "    train_op = opt.apply_gradients(opt.compute_gradients(loss))\n"
        "    return tf.group(train_op, tf.assign_add(global_step, 1))\n",
    )
    report = _migrate(tmp_path, src)
    assert _findings(report, MANUAL, "internal_path.py") == []
    assert len(_findings(report, MOVE, "internal_path.py")) >= 1
    fn = _function(ast.parse((src / "internal_path.py").read_text()), "build")
    assert _step_updates(fn) == []
    assigned = {n.targets[0].id: ast.unparse(n.value) for n in fn.body if isinstance(n, ast.Assign)}
    assert assigned["train_op"] == (
        "opt.apply_gradients(opt.compute_gradients(loss), global_step=global_step)"
    )


def test_step_passed_to_a_one_argument_per_line_call_gets_a_line_of_its_own(tmp_path):
    # `global_step=global_step` once went after `var_list=None, ` (a trailing space) on the
    # closing bracket's line when the call had one argument per line and no trailing comma.
    src = _write(
        tmp_path,
        "lines.py",
        SCALED.replace(
            "def build(loss, lr):\n",
            "def build(loss, lr):\n    global_step = tf.train.get_or_create_global_step()\n",
        )
        + "    train_op = opt.minimize(\n"
        "        loss,\n"
        "        var_list=None\n"
        "    )\n"
        "    train_op = tf.group(train_op, [global_step.assign_add(1)])\n"
        "    return train_op\n",
    )
    report = _migrate(tmp_path, src)
    assert len(_findings(report, MOVE, "lines.py")) >= 1
    assert _findings(report, MANUAL, "lines.py") == []
    ported = (src / "lines.py").read_text()
    assert (
        "    train_op = opt.minimize(\n"
        "        loss,\n"
        "        var_list=None,\n"
        "        global_step=global_step\n"
        "    )\n"
    ) in ported
    assert all(line == line.rstrip() for line in ported.splitlines())


def test_step_fetched_after_the_optimizer_call_is_left_with_a_warning(tmp_path):
    # Passing `gs` to minimize above its assignment would raise UnboundLocalError.
    src = _write(
        tmp_path,
        "late.py",
        SCALED + "    train_op = opt.minimize(loss)\n"
        "    gs = tf.train.get_global_step()\n"
        "    train_op = tf.group(train_op, [gs.assign(gs + 1)])\n"
        "    return train_op\n",
    )
    before = _step_code(src / "late.py")
    call_line = _line_of(src / "late.py", "opt.minimize(loss)")  # lines of the original file
    report = _migrate(tmp_path, src)
    assert _step_code(src / "late.py") == before
    (warning,) = _findings(report, MANUAL, "late.py")
    assert warning["line"] == call_line
    assert "`gs` is assigned only after `minimize`" in warning["message"]
    assert _findings(report, MOVE, "late.py") == []


def test_update_of_the_fetched_step_without_a_name_is_warned(tmp_path):
    src = _write(
        tmp_path,
        "unnamed.py",
        SCALED + "    train_op = opt.minimize(loss)\n"
        "    return tf.group(train_op, [tf.assign_add(tf.train.get_global_step(), 1)])\n",
    )
    before = (src / "unnamed.py").read_text()
    update_line = _line_of(src / "unnamed.py", "tf.assign_add(")
    report = _migrate(tmp_path, src)
    ported = (src / "unnamed.py").read_text()
    assert "tf.assign_add(tf.train.get_global_step(), 1)" in ported
    assert "global_step=" not in ported and ported != before  # only the loss scaling changed
    (warning,) = _findings(report, MANUAL, "unnamed.py")
    assert warning["line"] == update_line
    assert "`tf.train.get_global_step()` returns without naming it" in warning["message"]


def test_string_parameter_that_picks_the_optimizer_is_not_an_unknown_optimizer(tmp_path):
    # ALBERT's shape: `optimizer="adamw"` names the class to build; one of them lives in a sibling
    # module. Both classes gain the increment; the string parameter is no reason to refuse.
    src = tmp_path / "src"
    src.mkdir()
    (src / "shared_opt.py").write_text(SHARED_OPTIMIZER)
    (src / "optimization.py").write_text(
        "import tensorflow as tf\n"
        "import shared_opt\n\n\n"
        "def create_optimizer(loss, lr, optimizer='adamw'):\n"
        "    global_step = tf.train.get_or_create_global_step()\n"
        "    if optimizer == 'adamw':\n"
        "        optimizer = Local(lr)\n"
        "    elif optimizer == 'shared':\n"
        "        optimizer = shared_opt.Shared(False, 'shared')\n"
        "    else:\n"
        "        raise ValueError(optimizer)\n"
        "    manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
        "    optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, manager)\n"
        "    grads_and_vars = optimizer.compute_gradients(loss)\n"
        "    train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)\n"
        "    train_op = tf.group(train_op, [global_step.assign(global_step + 1)])\n"
        "    return train_op\n\n\n"
        "class Local(tf.train.Optimizer):\n"
        "    def __init__(self, lr):\n"
        "        super().__init__(False, 'local')\n"
        "        self.lr = lr\n\n"
        "    def apply_gradients(self, grads_and_vars, global_step=None, name=None):\n"
        "        ops = [v.assign_sub(self.lr * g) for g, v in grads_and_vars]\n"
        "        return tf.group(*ops, name=name)\n"
    )
    report = _migrate(tmp_path, src)
    assert [f for f in report["findings"] if f["rule"] == MANUAL] == []
    tree = ast.parse((src / "optimization.py").read_text())
    assert _step_updates(_function(tree, "create_optimizer")) == []
    _assert_guarded_increment_before_return(_method(tree, "Local", "apply_gradients"), "ops")
    shared = ast.parse((src / "shared_opt.py").read_text())
    _assert_guarded_increment_before_return(_method(shared, "Shared", "apply_gradients"), "ops")


def test_step_update_grouped_in_the_return_statement_moves_and_trains(tmp_path):
    # `return tf.group(opt.apply_gradients(gv), [global_step.assign_add(1)])`: the return keeps
    # the optimizer's op, which now gets the step; the class advances it on clean steps only.
    src = tmp_path / "src"
    shutil.copytree(FIXTURES.parent / "return_group", src)
    report = _migrate(tmp_path, src)
    assert [f for f in report["findings"] if f["kind"] == "warning"] == []
    tree = ast.parse((src / "optimization.py").read_text())
    create = _function(tree, "create_optimizer")
    assert _step_updates(create) == []
    assert ast.unparse(create.body[-1]) == (
        "return optimizer.apply_gradients(grads_and_vars, global_step=global_step)"
    )
    _assert_guarded_increment_before_return(_method(tree, "PlainSGD", "apply_gradients"), "updates")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    proc = subprocess.run(
        [sys.executable, "run_steps.py"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[True, 1], [False, 1], [True, 2]]


def test_two_workers_give_what_one_gives(tmp_path):
    """Workers finish a file the move edits on its own facts under its own plan; the result
    stands only where the project's plan holds the same for the file. Here BERT's
    optimization.py moves as it would alone, and opt.py would move alone but may not: another
    file advances the step by hand through its class in fp32."""
    src = _copy(tmp_path, "optimization.py")
    (src / "opt.py").write_text(FP16_STEPPER)
    (src / "finetune.py").write_text(FP32_STEPPER)
    for n in range(8):  # enough files for a pool of two workers
        (src / f"model_{n}.py").write_text(
            "import tensorflow as tf\n\n\n"
            "def build(opt):\n"
            f"    manager = tf.contrib.mixed_precision.FixedLossScaleManager({n + 1})\n"
            "    return tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)\n"
        )
    outputs = {}
    for jobs in ("1", "2"):
        out, report = tmp_path / f"out{jobs}", tmp_path / f"report{jobs}.json"
        proc = run_cli(src, "--output-dir", out, "--report", report, "-j", jobs, "--no-color")
        assert proc.returncode == 0, proc.stderr
        found = json.loads(report.read_text(encoding="utf-8"))
        files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*.py")}
        outputs[jobs] = (files, found["findings"], found["failed"])
    assert outputs["2"] == outputs["1"]
    files, findings, _ = outputs["2"]
    assert len(files) == 10
    moved = {f["path"].rsplit("/", 1)[-1] for f in findings if f["rule"] == MOVE}
    assert moved == {"optimization.py"}
    (manual,) = [f for f in findings if f["rule"] == MANUAL]
    assert manual["path"].endswith("opt.py") and "Shared is also used by fp32" in manual["message"]
