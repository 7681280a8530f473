"""Shapes the migrator met in real public training scripts, in fixtures written in their style.

Each test runs the real CLI. The Horovod-optional factory is then trained on one device, where a
literal `is_distributed=True` would raise at graph build (no Horovod to sum the flag with).
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

FIXTURES = MIGRATOR_FIXTURES
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"


def _python(
    cwd: Path, *args: str, python: str | Path = sys.executable
) -> subprocess.CompletedProcess[str]:
    """Run a ported script (or `-c` code) in a fresh process of `python` (this interpreter, or a
    stack's), with the library importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def optional_horovod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("hvd_src")
    out = tmp_path_factory.mktemp("hvd_out")
    for name in ("optimization.py", "run_single.py"):
        shutil.copy(FIXTURES / "horovod_optional" / name, src / name)
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--no-color")
    assert proc.returncode == 0, proc.stderr
    return out


def test_optional_horovod_gets_the_scripts_own_condition(optional_horovod: Path) -> None:
    code = (optional_horovod / "optimization.py").read_text()
    assert "is_distributed=hvd is not None and hvd.size() > 1" in code
    assert "tf.contrib" not in code


def test_optional_horovod_port_trains_on_one_device(optional_horovod: Path) -> None:
    proc = _python(optional_horovod, "run_single.py")
    assert proc.returncode == 0, proc.stderr[-4000:]
    clean, overflow, clean_again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert clean["w"] != [1.0, 2.0] and clean["global_step"] == 1
    assert overflow == clean  # skipped: weights and step exactly as before
    assert clean_again["global_step"] == 2 and clean_again["w"] != clean["w"]


@pytest.fixture(scope="module")
def keras_report(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("keras")
    shutil.copy(FIXTURES / "cases" / "keras_optimizers.py", root / "keras_optimizers.py")
    report = root / "report.json"
    proc = run_cli(root / "keras_optimizers.py", "--report", report, "--no-color")
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text(encoding="utf-8"))["findings"]


def test_keras_optimizers_go_to_the_keras_optimizer(keras_report: list[dict]) -> None:
    keras = {
        f["line"]
        for f in keras_report
        if f["kind"] == "change" and "npu_lossscale.keras.LossScaleOptimizer" in f["message"]
    }
    assert keras == {15, 20, 26}  # Keras Adam, Horovod-Keras over tf.optimizers, a Keras subclass
    assert not [f for f in keras_report if f["rule"] == "unported-api"]


def test_an_optimizer_of_unknown_kind_is_ported_with_a_warning(keras_report: list[dict]) -> None:
    unknown = {f["line"] for f in keras_report if f["rule"] == "optimizer-kind-unknown"}
    assert unknown == {36}  # a parameter; line 31's `opt` is visibly a v1 MomentumOptimizer


def test_true_without_hvd_init_in_the_file_is_flagged(keras_report: list[dict]) -> None:
    flagged = {f["line"] for f in keras_report if f["rule"] == "distributed-unverified"}
    assert flagged == {15, 20, 26, 31, 36}


def test_a_loss_scale_object_read_by_calling_it_is_ported_and_runs(tmp_path: Path) -> None:
    """`loss_scaler()` (to log the scale) no longer blocks the port: the NPU managers are
    callable like TensorFlow's LossScale objects, and the logged value is the scale in use."""
    shutil.copy(FIXTURES / "loss_scale_callable" / "train.py", tmp_path / "train.py")
    report = tmp_path / "report.json"
    proc = run_cli("--write", "--report", report, tmp_path / "train.py")
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert not [f for f in findings if f["kind"] == "warning"], findings
    code = (tmp_path / "train.py").read_text()
    assert "DynamicLossScale" not in code and "loss_scaler()" in code
    done = _python(tmp_path, "train.py")
    assert done.returncode == 0, done.stderr[-4000:]
    clean, overflow, clean_again = json.loads(done.stdout)
    assert (clean["global_step"], clean["scale"]) == (1, 1024.0)
    assert overflow["w"] == clean["w"] and overflow["global_step"] == 1
    assert overflow["scale"] == 512.0  # TF's DynamicLossScale halves on every overflow
    assert clean_again["global_step"] == 2


def test_a_compatible_subclass_is_rebased_and_works(tmp_path: Path) -> None:
    """Only a subclass that just configures the base through its __init__ is rebased; the
    rebased class builds and trains (the incompatible ones are left, see the unchanged fixtures)."""
    shutil.copy(FIXTURES / "cases" / "subclass.py", tmp_path / "subclass.py")
    assert run_cli("--write", tmp_path / "subclass.py").returncode == 0
    script = (
        "import numpy as np, tensorflow as tf\n"
        "import subclass\n"
        "from npu_lossscale import NPULossScaleOptimizer\n"
        "manager = subclass.WarmupLossScaleManager()\n"
        "w = tf.Variable([1.0, 2.0])\n"
        "opt = NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)\n"
        "for k in (1.0, np.inf):\n"
        "    opt.minimize(lambda: k * tf.reduce_sum(w * w), var_list=[w])\n"
        "assert subclass.is_managed(opt)\n"
        "print(float(manager.get_loss_scale()), w.numpy().tolist())\n"
    )
    done = _python(tmp_path, "-c", script)
    assert done.returncode == 0, done.stderr[-3000:]
    scale, weights = done.stdout.split(" ", 1)
    assert float(scale) == 128.0  # init 128; one clean step, then one overflow (2 needed to cut)
    assert json.loads(weights) == pytest.approx([0.8, 1.6])


def test_horovod_initialised_in_another_file_is_named_in_the_warning(tmp_path: Path) -> None:
    (tmp_path / "run_pretraining.py").write_text(
        "import horovod.tensorflow as hvd\n\nimport model\n\n\ndef main():\n    hvd.init()\n"
        "    model.build(1.0)\n"
    )
    (tmp_path / "model.py").write_text(
        "import tensorflow as tf\nimport horovod.tensorflow as hvd\n\n\n"
        "def build(loss):\n"
        "    manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
        "    opt = tf.contrib.mixed_precision.LossScaleOptimizer(\n"
        "        tf.train.AdamOptimizer(0.1), manager)\n"
        "    return opt.minimize(loss), hvd.rank()\n"
    )
    report = tmp_path / "report.json"
    assert run_cli(tmp_path, "--report", report).returncode == 0
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    (warning,) = [f for f in findings if f["rule"] == "distributed-unverified"]
    assert Path(warning["path"]).name == "model.py" and warning["line"] == 7
    assert "run_pretraining.py:7" in warning["message"]


def test_a_name_other_files_import_from_a_ported_module_stays_importable(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(
        "import tensorflow.compat.v1 as tf\n"
        "from tensorflow.contrib.mixed_precision import (ExponentialUpdateLossScaleManager,\n"
        "                                                LossScaleOptimizer)\n\n\n"
        "def wrap(opt):\n"
        "    return LossScaleOptimizer(opt, ExponentialUpdateLossScaleManager(2**15, 1000))\n"
    )
    (tmp_path / "train.py").write_text(
        "from utils import LossScaleOptimizer, wrap\n\nWRAPPER = LossScaleOptimizer\n"
    )
    report = tmp_path / "report.json"
    assert run_cli(tmp_path, "--write", "--report", report).returncode == 0
    rules = {f["rule"] for f in json.loads(report.read_text(encoding="utf-8"))["findings"]}
    assert "reexport" in rules
    assert (tmp_path / "train.py").read_text().startswith("from utils import LossScaleOptimizer")
    done = _python(tmp_path, "-c", "import train; print(train.WRAPPER.__name__)")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "NPULossScaleOptimizer"
    assert run_cli(tmp_path, "--check").returncode == 0  # a second run changes nothing


def test_an_optional_strategy_gives_has_strategy_and_one_device_builds(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "cases" / "strategy_optional.py", tmp_path / "strategy_optional.py")
    assert run_cli("--write", tmp_path / "strategy_optional.py").returncode == 0
    code = (tmp_path / "strategy_optional.py").read_text()
    assert "is_distributed=tf.distribute.has_strategy()" in code
    script = (
        "import tensorflow.compat.v1 as tf\n"
        "tf.disable_v2_behavior()\n"
        "import strategy_optional as s\n"
        "assert s.make_strategy(1) is None\n"
        "w = tf.get_variable('w', initializer=tf.constant([1.0, 2.0]))\n"
        "train = s.build(tf.reduce_sum(w * w))\n"
        "with tf.Session() as sess:\n"
        "    sess.run(tf.global_variables_initializer())\n"
        "    sess.run(train)\n"
        "    print(sess.run(w).tolist())\n"
    )
    done = _python(tmp_path, "-c", script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) != [1.0, 2.0]  # one device: built, trained, not distributed


def test_graph_rewrite_on_an_unseen_optimizer_follows_the_files_tf_generation(
    tmp_path: Path,
) -> None:
    """TF 2's enable_mixed_precision_graph_rewrite takes only Keras optimizers: in a file with no
    TF 1-only symbol (Keras reached only through compile and fit, or a tape loop) an optimizer
    built elsewhere goes to the Keras port, with a warning saying what was assumed, and the
    ported script trains; a TF 1 session script keeps the TF1 port, without that warning."""
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    proc = run_cli(
        FIXTURES / "optimizer_kind", "--output-dir", out, "--report", report, "--no-color"
    )
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    unknown = {
        (Path(f["path"]).name, f["line"])
        for f in findings
        if f["rule"] == "optimizer-kind-unknown" and f["kind"] == "warning"
    }
    assert unknown == {("tf2_compile.py", 11), ("tf2_loop.py", 10)}
    texts = {p.name: p.read_text(encoding="utf-8") for p in out.glob("*.py")}
    assert "from npu_lossscale.keras import LossScaleOptimizer" in texts["tf2_compile.py"]
    assert "from npu_lossscale.keras import LossScaleOptimizer" in texts["tf2_loop.py"]
    assert "NPULossScaleOptimizer(make_optimizer(FLAGS)" in texts["tf1_session.py"]
    # Keras 2 behind a local helper (TensorFlow Addons), or a tf.keras made Keras 2 by
    # TF_USE_LEGACY_KERAS: ported, the report saying which Keras each file assumed and why.
    assumed = {Path(f["path"]).name: f["message"] for f in findings if f["rule"] == "keras-version"}
    assert assumed["keras_helper.py"].startswith("Keras 2 assumed: line 19 uses `lamb(rate)`")
    assert "TF_USE_LEGACY_KERAS=1 (line 4)" in assumed["legacy_keras.py"]
    assert "LossScaleOptimizer(lamb(rate))" in texts["keras_helper.py"]
    assert "from npu_lossscale.keras.keras2 import LossScaleOptimizer" in texts["legacy_keras.py"]
    # a v1 optimizer wrapped by Horovod and then for loss scaling is seen as v1 through both
    assert "NPULossScaleOptimizer(" in texts["hvd_wrapped_v1.py"]
    (out / "zoo.py").write_text(
        "import keras\n\n"
        "def build_model(config):\n"
        "    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])\n\n"
        "def make_optimizer(config):\n"
        "    return keras.optimizers.SGD(0.1)\n",
        encoding="utf-8",
    )
    done = _python(
        out,
        "-c",
        "import types, numpy as np, tf2_compile\n"
        "data = (np.ones((8, 4), 'float32'), np.zeros((8,), 'int64'))\n"
        "model = tf2_compile.train(types.SimpleNamespace(epochs=1), data)\n"
        "print(type(model.optimizer).__module__, int(model.optimizer.iterations.numpy()))\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["npu_lossscale.keras.optimizer", "1"]


def test_estimator_shapes_strategy_from_a_helper_and_a_throwaway_rewrite(tmp_path: Path) -> None:
    """RunConfig(train_distribute=...) trains under a strategy however it was built, so the
    optimizer gets the strategy test; a graph rewrite whose result nothing reads (a prediction
    branch's throwaway) is left, warned: porting it would add loss-scale variables to the
    prediction graph that checkpoints trained elsewhere lack."""
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    proc = run_cli(
        FIXTURES / "estimator_shapes", "--output-dir", out, "--report", report, "--no-color"
    )
    assert proc.returncode == 0, proc.stderr
    ported = (out / "strategy_from_helper.py").read_text(encoding="utf-8")
    assert "is_distributed=tf.distribute.has_strategy()" in ported
    assert not (out / "eval_dummy_rewrite.py").exists()  # nothing changed there
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    (left,) = [
        f
        for f in findings
        if Path(f["path"]).name == "eval_dummy_rewrite.py" and f["rule"] == "graph-rewrite"
    ]
    assert left["line"] == 9 and "its result is unused" in left["message"]


def _one_step(cwd: Path, module: str, train_op: str) -> list[float]:
    """The weights after one step of the ported `module`'s `train_op` (an expression of `loss`)
    on loss = |w|^2 from w = [1, -2], in a graph on this TensorFlow."""
    step = (
        f"import tensorflow as tf; import {module}; tf.compat.v1.disable_eager_execution(); "
        "w = tf.compat.v1.get_variable('w', initializer=[1.0, -2.0]); "
        f"loss = tf.reduce_sum(w * w); op = {train_op}; s = tf.compat.v1.Session(); "
        "s.run(tf.compat.v1.global_variables_initializer()); s.run(op); print(s.run(w).tolist())"
    )
    done = _python(cwd, "-c", step)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


PARTLY_PORTED = """\
import tensorflow as tf

try:
    from npu_lossscale import NPULossScaleOptimizer
except ImportError:  # not installed: this file's contrib optimizer is used alone
    NPULossScaleOptimizer = None


def build(loss):
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**15, 2)
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)
    return opt.minimize(loss)
"""


def test_a_name_the_file_also_binds_to_none_is_not_reused_for_the_port(tmp_path: Path) -> None:
    """A file ported by hand in part imports our class under its own name, with None as the
    fallback: the contrib optimizer's port gets the class under an alias of its own, which
    nothing in the file rebinds, and builds and steps."""
    (tmp_path / "train.py").write_text(PARTLY_PORTED, encoding="utf-8")
    proc = run_cli("--write", tmp_path / "train.py")
    assert proc.returncode == 0, proc.stderr
    code = (tmp_path / "train.py").read_text()
    assert "NPULossScaleOptimizer as NpuLossScaleOptimizer" in code
    assert "opt = NpuLossScaleOptimizer(opt, manager)" in code
    assert "tf.contrib" not in code
    assert _one_step(tmp_path, "train", "train.build(loss)") == pytest.approx([0.8, -1.6])


TWO_OPTIMIZERS = """\
import tensorflow as tf


class Holder:
    def __init__(self, learning_rate):
        self.optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)


class GAN:
    def __init__(self, learning_rate):
        self.optimizer = tf.keras.optimizers.Adam(learning_rate)  # the generator's

    def discriminator_step(self, discriminator, loss):
        manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)
        opt = tf.contrib.mixed_precision.LossScaleOptimizer(discriminator.optimizer, manager)
        return opt.minimize(loss)
"""


def test_another_objects_optimizer_is_not_read_as_the_classs_own(tmp_path: Path) -> None:
    """`discriminator.optimizer` inside a class whose own `self.optimizer` is a Keras one is not
    that Keras optimizer: the contrib wrapper is ported (the kind said unknown, not refused as
    Keras), and the port steps the tf.compat.v1 optimizer it is handed."""
    (tmp_path / "trainer.py").write_text(TWO_OPTIMIZERS, encoding="utf-8")
    report = tmp_path / "report.json"
    proc = run_cli("--write", "--report", report, tmp_path / "trainer.py")
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert [f["rule"] for f in findings if f["kind"] == "warning"] == ["optimizer-kind-unknown"]
    code = (tmp_path / "trainer.py").read_text()
    assert "opt = NPULossScaleOptimizer(discriminator.optimizer, manager)" in code
    step = "trainer.GAN(0.1).discriminator_step(trainer.Holder(0.1), loss)"
    assert _one_step(tmp_path, "trainer", step) == pytest.approx([0.8, -1.6])


# Trains model.model_fn with an Estimator on this TensorFlow, under a MirroredStrategy over
# argv[1] CPU devices (the session's device_count makes them), and prints the trained values.
ESTIMATOR_RUN = """\
import json, sys, tempfile
import numpy as np
import tensorflow.compat.v1 as tf
import model

replicas = int(sys.argv[1])
devices = ["/cpu:%d" % i for i in range(replicas)]
config = tf.estimator.RunConfig(
    model_dir=tempfile.mkdtemp(),
    session_config=tf.ConfigProto(device_count={"CPU": replicas}),
    train_distribute=tf.distribute.MirroredStrategy(devices) if replicas > 1 else None,
)
estimator = tf.estimator.Estimator(model.model_fn, config=config, params={"lr": 0.1})

def input_fn():
    x = np.array([[1.0, 2.0]] * 8, np.float32)
    features = ({"x": x}, np.zeros(8, np.float32))
    return tf.data.Dataset.from_tensor_slices(features).repeat().batch(2)

estimator.train(input_fn, steps=3)
value = estimator.get_variable_value
print(json.dumps({"w": value("w").tolist(), "step": int(value("global_step"))}))
"""


@pytest.fixture(scope="module")
def strategy_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("strategy_elsewhere")
    out, report = root / "out", root / "report.json"
    proc = run_cli(
        FIXTURES / "strategy_elsewhere", "--output-dir", out, "--report", report, "--no-color"
    )
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(report.read_text(encoding="utf-8"))["findings"]


def test_a_file_a_strategy_file_imports_gets_the_strategy_test(strategy_elsewhere) -> None:
    """RetinaNet's shape: the strategy is built in the main file, the optimizer in the model
    file it imports; a file no strategy file imports is left without the keyword."""
    out, findings = strategy_elsewhere
    flag = "is_distributed=tf.distribute.has_strategy()"
    assert flag in (out / "model.py").read_text(encoding="utf-8")
    assert "is_distributed" not in (out / "single_device.py").read_text(encoding="utf-8")
    assert not (out / "train_main.py").exists()  # nothing to port there
    (why,) = [f["message"] for f in findings if f["kind"] == "change" and flag in f["message"]]
    assert why.endswith(
        "train_main.py, which imports this file, builds a tf.distribute strategy for some runs"
    )


@pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
def test_the_imported_model_fn_trains_on_one_and_on_two_replicas_on_tf115(
    strategy_elsewhere,
) -> None:
    """On TF 1.15 (reference variables) the Estimator trains the ported model_fn alone and under
    a MirroredStrategy of two devices, alike; without the keyword the library refuses the second
    at graph build (each replica would decide alone whether to skip a step)."""
    out, _ = strategy_elsewhere
    trained = []
    for replicas in ("1", "2"):
        proc = _python(out, "-c", ESTIMATOR_RUN, replicas, python=TF115)  # `import model` from out
        assert proc.returncode == 0, proc.stderr[-3000:]
        trained.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert trained[0]["step"] == trained[1]["step"] == 3
    assert trained[0]["w"] != [1.0, 2.0]
    assert trained[1]["w"] == pytest.approx(trained[0]["w"])


# Habana's BERT (MLPerf v1.0): Horovod through a proxy of the project's own, built on first use.
HOROVOD_HELPERS = """class _Hvd:
    _hvd = None

    def __getattr__(self, attr):
        if _Hvd._hvd is None:
            import horovod.tensorflow as hvd

            hvd.init()
            _Hvd._hvd = hvd
        return getattr(_Hvd._hvd, attr)


hvd = _Hvd()


def horovod_enabled():
    return _Hvd._hvd is not None and _Hvd._hvd.size() > 1
"""
PROXY_OPTIMIZATION = """import tensorflow as tf
from common.horovod_helpers import hvd, horovod_enabled


def create_optimizer(loss, lr):
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(lr)
    if horovod_enabled():
        optimizer = hvd.DistributedOptimizer(optimizer, sparse_as_dense=True)
    manager = tf.contrib.mixed_precision.FixedLossScaleManager(128)
    optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, manager)
    return optimizer.minimize(loss)
"""


def test_horovod_through_a_project_proxy_gives_the_scripts_condition(tmp_path: Path) -> None:
    """`hvd` from the project's horovod_helpers wraps under `if horovod_enabled():`: that is the
    condition (before, no keyword: the workers' skip decisions could drift apart), and on one
    device the port builds and trains without Horovod."""
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "common" / "horovod_helpers.py").write_text(HOROVOD_HELPERS, encoding="utf-8")
    (tmp_path / "optimization.py").write_text(PROXY_OPTIMIZATION, encoding="utf-8")
    assert run_cli("--write", tmp_path).returncode == 0
    ported = (tmp_path / "optimization.py").read_text(encoding="utf-8")
    assert "NPULossScaleOptimizer(optimizer, manager, is_distributed=horovod_enabled())" in ported
    trained = _one_step(tmp_path, "optimization", "optimization.create_optimizer(loss, 0.1)")
    assert trained == pytest.approx([0.8, -1.6])  # w - 0.1 * 2w, unscaled exactly
