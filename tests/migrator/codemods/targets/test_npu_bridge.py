"""`npu-migrate --target npu-bridge`: the same port, spelled for the Ascend adapter's own classes.

The adapter needs CANN, which no machine here has: the ported scripts run against a stand-in
`npu_bridge` (stub/, clearly not the adapter) that takes exactly the adapter's parameters,
records each construction and delegates to npu_lossscale, so the port is trained end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import json_lines

STUB = Path(__file__).parent / "stub"
LAMB = MIGRATOR_FIXTURES / "bert_lamb"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"


def _port(src: Path, out: Path, *flags: str) -> dict:
    report = out.parent / f"{out.name}.json"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report, *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text(encoding="utf-8"))


def _findings(report: dict, rule: str) -> list[dict]:
    return [c for f in report["files"] for c in f.get("changes", []) + f.get("warnings", [])
            if c["rule"] == rule]


@pytest.fixture(scope="module")
def lamb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    src = tmp_path_factory.mktemp("lamb_src")
    for name in ("optimization.py", "train_steps.py"):
        shutil.copy(LAMB / name, src / name)
    default = tmp_path_factory.mktemp("lamb_default") / "out"
    bridge = tmp_path_factory.mktemp("lamb_bridge") / "out"
    _port(src, default)
    return default, bridge, _port(src, bridge, "--target", "npu-bridge")


def test_the_port_is_the_default_ports_with_the_adapters_import(lamb) -> None:
    default, bridge, _ = lamb
    ported = (default / "optimization.py").read_text().splitlines()
    respelled = (bridge / "optimization.py").read_text().splitlines()
    ours = "from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer"
    assert ours in ported and "from npu_bridge.npu_init import *" in respelled
    assert [line if line != ours else "from npu_bridge.npu_init import *" for line in ported] == (
        respelled
    )


def test_the_report_says_what_changed(lamb) -> None:
    report = lamb[2]
    assert _findings(report, "target-npu-bridge")
    # The global-step move is reported as under the default target.
    assert len(_findings(report, "global-step-move")) >= 3


def _train(python: Path | str, tree: Path, configs: list[str]) -> tuple[dict, list]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(STUB)]),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    env.pop("INF_NAN_MODE_ENABLE", None)
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['train_steps.py', '3', *{configs!r}]\n"
        "runpy.run_path('train_steps.py', run_name='__main__')\n"
        "from npu_bridge import npu_init\n"
        "print(json.dumps(npu_init.CALLS))\n"
    )
    proc = subprocess.run(
        [str(python), "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-2])["results"], json.loads(lines[-1])


def test_the_respelled_port_trains_like_the_default_one(lamb) -> None:
    default, bridge, _ = lamb
    configs = ["lamb:resource:fp16", "adam:ref:fp16"]
    ours, _ = _train(sys.executable, default, configs)
    theirs, calls = _train(sys.executable, bridge, configs)
    assert theirs == ours
    # The adapter's classes were built, with the script's own manager settings, twice each.
    built = [c[0] for c in calls]
    assert built.count("ExponentialUpdateLossScaleManager") == 2
    assert built.count("NPULossScaleOptimizer") == 2
    assert ["ExponentialUpdateLossScaleManager", 1024.0, 1000, 2, 2, 0.5] in calls


@pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
def test_the_respelled_port_trains_on_tf115_with_reference_variables(lamb) -> None:
    default, bridge, _ = lamb
    ours, _ = _train(sys.executable, default, ["lamb:ref:fp16"])
    theirs, calls = _train(TF115, bridge, ["lamb:ref:fp16"])
    assert [r["global_step"] for r in theirs["lamb:ref:fp16"]] == [1, 2, 3]
    for mine, tf115 in zip(ours["lamb:ref:fp16"], theirs["lamb:ref:fp16"]):
        assert mine["weights"] == pytest.approx(tf115["weights"], rel=1e-5)
    assert calls


def test_the_output_compiles_as_python_37(lamb) -> None:
    if not TF115.exists():
        pytest.skip("no Python 3.7 interpreter (.venv-tf115, `make stack-venvs`)")
    bridge = lamb[1]
    proc = subprocess.run(
        [str(TF115), "-m", "py_compile", str(bridge / "optimization.py")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


SCALER_CALLED = """\
import tensorflow as tf


def build(loss, use_fp16):
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    if use_fp16:
        loss_scaler = tf.train.experimental.DynamicLossScale(
            initial_loss_scale=2**15, increment_period=1000, multiplier=2.0)
        opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(opt, loss_scaler)
        tf.identity(loss_scaler(), name="loss_scale")
    return opt.minimize(loss)
"""

PARTLY_PORTED = """\
import tensorflow as tf
from npu_lossscale import NPULossScaleOptimizer


def build(loss, opt):
    manager = tf.contrib.mixed_precision.FixedLossScaleManager(1024)
    opt = NPULossScaleOptimizer(opt, manager, overflow_mode="saturation")
    return opt.minimize(loss)
"""

DISTRIBUTED = """\
import tensorflow as tf


def build(loss, opt, workers):
    manager = tf.contrib.mixed_precision.FixedLossScaleManager(1024)
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)
    return opt.minimize(loss)
"""


def _one(tmp_path: Path, code: str, *flags: str) -> tuple[str, dict]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(code)
    report = _port(src, tmp_path / "out", "--target", "npu-bridge", *flags)
    return (tmp_path / "out" / "train.py").read_text(), report


def test_a_called_manager_reads_get_loss_scale(tmp_path: Path) -> None:
    text, report = _one(tmp_path, SCALER_CALLED)
    assert "from npu_bridge.npu_init import *" in text
    assert 'tf.identity(loss_scaler.get_loss_scale(), name="loss_scale")' in text
    assert "npu_lossscale" not in text
    assert any("get_loss_scale" in c["message"] for c in _findings(report, "target-npu-bridge"))


def test_an_argument_the_adapter_lacks_is_dropped_and_reported(tmp_path: Path) -> None:
    text, report = _one(tmp_path, PARTLY_PORTED)
    assert "opt = NPULossScaleOptimizer(opt, manager)" in text
    (lost,) = _findings(report, "target-npu-bridge-lost")
    assert "overflow_mode" in lost["message"] and lost["line"] == 7


def test_is_distributed_without_an_all_reduce_asks_for_the_vendors_wrapper(
    tmp_path: Path,
) -> None:
    text, report = _one(tmp_path, DISTRIBUTED, "--distributed", "always")
    assert "NPULossScaleOptimizer(opt, manager, is_distributed=True)" in text
    (wrapper,) = _findings(report, "target-npu-bridge-distributed")
    assert "npu_distributed_optimizer_wrapper" in wrapper["message"]


def test_horovods_own_all_reduce_needs_no_wrapper(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(MIGRATOR_FIXTURES / "add_loss_scale", src)
    report = _port(src, tmp_path / "out", "--target", "npu-bridge", "--add-loss-scale", "dynamic")
    hvd = (tmp_path / "out" / "train_hvd.py").read_text()
    assert "from npu_bridge.npu_init import *" in hvd and "is_distributed=" in hvd
    assert not _findings(report, "target-npu-bridge-distributed")


KERAS = """\
import tensorflow as tf


def build(strategy):
    with strategy.scope():
        opt = tf.keras.mixed_precision.LossScaleOptimizer(
            tf.keras.optimizers.Adam(1e-3), dynamic_growth_steps=1000)
    assert isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer)
    return opt
"""


def test_a_keras_port_targets_the_adapters_tf26_keras_class(tmp_path: Path) -> None:
    text, report = _one(tmp_path, KERAS, "--distributed", "always")
    assert "import npu_device as npu" in text and "npu_lossscale" not in text
    assert (
        "opt = npu.train.optimizer.NpuLossScaleOptimizer(\n"
        "            tf.keras.optimizers.Adam(1e-3), dynamic_growth_steps=1000)" in text
    )
    # The port's is_distributed=True is ours only: dropped, and said so.
    (lost,) = _findings(report, "target-npu-bridge-lost")
    assert "is_distributed" in lost["message"] and lost["line"] == 6
    # Keras's own class, which both ours and the adapter's subclass, stays as the script had it.
    assert "isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer)" in text
    # Nothing in the file pins Keras 2, and the adapter's class takes Keras 2 optimizers only.
    (keras_2,) = _findings(report, "target-npu-bridge-keras-2")
    assert "raises at start-up on a Keras 3 optimizer" in keras_2["message"]
    assert keras_2["kind"] == "warning"


@pytest.mark.parametrize(
    ("fixture", "what"),
    [(MIGRATOR_FIXTURES / "torch" / "cases" / "aliases.py", "npu_lossscale.torch")],
)
def test_a_file_needing_another_front_end_is_left_with_the_reason(
    tmp_path: Path, fixture: Path, what: str
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(fixture, src / fixture.name)
    default = _port(src, tmp_path / "default")
    assert what in (tmp_path / "default" / fixture.name).read_text()  # the default target ports it
    report = _port(src, tmp_path / "out", "--target", "npu-bridge")
    assert (tmp_path / "out" / fixture.name).read_bytes() == fixture.read_bytes()
    (warning,) = _findings(report, "target-npu-bridge-unsupported")
    assert what in warning["message"]
    assert not [c for f in report["files"] for c in f.get("changes", [])]
    assert default["summary"] != report["summary"]


def test_a_second_run_changes_nothing(lamb, tmp_path: Path) -> None:
    bridge = lamb[1]
    proc = run_cli(bridge / "optimization.py", "--check", "--target", "npu-bridge")
    assert proc.returncode == 0, proc.stdout + proc.stderr


KERAS_2 = MIGRATOR_FIXTURES / "keras2"
TF265 = Path(os.environ.get("NPU_TF265_PYTHON", REPO_ROOT / ".venv-tf265" / "bin" / "python"))
TRAIN_STEPS = ("1", "1", "inf", "1", "1")


def _keras_steps(python: Path, script: Path) -> list[dict]:
    """A Keras trainer's JSON step lines, the stand-in adapter on the path."""
    return json_lines(python, script.parent, str(script), *TRAIN_STEPS, extra_path=(str(STUB),))


@pytest.fixture(scope="module")
def keras2_bridge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    src = tmp_path_factory.mktemp("keras2_src")
    for name in ("legacy_env_trainer.py", "tf_keras_script.py"):
        shutil.copy(KERAS_2 / name, src / name)
    out = tmp_path_factory.mktemp("keras2_bridge") / "out"
    return src, out, _port(src, out, "--target", "npu-bridge")


def test_a_keras_2_port_names_the_adapters_keras_class(keras2_bridge) -> None:
    """Keras 2 pinned by TF_USE_LEGACY_KERAS (in a helper) or tf_keras: the default port imports
    npu_lossscale.keras.keras2; the adapter's npu_device class replaces it."""
    _, out, report = keras2_bridge
    for name in ("legacy_env_trainer.py", "tf_keras_script.py"):
        text = (out / name).read_text()
        assert "import npu_device as npu" in text and "npu_lossscale" not in text, name
    assert "npu.train.optimizer.NpuLossScaleOptimizer(sgd, dynamic=True, initial_scale=256, " \
        "dynamic_growth_steps=2)" in (out / "legacy_env_trainer.py").read_text()
    assert not _findings(report, "target-npu-bridge-unsupported")
    assert not _findings(report, "target-npu-bridge-keras-2")  # Keras 2 is pinned: no doubt


def test_the_respelled_keras_2_port_trains_like_the_original_on_tf_keras(keras2_bridge) -> None:
    pytest.importorskip("tf_keras")
    src, out, _ = keras2_bridge
    original = _keras_steps(Path(sys.executable), src / "legacy_env_trainer.py")
    port = _keras_steps(Path(sys.executable), out / "legacy_env_trainer.py")
    assert len(original) == len(port) == len(TRAIN_STEPS)
    for stock, mine in zip(original, port):
        assert mine["class"].startswith("npu_lossscale.keras.keras2.")  # through the stand-in
        assert (mine["w"], mine["iterations"], mine["scale"]) == (
            stock["w"], stock["iterations"], stock["scale"])


@pytest.mark.stacks
@pytest.mark.skipif(not TF265.exists(), reason=f"no TF 2.6.5 stack at {TF265} (make stack-venvs)")
def test_the_respelled_keras_2_port_trains_like_the_original_on_tf265(keras2_bridge) -> None:
    src, out, _ = keras2_bridge
    original = _keras_steps(TF265, src / "legacy_env_trainer.py")
    port = _keras_steps(TF265, out / "legacy_env_trainer.py")
    assert [(s["w"], s["iterations"], s["scale"]) for s in port] == [
        (s["w"], s["iterations"], s["scale"]) for s in original]
    assert port[2]["w"] == port[1]["w"]  # the overflowed step applied nothing


KERAS_3_OPS = """\
import keras


def build():
    opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    return opt, keras.ops.ones((2,))
"""


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (
            (MIGRATOR_FIXTURES / "keras" / "tf24_spellings.py").read_text(),
            "Keras 3's positional order",
        ),
        (KERAS_3_OPS, "Keras 3 (the file uses `keras.ops"),
    ],
)
def test_a_keras_3_file_has_no_adapter_class_and_is_left(
    tmp_path: Path, code: str, reason: str
) -> None:
    text, report = _one(tmp_path, code)
    assert text == code
    (warning,) = _findings(report, "target-npu-bridge-unsupported")
    assert reason in warning["message"]
    assert "npu.train.optimizer.NpuLossScaleOptimizer" in warning["message"]
