"""Keras 2 scripts ported through the real CLI (fixtures in fixtures/migrator/keras2), then trained.

Which Keras a file runs decides the class the port names: `npu_lossscale.keras.LossScaleOptimizer`
(resolved to the Keras the process runs) where the Keras is the installed TensorFlow's, Keras 2's
class by its module where the file pins Keras 2 itself (tf_keras, TF_USE_LEGACY_KERAS set in a
helper, also one another file of the project defines: fixtures/migrator/keras2_project). The
report says which it assumed and why. The ported trainers are run next to the
unported originals, step by step (weights, iterations, scale, an overflowed step included): on
TF 2.21 with tf_keras, and on TF 2.6.5's Keras 2.6 (marked `stacks`; it drives that stack's
interpreter, the migrator itself needing Python 3.10+).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, port_fixture_tree, run_cli
from script_runs import json_lines

FIXTURES = MIGRATOR_FIXTURES / "keras2"
GENERIC = "from npu_lossscale.keras import LossScaleOptimizer"
KERAS_2 = "from npu_lossscale.keras.keras2 import LossScaleOptimizer"
# The TF 2.6.5 stack's interpreter (`make stack-venvs`); a work tree may name the main one's.
TF265 = Path(os.environ.get("NPU_TF265_PYTHON", REPO_ROOT / ".venv-tf265" / "bin" / "python"))
INF = "inf"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("keras2_port")
    return port_fixture_tree(root, FIXTURES)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A two-file project: trainers and the helpers (keras_env.py) that choose their Keras."""
    root = tmp_path_factory.mktemp("keras2_project")
    return port_fixture_tree(root, MIGRATOR_FIXTURES / "keras2_project")


def _text(ported: dict, name: str) -> str:
    return (ported["out"] / name).read_text(encoding="utf-8")


def _imports(ported: dict, name: str) -> list[str]:
    tree = ast.parse(_text(ported, name))
    return [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def _calls(ported: dict, name: str) -> list[tuple[list[str], dict[str, str]]]:
    tree = ast.parse(_text(ported, name))
    calls = sorted(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "LossScaleOptimizer"
        ),
        key=lambda n: n.lineno,
    )
    out = []
    for call in calls:
        keywords = {k.arg or "**": ast.unparse(k.value) for k in call.keywords}
        out.append(([ast.unparse(a) for a in call.args], keywords))
    return out


def _found(ported: dict, name: str, rule: str) -> dict[int, str]:
    return {
        f["line"]: f["message"]
        for f in ported["findings"]
        if Path(f["path"]).name == name and f["rule"] == rule
    }


def test_a_file_that_sets_tf_use_legacy_keras_in_a_helper_gets_keras_2s_class(ported) -> None:
    name = "legacy_env_trainer.py"
    assert KERAS_2 in _imports(ported, name)
    # Keras 2's positional order (dynamic second) passed by keyword, as both Keras read it
    assert _calls(ported, name) == [
        (["sgd"], {"dynamic": "True", "initial_scale": "256", "dynamic_growth_steps": "2"})
    ]
    (note,) = _found(ported, name, "keras-version").values()
    assert note.startswith("Keras 2 assumed: the file sets TF_USE_LEGACY_KERAS=1 (line 13)")


def test_tf_keras_pins_keras_2(ported) -> None:
    name = "tf_keras_script.py"
    assert KERAS_2 in _imports(ported, name)
    assert _calls(ported, name) == [
        (["optimizer"], {"dynamic": "False", "initial_scale": "1024"})
    ]
    (note,) = _found(ported, name, "keras-version").values()
    assert "tf_keras, Keras 2 as a package" in note


def test_the_change_says_what_runs_differently_and_only_what_was_done(ported) -> None:
    """A fixed scale is the one step the port runs differently (Keras 2 applies an overflowed
    step, ours skips it), so its finding says so; arguments are said to move only where some did."""
    (fixed,) = _found(ported, "tf_keras_script.py", "keras-loss-scale-optimizer").values()
    moved = "(Keras 2 positional arguments now by keyword; dynamic=False: an overflowed step is "
    assert moved in fixed
    assert "where Keras 2's fixed scale applies it" in fixed
    by_line = _found(ported, "addons_lamb.py", "keras-loss-scale-optimizer")
    assert "; where `dynamic` is false: an overflowed step is skipped" in by_line[8]
    assert by_line[12].endswith("-> npu_lossscale.keras.LossScaleOptimizer(...)")
    (alone,) = _found(ported, "handed_in_optimizer.py", "keras-loss-scale-optimizer").values()
    assert alone.endswith("-> npu_lossscale.keras.keras2.LossScaleOptimizer(...)")


def test_an_unseen_optimizer_is_warned_with_the_error_keras_2s_class_raises(ported) -> None:
    name = "handed_in_optimizer.py"
    assert KERAS_2 in _imports(ported, name)
    (warning,) = _found(ported, name, "optimizer-kind-unknown").values()
    assert "raises TypeError at start-up if this is a Keras 3 one or a tf.compat.v1 one" in warning
    # ...which is what the class raises: a Keras 3 optimizer, in this Keras 3 process
    probe = (
        "import keras\n"
        "from npu_lossscale.keras.keras2 import LossScaleOptimizer\n"
        "try:\n"
        "    LossScaleOptimizer(keras.optimizers.SGD())\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.stdout.split()[-1:] == ["TypeError"], done.stderr[-2000:]


def test_keras_2_optimizers_go_to_the_class_the_process_resolves(ported) -> None:
    """TensorFlow Addons and optimizers.legacy only run where the process is Keras 2: the generic
    class is Keras 2's there, and an ambiguous positional argument is Keras 2's `dynamic`."""
    name = "addons_lamb.py"
    assert GENERIC in _imports(ported, name)
    assert _calls(ported, name) == [
        (["inner"], {"dynamic": "dynamic"}),
        (["tf.keras.optimizers.legacy.Adam(rate)"], {}),
    ]
    (note,) = _found(ported, name, "keras-version").values()
    assert note.startswith("Keras 2 assumed: line 8 uses `inner`, a Keras 2 optimizer")
    assert not _found(ported, name, "optimizer-kind-unknown")


def test_the_experimental_wrapper_maps_its_loss_scale(ported) -> None:
    name = "experimental_trainer.py"
    assert GENERIC in _imports(ported, name)
    choice = (
        "{} if flags.loss_scale == 'dynamic' else "
        "{'initial_scale': flags.loss_scale, 'dynamic': False}"
    )
    assert _calls(ported, name) == [
        (["sgd"], {"initial_scale": "128", "dynamic_growth_steps": "2"}),
        (["sgd"], {"**": choice}),  # 'dynamic' or a number, chosen when the script runs
    ]
    # the choice is wrapped to the file's own line length (its longest line fits in 99)
    source = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    assert 88 < max(map(len, source)) <= 99
    assert max(map(len, _text(ported, name).splitlines())) <= 99
    note = _found(ported, name, "keras-version")
    assert "an API only Keras 2 has" in note[13]
    runtime = _found(ported, name, "keras-loss-scale-optimizer")[19]
    assert "'dynamic' or a number at run time" in runtime
    # the fixed scale a number picks skips an overflowed step, as a literal one does
    assert runtime.endswith("with a number, an overflowed step is skipped, as the NPU's "
                            "FixedLossScaleManager does, where Keras 2's fixed scale applies it)")


def test_nothing_pinned_means_either_keras(ported) -> None:
    name = "either_keras.py"
    assert GENERIC in _imports(ported, name)
    (note,) = _found(ported, name, "keras-version").values()
    assert note.startswith("Keras 2 or 3, whichever the installed TensorFlow ships")


def test_what_cannot_be_decided_is_left_with_its_reason(ported) -> None:
    assert _text(ported, "runtime_legacy_env.py") == (
        FIXTURES / "runtime_legacy_env.py"
    ).read_text(encoding="utf-8")
    (reason,) = _found(ported, "runtime_legacy_env.py", "keras-loss-scale-optimizer").values()
    assert "TF_USE_LEGACY_KERAS to a value chosen at run time (line 5)" in reason
    name = "experimental_left.py"
    left = _found(ported, name, "keras-loss-scale-optimizer")
    assert "'auto' is not a loss scale TF accepts" in left[6]
    assert "flags.scale_for(optimizer)" in left[7]
    assert "exists only in Keras 3, and the rest of the file runs Keras 2 (line 6 uses" in left[13]
    # in this Keras 2 file the new class's positional second argument is `dynamic`
    assert _calls(ported, name) == [(["optimizer"], {"dynamic": "flags.dynamic_loss_scale"})]
    (isinstance_test,) = _found(ported, name, "unported-api").values()
    assert "isinstance() test is false" in isinstance_test


def test_ported_files_compile_and_a_second_run_changes_nothing(ported) -> None:
    for path in sorted(ported["out"].glob("*.py")):
        compile(path.read_bytes(), str(path), "exec")
    assert ported["again"].returncode == 0, ported["again"].stdout


def _run(python: Path, script: Path, *args: str) -> list[dict]:
    return json_lines(python, script.parent, str(script), *args)


def _same_steps(original: list[dict], port: list[dict], ours: str) -> None:
    assert len(original) == len(port) > 0
    for stock, mine in zip(original, port):
        assert mine["class"].startswith(ours), mine["class"]
        assert not stock["class"].startswith("npu_lossscale")
        assert (mine["w"], mine["iterations"], mine["scale"]) == (
            stock["w"],
            stock["iterations"],
            stock["scale"],
        )


@pytest.mark.parametrize(
    ("tree", "script"), [("ported", "legacy_env_trainer.py"), ("project", "trainer.py")]
)
def test_a_legacy_env_trainer_trains_like_the_original_on_tf_keras(request, tree, script) -> None:
    """TF_USE_LEGACY_KERAS set by a helper of the file, or of another file of the project."""
    pytest.importorskip("tf_keras")
    ported = request.getfixturevalue(tree)
    factors = ("1", "1", INF, "1", "1")
    original = _run(Path(sys.executable), ported["src"] / script, *factors)
    port = _run(Path(sys.executable), ported["out"] / script, *factors)
    assert {s["keras"] for s in original + port} == {"tf_keras"}  # the helper's setting held
    _same_steps(original, port, "npu_lossscale.keras.keras2.")
    # the overflowed step applied nothing and halved the scale; iterations still advanced
    assert port[2]["w"] == port[1]["w"] and port[2]["scale"] == port[1]["scale"] / 2
    assert port[2]["iterations"] == 3


def test_a_helper_of_another_file_that_sets_tf_use_legacy_keras_pins_keras_2(project) -> None:
    name = "trainer.py"
    assert KERAS_2 in _imports(project, name)
    assert _calls(project, name) == [
        (["sgd"], {"dynamic": "True", "initial_scale": "256", "dynamic_growth_steps": "2"})
    ]
    (note,) = _found(project, name, "keras-version").values()
    assert note.startswith(
        "Keras 2 assumed: line 31 calls `ensure_keras_v2`, which sets TF_USE_LEGACY_KERAS=1 ("
    )
    assert "keras_env.py:7)" in note
    assert (project["out"] / "keras_env.py").read_bytes() == (
        project["src"] / "keras_env.py"
    ).read_bytes()
    assert project["again"].returncode == 0, project["again"].stdout


def test_a_helper_that_sets_it_in_a_branch_pins_nothing_and_the_report_says_so(project) -> None:
    name = "branch_trainer.py"
    assert GENERIC in _imports(project, name)
    (note,) = _found(project, name, "keras-version").values()
    assert note.startswith("Keras 2 or 3, whichever the installed TensorFlow ships")
    assert "line 8 calls `maybe_keras_v2`, which sets TF_USE_LEGACY_KERAS only in a branch" in note
    assert "keras_env.py:12)" in note


def test_a_helper_in_a_file_not_given_to_the_run_is_not_seen(project, tmp_path) -> None:
    """Only the files of the run are read: the trainer alone keeps the class resolved at import."""
    report = tmp_path / "report.json"
    out = tmp_path / "out"
    done = run_cli("--output-dir", out, "--report", report, project["src"] / "trainer.py")
    assert done.returncode == 0, done.stderr
    assert GENERIC in (out / "trainer.py").read_text(encoding="utf-8")
    (note,) = [
        f["message"]
        for f in json.loads(report.read_text())["findings"]
        if f["rule"] == "keras-version"
    ]
    assert note.startswith("Keras 2 or 3, whichever the installed TensorFlow ships")
    assert "ensure_keras_v2" not in note


@pytest.mark.stacks
@pytest.mark.skipif(not TF265.exists(), reason=f"no TF 2.6.5 stack at {TF265} (make stack-venvs)")
@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("legacy_env_trainer.py", ("1", "1", INF, "1", "1")),
        ("experimental_trainer.py", ("--loss_scale", "dynamic", "1", "1", INF, "1")),
        ("experimental_trainer.py", ("--inline", "1", "1", INF, "1", "1")),
        ("experimental_trainer.py", ("--loss_scale", "64", "1", "1", "1")),
    ],
)
def test_ported_trainers_train_like_the_originals_on_tf265(ported, script, args) -> None:
    original = _run(TF265, ported["src"] / script, *args)
    port = _run(TF265, ported["out"] / script, *args)
    _same_steps(original, port, "npu_lossscale.keras.keras2.")


@pytest.mark.stacks
@pytest.mark.skipif(not TF265.exists(), reason=f"no TF 2.6.5 stack at {TF265} (make stack-venvs)")
def test_a_fixed_scale_skips_the_overflow_that_keras_2_applies(ported) -> None:
    """The one documented difference: Keras 2's fixed scale applies an overflowed step (inf into
    the weights); ours skips it, as the NPU's FixedLossScaleManager does."""
    args = ("--loss_scale", "64", "1", INF, "1")
    original = _run(TF265, ported["src"] / "experimental_trainer.py", *args)
    port = _run(TF265, ported["out"] / "experimental_trainer.py", *args)
    assert not all(abs(x) < float("inf") for x in original[1]["w"])
    assert port[1]["w"] == port[0]["w"] and port[1]["scale"] == 64.0
    assert port[0] == {**original[0], "class": port[0]["class"]}
