"""Files that import a module of the run initialising Horovod (hok_env's apd_model.py, whose
gradients gradient_fusion.py all-reduces): the run-level fact, and the warning the port gives such
a file instead of an `is_distributed` it cannot write. Through the real CLI on real files."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import run_cli

from migrator.selection.horovod_importers import horovod_inits, importer_of

FUSION = """try:
    import horovod.tensorflow as hvd
    hvd.init()
    HAS_HVD = True
except ImportError:
    HAS_HVD = False
import tensorflow as tf


class GradientFusion(object):
    def run(self, gradvars):
        if not HAS_HVD or hvd.size() == 1:
            return gradvars
        return [(hvd.allreduce(g), v) for g, v in gradvars]
"""

MODEL = """import tensorflow.compat.v1 as tf
from {module} import GradientFusion


def build(loss):
    opt = tf.train.AdamOptimizer(1e-3)
    opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(opt)
    gradvars = GradientFusion().run(opt.compute_gradients(loss))
    return opt.apply_gradients(gradvars)
"""

ALONE = MODEL.replace("from {module} import GradientFusion\n", "").replace(
    "GradientFusion().run(opt.compute_gradients(loss))", "opt.compute_gradients(loss)"
)


def test_the_files_importing_an_initialising_module_are_found() -> None:
    files = [
        ("proj/fusion.py", FUSION.encode()),
        ("proj/model.py", MODEL.format(module="fusion").encode()),
        ("proj/pkg/model.py", MODEL.format(module="proj.fusion").encode()),
        ("proj/alone.py", ALONE.encode()),
        ("proj/other.py", MODEL.format(module="otherfusion").encode()),  # not of the run
        # another project of the run: its `fusion` is a module of its own folder, not proj's
        ("elsewhere/train.py", MODEL.format(module="fusion").encode()),
    ]
    paths = [path for path, _ in files]
    inits = horovod_inits([("proj/fusion.py", 3)], paths)
    assert inits is not None
    found = {path: importer_of(inits, path, data) for path, data in files}
    assert found == {
        "proj/fusion.py": None,  # the initialising file itself
        "proj/model.py": "proj/fusion.py:3",
        "proj/pkg/model.py": "proj/fusion.py:3",
        "proj/alone.py": None,
        "proj/other.py": None,
        "elsewhere/train.py": None,
    }
    assert horovod_inits([], paths) is None


def test_the_port_warns_where_the_gradients_may_be_all_reduced_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "fusion.py").write_text(FUSION, encoding="utf-8")
    (tmp_path / "model.py").write_text(MODEL.format(module="fusion"), encoding="utf-8")
    (tmp_path / "alone.py").write_text(ALONE, encoding="utf-8")
    report = tmp_path / "report.json"
    proc = run_cli(
        "--report",
        report,
        "-j",
        "1",
        tmp_path / "model.py",
        tmp_path / "alone.py",
        tmp_path / "fusion.py",
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(report.read_text(encoding="utf-8"))["findings"]
    elsewhere = [f for f in found if f["rule"] == "distributed-elsewhere"]
    assert [(Path(f["path"]).name, f["line"]) for f in elsewhere] == [("model.py", 7)]
    assert f"{tmp_path / 'fusion.py'}:3" in elsewhere[0]["message"]
    assert "is_distributed=hvd.size() > 1" in elsewhere[0]["message"]
    # the optimizer is ported all the same, with no is_distributed: the warning says why
    diff = proc.stdout
    assert "+    opt = NPULossScaleOptimizer(opt, ExponentialUpdateLossScaleManager(" in diff
    assert "is_distributed" not in diff
