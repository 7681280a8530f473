"""The Keras port of `npu-migrate`, through the real CLI on the fixtures in fixtures/migrator/keras.

One CLI run ports every fixture into a tmp dir; the checks read the ported text (parsed with `ast`,
so layout does not matter) and the JSON report. One subprocess then trains the ported
`train_fit.py` under TensorFlow 2.21's Keras 3: model.fit through all three wrappers, and a
hand-written loop whose scale must follow TF's DynamicLossScale rule step for step.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, port_fixture_tree, run_cli

FIXTURES = MIGRATOR_FIXTURES / "keras"
OURS = "npu_lossscale.keras.optimizer.LossScaleOptimizer"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("keras_port")
    return port_fixture_tree(root, FIXTURES)


def _text(ported: dict, name: str) -> str:
    return (ported["out"] / name).read_text(encoding="utf-8")


def _calls(ported: dict, name: str, func: str) -> list[ast.Call]:
    """Calls of `func` (a name or a dotted attribute) in the ported file, in source order."""
    tree = ast.parse(_text(ported, name))
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == func]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _signature(call: ast.Call) -> tuple[list[str], dict[str, str]]:
    positional = [ast.unparse(a) for a in call.args]
    return positional, {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}


def _line(name: str, text: str) -> int:
    """The line of the original fixture where `text` first appears."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _found(ported: dict, name: str, kind: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for f in ported["findings"]:
        if Path(f["path"]).name == name and f["kind"] == kind:
            out.setdefault(f["line"], []).append(f)
    return out


def _imports(ported: dict, name: str) -> list[str]:
    tree = ast.parse(_text(ported, name))
    return [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_tf24_spellings_keep_their_arguments(ported: dict) -> None:
    name = "tf24_spellings.py"
    calls = [_signature(c) for c in _calls(ported, name, "LossScaleOptimizer")]
    assert calls == [
        (["adam"], {}),
        (["tf.keras.optimizers.SGD(learning_rate, momentum=0.9)"], {
            "initial_scale": "2 ** 12", "dynamic_growth_steps": "1000"}),
        (["adam"], {"dynamic": "False", "initial_scale": "fixed_scale"}),
        (["adam", "4096", "100"], {}),  # Keras 3's order is ours
        ([], {"inner_optimizer": "adam"}),  # Keras 2's None meant the default
    ]  # fmt: skip
    imports = _imports(ported, name)
    assert "from npu_lossscale.keras import LossScaleOptimizer" in imports
    # still used by set_global_policy, so it stays
    assert "from tensorflow.keras import mixed_precision" in imports
    assert "mixed_precision.LossScaleOptimizer" not in _text(ported, name)


def test_tf21_experimental_loss_scale_becomes_keywords(ported: dict) -> None:
    name = "tf21_experimental.py"
    calls = [_signature(c) for c in _calls(ported, name, "LossScaleOptimizer")]
    assert calls == [
        (["self.optimizer"], {}),  # with **(a run-time choice), below
        (["self.optimizer"], {}),  # loss_scale="dynamic" is the default rule
        ([], {"inner_optimizer": "tf.keras.optimizers.SGD(0.1)", "initial_scale": "1024",
              "dynamic": "False"}),
        (["tf.keras.optimizers.SGD(0.01)"], {"initial_scale": "2 ** 15",
              "dynamic_growth_steps": "500", "incr_ratio": "4.0", "decr_ratio": "0.25"}),
        (["tf.keras.optimizers.SGD(0.01)"], {"initial_scale": "64", "dynamic": "False"}),
    ]  # fmt: skip
    text = _text(ported, name)
    # a loss scale held in a variable: "dynamic" or a number, chosen when the script runs; on
    # one line it would pass the 119 columns the file keeps, so it is wrapped within them
    choice = (
        "LossScaleOptimizer(self.optimizer, **(\n"
        '                    {} if loss_scale_value == "dynamic"\n'
        '                    else {"initial_scale": loss_scale_value, "dynamic": False}))\n'
    )
    assert choice in text
    assert "DynamicLossScale(\n" not in text and "FixedLossScale" not in text
    # A DynamicLossScale object bound to a name is left, with its reason.
    warned = _found(ported, name, "warning")
    bound = _line(name, "LossScaleOptimizer(tf.keras.optimizers.SGD(0.01), scale)")
    assert "bound at line" in warned[bound][0]["message"]
    assert set(warned) == {bound}
    # the experimental module alias has no use left (the line left spells it out): removed
    assert not any("import experimental as mixed_precision" in i for i in _imports(ported, name))


def test_keras_graph_rewrite_is_ported_with_a_precision_warning(ported: dict) -> None:
    name = "graph_rewrite_keras.py"
    calls = [_signature(c) for c in _calls(ported, name, "LossScaleOptimizer")]
    assert calls == [
        ([], {"inner_optimizer": "opt"}),
        (["optimizer"], {"initial_scale": "128", "dynamic": "False"}),
        (["tf.keras.optimizers.SGD(0.1)"], {"initial_scale": "1024",
                                            "dynamic_growth_steps": "1000"}),
    ]  # fmt: skip
    assert "enable_mixed_precision_graph_rewrite" not in _text(ported, name)
    changes, warnings = _found(ported, name, "change"), _found(ported, name, "warning")
    for marker in ("(opt=opt)", "compat.v1.mixed_precision", "return tf.train.experimental"):
        line = _line(name, marker)
        assert any(f["rule"] == "graph-rewrite" for f in changes[line])
        assert "mixed_float16" in warnings[line][0]["message"]


def test_is_distributed_follows_the_tf1_decision(ported: dict) -> None:
    (hvd,) = _calls(ported, "horovod_keras.py", "LossScaleOptimizer")
    assert _signature(hvd)[1] == {"dynamic": "True", "is_distributed": "True"}
    # Under a tf.distribute strategy the Keras optimizer's default already reduces: nothing added.
    (mirrored,) = _calls(ported, "strategy_keras.py", "LossScaleOptimizer")
    assert _signature(mirrored) == (["optimizer"], {})
    (change,) = [
        f
        for found in _found(ported, "strategy_keras.py", "change").values()
        for f in found
        if f["rule"] == "keras-loss-scale-optimizer"
    ]
    assert "no is_distributed because" in change["message"]


def test_a_name_still_bound_to_keras_gets_an_alias(ported: dict) -> None:
    name = "own_name.py"
    imports = _imports(ported, name)
    assert "from tensorflow.keras.mixed_precision import LossScaleOptimizer" in imports
    alias = "from npu_lossscale.keras import LossScaleOptimizer as NPUKerasLossScaleOptimizer"
    assert alias in imports
    assert len(_calls(ported, name, "NPUKerasLossScaleOptimizer")) == 2
    assert "isinstance(optimizer, LossScaleOptimizer)" in _text(ported, name)
    # Keras 3's isinstance() holds for ours: no warning there; nor for the wrapped optimizer, a
    # parameter of unseen kind: ours takes the optimizers Keras's own wrapper of the same Keras
    # takes, so the port does not depend on it
    assert _found(ported, name, "warning") == {}


def test_an_import_left_unused_is_replaced(ported: dict) -> None:
    # `from tensorflow.keras.mixed_precision import LossScaleOptimizer` -> ours, same name
    assert _imports(ported, "same_name.py") == [
        "import tensorflow as tf",
        "from npu_lossscale.keras import LossScaleOptimizer",
    ]
    calls = [_signature(c)[1] for c in _calls(ported, "same_name.py", "LossScaleOptimizer")]
    assert calls == [{"initial_scale": "flags.loss_scale", "dynamic": "False"}] * 2
    # a module alias whose one use was ported goes too, and says so
    assert _imports(ported, "compile_override.py") == [
        "import tensorflow as tf",
        "from npu_lossscale.keras import LossScaleOptimizer",
    ]
    (call,) = _calls(ported, "compile_override.py", "LossScaleOptimizer")
    assert _signature(call) == (["tf.keras.optimizers.get(optimizer)"], {})
    removed = _found(ported, "compile_override.py", "change")[_line("compile_override.py", "mxp")]
    assert {f["rule"] for f in removed} == {"keras-import", "npu-import"}  # removed, added after


def test_keras_reached_through_a_module_alias_is_recognised(ported: dict) -> None:
    # `tfk = tf.keras`: the graph rewrite wraps a Keras Adam, so it goes to the Keras optimizer
    (call,) = _calls(ported, "module_alias.py", "LossScaleOptimizer")
    assert _signature(call) == (["optimizer"], {})
    assert "NPULossScaleOptimizer" not in _text(ported, "module_alias.py")


def test_an_existing_npu_import_is_reused(ported: dict) -> None:
    text = _text(ported, "partly_ported.py")
    assert text.count("import LossScaleOptimizer") == 1  # none added inside the functions
    assert len(_calls(ported, "partly_ported.py", "LossScaleOptimizer")) == 2


def test_module_style_file_gets_the_module_import(ported: dict) -> None:
    name = "module_style.py"
    assert "import npu_lossscale.keras" in _imports(ported, name)
    assert len(_calls(ported, name, "npu_lossscale.keras.LossScaleOptimizer")) == 1


def test_unmappable_wrappers_are_left_with_their_reasons(ported: dict) -> None:
    name = "left_alone.py"
    assert _text(ported, name) == (FIXTURES / name).read_text(encoding="utf-8")
    warned = _found(ported, name, "warning")
    # (Keras 2 scripts -- tf_keras, optimizers.legacy, the experimental wrapper -- are ported:
    # test_keras2_port.py)
    reasons = {
        "flags.dynamic_loss_scale)": "Keras 3",
        "enable_mixed_precision_graph_rewrite(tf.keras": "result is unused",
    }
    for marker, reason in reasons.items():
        (finding,) = warned[_line(name, marker)]
        assert reason in finding["message"], marker
    assert len(warned) == len(reasons)


def test_ported_files_compile_and_a_second_run_changes_nothing(ported: dict) -> None:
    for path in sorted(ported["out"].glob("*.py")):
        compile(path.read_bytes(), str(path), "exec")
    assert ported["again"].returncode == 0, ported["again"].stdout


def _python(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a ported script (or `-c` code) in a fresh process, with the library importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_ported_keras_script_trains(ported: dict) -> None:
    done = _python(ported["out"], "train_fit.py")
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["classes"] == [OURS] * 4
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert (result["fixed_scale"], result["fixed_dynamic"]) == (128.0, False)
    # TF's DynamicLossScale(256, increment_period=2, multiplier=4): x4 after two clean steps,
    # /4 on the overflow, which applies nothing.
    trace = result["trace"]
    assert [step["scale"] for step in trace] == [256.0, 1024.0, 256.0, 256.0]
    assert trace[2]["w"] == trace[1]["w"] and trace[3]["w"] != trace[2]["w"]


def test_a_mixed_float16_policy_without_a_loss_scale_optimizer_is_flagged(tmp_path: Path) -> None:
    """Under a global mixed_float16 policy Keras wraps the compiled optimizer in its own
    LossScaleOptimizer, which nothing in the file names: the warning says so and how to wrap
    it. Keras 3 is then checked to do exactly what the warning claims."""
    report = tmp_path / "report.json"
    proc = run_cli(FIXTURES.parent / "keras_policy", "--report", report, "--no-color")
    assert proc.returncode == 0, proc.stderr
    found = {
        (Path(f["path"]).name, f["line"]): f["message"]
        for f in json.loads(report.read_text(encoding="utf-8"))["findings"]
        if f["rule"] == "keras-implicit-loss-scale"
    }
    assert set(found) == {
        ("policy_fit.py", 7),
        ("policy_compile_positional.py", 5),  # model.compile(optimizer, loss), positionally
        ("policy_object.py", 5),
        ("policy_runtime.py", 7),
        ("policy_reexported.py", 4),  # keras re-exported by a project's own module
        ("policy_delegated.py", 9),  # an entry script training through its project's module
        ("policy_compiled_mixed.py", 8),  # one compile() of an optimizer Keras wraps
        # (policy_evaluate.py: an evaluation script, which never trains, is not warned, nor
        # policy_custom_loop.py, whose project's own train() is a custom loop;
        # policy_evaluate_compiled.py: nor where it compiles the model for its metrics only;
        # policy_tools_wrapped.py: nor where it imports the run's module that wraps it;
        # policy_compiled_wrapped.py: nor where every compile() gets an optimizer built there)
    }
    assert "chosen at run time" in found["policy_runtime.py", 7]
    assert "chosen at run time" not in found["policy_fit.py", 7]
    assert 'its `loss_scale="dynamic"`' in found["policy_object.py", 5]  # TF 2.1's Policy argument
    check = (
        "import json, keras\n"
        "from npu_lossscale.keras import LossScaleOptimizer\n"
        "keras.mixed_precision.set_global_policy('mixed_float16')\n"
        "def compiled(opt):\n"
        "    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
        "    m.compile(optimizer=opt, loss='mse')\n"
        "    return m.optimizer\n"
        "plain = compiled(keras.optimizers.SGD(0.1))\n"
        "ours = LossScaleOptimizer(keras.optimizers.SGD(0.1))\n"
        "print(json.dumps([type(plain).__module__, type(plain).__name__,"
        " compiled(ours) is ours]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    module, name, kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert name == "LossScaleOptimizer" and module.startswith("keras.")  # Keras's own
    assert kept is True


# The TF 2.0-2.3 official models' spelling (MLPerf v0.7's BERT and ResNet: modeling/performance.py)
COMPAT_V2 = """import tensorflow.compat.v2 as tf
from tensorflow.compat.v2.keras.mixed_precision import experimental as mixed_precision


def configure_optimizer(optimizer, use_float16=False, loss_scale="dynamic"):
  if use_float16:
    optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        optimizer, loss_scale=loss_scale)
  return optimizer


def wrap(optimizer):
  return mixed_precision.LossScaleOptimizer(optimizer, "dynamic")


def is_scaled(optimizer):
  return isinstance(optimizer, tf.keras.mixed_precision.experimental.LossScaleOptimizer)
"""


def test_tensorflow_compat_v2_names_are_tensorflows_own(tmp_path: Path) -> None:
    """`tensorflow.compat.v2` is TensorFlow's API under another name: its LossScaleOptimizer is
    ported, reached through the module alias or a from-import, and its isinstance test warned
    (before, the file was left silently with Keras's inf/NaN-only check)."""
    (tmp_path / "performance.py").write_text(COMPAT_V2, encoding="utf-8")
    report = tmp_path / "report.json"
    assert run_cli("--write", "--report", report, tmp_path).returncode == 0
    text = (tmp_path / "performance.py").read_text(encoding="utf-8")
    assert "from npu_lossscale.keras import LossScaleOptimizer" in text
    assert "return LossScaleOptimizer(optimizer)" in text
    assert "compat.v2.keras.mixed_precision import" not in text
    warned = [
        (f["line"], f["rule"])
        for f in json.loads(report.read_text(encoding="utf-8"))["findings"]
        if f["kind"] == "warning"
    ]
    assert warned == [(_line_in(COMPAT_V2, "isinstance("), "unported-api")]
    built = _python(
        tmp_path,
        "-c",
        "import keras, performance as p\n"
        "fixed = p.configure_optimizer(keras.optimizers.SGD(0.1), True, 128.0)\n"
        "dynamic = p.wrap(keras.optimizers.SGD(0.1))\n"
        "print(type(fixed).__module__, fixed.dynamic, float(fixed.initial_scale),"
        " dynamic.dynamic)\n",
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.split()[-4:] == ["npu_lossscale.keras.optimizer", "False", "128.0", "True"]


def _line_in(text: str, part: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if part in line)
