"""`--add-loss-scale` where the optimizer a script trains differs by path, or comments mislead.

The fixture (tf1_shapes/accum_branch.py) trains a momentum optimizer directly by default and,
with accumulation on, through a plain accumulator object built around it in one branch. The
port must scale every path: the wrap goes where the momentum optimizer is built, before the
branch, never around the plain object (which NPULossScaleOptimizer rejects at start-up).

Each ported path is trained and compared step by step with the unported original (on TF 2.21
through tf.compat.v1, and on TF 1.15 where its venv is built): clean steps give the original's
weights and global_step exactly (the scale is a power of two), an overflowed step changes
nothing, and the second overflow halves the scale (the dynamic manager's hysteresis of 2).

Comments decide nothing: a commented-out graph rewrite (commented_rewrite.py) does not make the
file look already scaled, and a commented-out `tf.keras` line (commented_keras.py) does not make
an optimizer of the project's own class look like a possible Keras one. Both are wrapped and
trained against their originals the same way.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json

FIXTURE = MIGRATOR_FIXTURES / "tf1_shapes"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
PYTHONS = [
    pytest.param(sys.executable, id="tf2.21"),
    pytest.param(
        str(TF115),
        id="tf1.15",
        marks=pytest.mark.skipif(not TF115.exists(), reason="the TF 1.15 stack is not built"),
    ),
]


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("paths")
    src, out, report = tmp / "src", tmp / "out", tmp / "report.json"
    shutil.copytree(FIXTURE, src)
    flags = ("--copy-unchanged", "--report", report, "--add-loss-scale", "dynamic")
    proc = run_cli(src, "--output-dir", out, *flags)
    assert proc.returncode == 0, proc.stderr
    return src, out, json.loads(report.read_text(encoding="utf-8"))


def train(python: str, tree: Path, builder: str, pattern: str) -> list[dict]:
    return run_json(python, tree, "run_steps.py", builder, pattern)["rows"]


def test_wrapped_where_the_optimizer_is_built_before_the_branch(ported) -> None:
    _, out, report = ported
    findings = [f for f in report["findings"] if f["path"].endswith("accum_branch.py")]
    assert [f for f in findings if f["kind"] != "change"] == []
    assert [f["rule"] for f in findings].count("add-loss-scale") == 1
    tree = ast.parse((out / "accum_branch.py").read_text(encoding="utf-8"))
    create = next(n for n in tree.body if getattr(n, "name", "") == "create_optimizer")
    statements = [ast.unparse(s) for s in create.body]
    wrap = statements.index("optimizer = NPULossScaleOptimizer(optimizer, loss_scale_manager)")
    branch = next(i for i, s in enumerate(statements) if s.startswith("if accum_steps > 1"))
    assert statements[wrap - 2].startswith("optimizer = tf.train.MomentumOptimizer(")
    assert wrap < branch
    assert "NPULossScaleOptimizer" not in statements[branch]


@pytest.mark.parametrize("python", PYTHONS)
def test_default_path_trains_like_the_original_and_skips_overflows(ported, python) -> None:
    src, out, _ = ported
    original = train(python, src, "accum1", "ccccc")
    rows = train(python, out, "accum1", "ccoccoc")
    clean = [r for r, letter in zip(rows, "ccoccoc") if letter == "c"]
    assert [(r["w"], r["global_step"]) for r in clean] == [
        (r["w"], r["global_step"]) for r in original
    ]
    assert rows[2]["w"] == rows[1]["w"] and rows[2]["global_step"] == 2
    assert rows[5]["w"] == rows[4]["w"] and rows[5]["global_step"] == 4
    assert [r["scale"] for r in rows] == [2.0**32] * 5 + [2.0**31] * 2


@pytest.mark.parametrize("python", PYTHONS)
def test_accumulation_path_builds_trains_like_the_original_and_skips(ported, python) -> None:
    src, out, _ = ported
    original = train(python, src, "accum2", "cccc")
    # Micro-batches 3 and 4 hold an overflow: their mean is not applied, the rest is as unported.
    rows = train(python, out, "accum2", "cccocc")
    assert rows[1]["w"] == original[1]["w"] and rows[1]["global_step"] == 1
    assert rows[3]["w"] == rows[1]["w"] and rows[3]["global_step"] == 1
    assert rows[5]["w"] == original[3]["w"] and rows[5]["global_step"] == 2
    assert all(r["scale"] == 2.0**32 for r in rows)


@pytest.mark.parametrize("name", ["commented_rewrite", "commented_keras"])
def test_commented_out_code_decides_nothing(ported, name) -> None:
    _, out, report = ported
    findings = [f for f in report["findings"] if f["path"].endswith(f"{name}.py")]
    assert [f for f in findings if f["kind"] != "change"] == []
    assert [f["rule"] for f in findings].count("add-loss-scale") == 1
    code = (out / f"{name}.py").read_text(encoding="utf-8")
    assert "optimizer = NPULossScaleOptimizer(optimizer, loss_scale_manager)" in code


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", ["commented_rewrite", "commented_keras"])
def test_commented_out_code_files_train_like_the_original(ported, name, python) -> None:
    src, out, _ = ported
    original = train(python, src, name, "ccc")
    rows = train(python, out, name, "ccocoo")
    assert original[-1]["global_step"] == 3
    clean = [r for r, letter in zip(rows, "ccocoo") if letter == "c"]
    assert [(r["w"], r["global_step"]) for r in clean] == [
        (r["w"], r["global_step"]) for r in original
    ]
    assert rows[2]["w"] == rows[1]["w"] and rows[2]["global_step"] == 2
    assert rows[5]["w"] == rows[4]["w"] == rows[3]["w"] and rows[5]["global_step"] == 3
    assert [r["scale"] for r in rows] == [2.0**32] * 4 + [2.0**31] * 2
