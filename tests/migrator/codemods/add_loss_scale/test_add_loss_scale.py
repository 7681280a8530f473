"""`npu-migrate --add-loss-scale`: a script that trained without loss scaling gets it, and trains.

The BERT-style fixture computes its gradients with `tf.gradients` and advances global_step by hand.
After the port its optimizer is wrapped, the gradients come from the wrapper's compute_gradients
(so the loss really is scaled: the fp16 loss of `run_train.py` has gradients that underflow to zero
unless it is) and the step advances inside the optimizer, once per applied step.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import MIGRATOR_FIXTURES, run_cli
from script_runs import run_json

FIXTURES = MIGRATOR_FIXTURES
FIXTURE = FIXTURES / "add_loss_scale"


def _port(tmp: Path, *flags: str) -> tuple[Path, dict]:
    src, out = tmp / "src", tmp / "out"
    shutil.copytree(FIXTURE, src)
    report = tmp / "report.json"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report, *flags)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(report.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _port(tmp_path_factory.mktemp("fixed"), "--add-loss-scale", "16384")


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return _port(tmp_path_factory.mktemp("dynamic"), "--add-loss-scale", "dynamic")


def _train(directory: Path, precision: str, pattern: str, *builder: str) -> list[dict]:
    return run_json(sys.executable, directory, "run_train.py", precision, pattern, *builder)["rows"]


def _findings(report: dict, name: str) -> list[dict]:
    return [f for f in report["findings"] if f["path"].endswith(name)]


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "src")
    proc = run_cli(tmp_path / "src", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_bad_value_is_refused_before_any_file_is_read(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "--add-loss-scale", "0.5")
    assert proc.returncode == 2
    assert "--add-loss-scale" in proc.stderr and "at least 1" in proc.stderr


def test_optimizer_wrapped_gradients_rewired_step_moved(fixed) -> None:
    out, report = fixed
    findings = _findings(report, "optimization.py")
    assert [f for f in findings if f["kind"] != "change"] == []
    rules = [f["rule"] for f in findings]
    assert rules.count("add-loss-scale") == 2  # the wrap and the gradients
    assert rules.count("global-step-move") == 2
    assert not any(r.startswith("contrib-") for r in rules)  # the user never wrote contrib code
    code = (out / "optimization.py").read_text(encoding="utf-8")
    assert "contrib" not in code
    assert "loss_scale_manager = FixedLossScaleManager(16384)" in code
    tree = ast.parse(code)
    create = next(n for n in tree.body if getattr(n, "name", "") == "create_optimizer")
    body = ast.unparse(create)
    assert "tf.gradients" not in body and "global_step.assign" not in body
    assert "optimizer.compute_gradients(loss, tvars)" in body
    # The increment joins the updates apply_gradients gets from its helper (a list, also after
    # `+=`), at its top level: never in the helper's per-variable loop.
    cls = next(n for n in tree.body if getattr(n, "name", "") == "DecoupledAdamOptimizer")
    apply = next(n for n in cls.body if getattr(n, "name", "") == "apply_gradients")
    helper = next(n for n in cls.body if getattr(n, "name", "") == "_updates")
    assert "global_step" not in ast.unparse(helper)
    (guard,) = [n for n in apply.body if isinstance(n, ast.If) and "global_step" in ast.unparse(n)]
    assert "assignments.extend([global_step.assign(new_global_step)])" in ast.unparse(guard)


def test_unported_fp16_loss_does_not_train(tmp_path: Path) -> None:
    # The control for the next test: unscaled, this loss's gradients underflow to zero.
    shutil.copytree(FIXTURE, tmp_path / "src")
    rows = _train(tmp_path / "src", "fp16", "c")
    assert [(r["applied"], r["global_step"]) for r in rows] == [(False, 1)]


def test_fixed_scale_trains_fp16_and_skips_the_overflow(fixed) -> None:
    rows = _train(fixed[0], "fp16", "ccocc")
    assert [r["applied"] for r in rows] == [True, True, False, True, True]
    assert [r["global_step"] for r in rows] == [1, 2, 2, 3, 4]


def test_dynamic_scale_has_the_seed_values_and_trains(dynamic) -> None:
    out, _ = dynamic
    raw = (out / "optimization.py").read_text(encoding="utf-8")
    # Laid out like the file's own code: the arguments four spaces past the statement.
    assert "\n  loss_scale_manager = ExponentialUpdateLossScaleManager(\n      init_loss" in raw
    code = " ".join(raw.split())
    assert (
        "ExponentialUpdateLossScaleManager( init_loss_scale=2**32, incr_every_n_steps=1000, "
        "decr_every_n_nan_or_inf=2, decr_ratio=0.5)" in code
    )
    rows = _train(out, "fp32", "coc")
    assert [r["applied"] for r in rows] == [True, False, True]
    assert [r["global_step"] for r in rows] == [1, 1, 2]
    # The first update used the learning rate of step 0: the moved increment runs after the
    # updates, which read global_step through the schedule (0.01 * (1 - step / 100)).
    moved = np.array(rows[0]["w"]) - _W0
    assert moved == pytest.approx(_first_adam_step(lr=0.01), rel=1e-4)
    assert moved != pytest.approx(_first_adam_step(lr=0.0099), rel=1e-3)  # step 1's rate


_W0 = np.array([0.5, -1.0, 2.0])


def _first_adam_step(lr: float) -> np.ndarray:
    """The fixture's first update by hand: clipped gradients of sum((w - 1)^2), one Adam step."""
    g = 2 * (_W0 - 1)
    g = g / max(1.0, float(np.linalg.norm(g)))
    m, v = 0.1 * g, 0.001 * g * g
    return -lr * m / (np.sqrt(v) + 1e-6)


def test_second_run_changes_nothing(dynamic) -> None:
    proc = run_cli(dynamic[0], "--add-loss-scale", "dynamic", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_optional_horovod_gets_the_scripts_condition(dynamic) -> None:
    out, report = dynamic
    code = (out / "train_hvd.py").read_text(encoding="utf-8")
    # Wrapped outside Horovod's optimizer, distributed exactly when the script uses Horovod.
    assert "hvd.DistributedOptimizer(optimizer)" in code
    assert (
        "NPULossScaleOptimizer(optimizer, loss_scale_manager, is_distributed=use_horovod)" in code
    )
    assert code.index("hvd.DistributedOptimizer") < code.index("NPULossScaleOptimizer(optimizer")
    assert [f for f in _findings(report, "train_hvd.py") if f["kind"] != "change"] == []
    # Without Horovod (not even installed here) it builds and trains on one worker.
    rows = _train(out, "fp32", "coc", "train_hvd")
    assert [(r["applied"], r["global_step"]) for r in rows] == [(True, 1), (False, 1), (True, 2)]


def test_keras_optimizer_is_left_and_reported(dynamic) -> None:
    out, report = dynamic
    assert (out / "train_keras.py").read_bytes() == (FIXTURE / "train_keras.py").read_bytes()
    (warning,) = _findings(report, "train_keras.py")
    assert warning["rule"] == "unported-api" and warning["line"] == 11
    assert "Keras optimizer" in warning["message"]


def test_a_script_that_scales_already_is_not_wrapped_twice(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(FIXTURES / "bert" / "optimization.py", src / "optimization.py")
    plain = run_cli(src / "optimization.py")
    flagged = run_cli(src / "optimization.py", "--add-loss-scale", "dynamic")
    assert plain.returncode == flagged.returncode == 0
    assert flagged.stdout == plain.stdout and "NPULossScaleOptimizer" in plain.stdout


def test_other_shapes(fixed) -> None:
    out, report = fixed
    code = (out / "shapes.py").read_text(encoding="utf-8")
    # A string parameter that picks the optimizer is not one; the imported class is wrapped too
    # (wrapped once, after the if/elif/else that builds either), with the keyword carried over.
    create = code[code.index("def create_optimizer") : code.index("class Trainer")]
    assert create.count("optimizer = NPULossScaleOptimizer(optimizer, loss_scale_manager)") == 1
    assert code.index('raise ValueError("unknown') < code.index("optimizer = NPULossScaleOptimizer")
    assert (
        "grads = [grad for grad, _ in optimizer.compute_gradients(\n"
        "      loss, tvars, colocate_gradients_with_ops=colocate)]" in code
    )
    # A module-level optimizer trained in a function is wrapped where it is built; a chained
    # constructor in place.
    assert "sgd = NPULossScaleOptimizer(sgd, loss_scale_manager)" in code
    assert (
        "NPULossScaleOptimizer(tf.train.MomentumOptimizer(0.1, 0.9), FixedLossScaleManager(16384))"
        ".minimize(loss)" in code
    )
    # An optimizer handed to a helper that trains it (slim's create_train_op) is wrapped too.
    helper = code[code.index("def helper_trained") :]
    assert "optimizer = NPULossScaleOptimizer(optimizer, loss_scale_manager)" in helper
    # What it cannot do is reported once each, at the user's line: an optimizer it cannot follow,
    # gradients taken before the optimizer exists, a tf.gradients argument with no counterpart.
    warnings = [f for f in _findings(report, "shapes.py") if f["kind"] == "warning"]
    assert [(w["rule"], w["line"]) for w in warnings] == [
        ("add-loss-scale-manual", 29),
        ("add-loss-scale-unscaled", 45),
        ("add-loss-scale-unscaled", 53),
    ]
    assert "self.optimizer.minimize" in warnings[0]["message"]
    assert "before the optimizer exists" in warnings[1]["message"]
    assert "tf.gradients(loss, tvars, gate_gradients=True)" in code  # left as it was


FLAT = """import json

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()
x = tf.placeholder(tf.float32, [None, 2])
w = tf.get_variable("w", initializer=[[1.0], [-2.0]])
loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
opt = tf.train.GradientDescentOptimizer(0.1)
grads = tf.gradients(loss, [w])
train_op = opt.apply_gradients(zip(grads, [w]))
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(2):
        sess.run(train_op, {x: np.ones((4, 2))})
    print(json.dumps(sess.run(w).ravel().tolist()))
"""


def test_a_flat_script_at_module_level_is_wrapped_and_trains_as_before(tmp_path: Path) -> None:
    """Its optimizer and gradients live in the module's scope, which has no node of its own:
    the port crashed there (an internal error, the file left) and now wraps it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "flat.py").write_text(FLAT, encoding="utf-8")
    (tmp_path / "orig.py").write_text(FLAT, encoding="utf-8")
    proc = run_cli("--write", "--add-loss-scale", "dynamic", "-j", "1", src)
    assert proc.returncode == 0, proc.stderr
    ported = (src / "flat.py").read_text(encoding="utf-8")
    assert "opt = NPULossScaleOptimizer(opt, loss_scale_manager)\n" in ported
    assert "grads = [grad for grad, _ in opt.compute_gradients(loss, [w])]\n" in ported
    ours = run_json(sys.executable, src, "flat.py")
    theirs = run_json(sys.executable, tmp_path, "orig.py")
    assert ours == theirs  # 2**32 scales and unscales exactly: the same two SGD steps
