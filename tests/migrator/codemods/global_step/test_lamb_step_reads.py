"""An optimizer that reads global_step inside apply_gradients (LAMB's bias correction), ported.

NVIDIA's BERT advances the step outside the optimizer and its LAMB divides by `1 - beta**step`.
Under TF 1.15, where those scripts were written, the read sees the step being made (1 on the first
step); read before the increment it is 0 and every weight becomes NaN (what the unported script
does on TF 2.21). After the move the read must see `global_step + 1` deterministically, and the
learning-rate schedule outside the optimizer the value from before the step.

The expected weights come from LAMB and AdamW written out with numpy below, not from a run of the
code under test; where the TF 1.15 stack is installed (.venv-tf115, built by `make test`) the
unported script trained there must give the same numbers, which shows that the numpy reference is
what the original did.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json

FIXTURE = MIGRATOR_FIXTURES / "bert_lamb"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
STEPS = 3
CONFIGS = [
    f"{opt}:{variables}:{precision}"
    for opt in ("lamb", "adam")
    for variables in ("ref", "resource")
    for precision in ("fp32", "fp16")
]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = tmp_path_factory.mktemp("lamb_src")
    out = tmp_path_factory.mktemp("lamb_out")
    for name in ("optimization.py", "train_steps.py"):
        shutil.copy(FIXTURE / name, src / name)
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged")
    assert proc.returncode == 0, proc.stderr
    return src, out


def _train(python: Path | str, tree: Path, configs: list[str]) -> dict:
    return run_json(python, tree, "train_steps.py", str(STEPS), *configs)["results"]


def _reference(optimizer_type: str) -> list[list[float]]:
    """The fixture's model and optimizers in numpy: step t reads the learning rate at t - 1 and,
    for LAMB, bias-corrects with t."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 4), rng.randn(16, 1)
    w = rng.randn(4, 1).astype(np.float32).astype(np.float64)
    b = np.array([0.5])
    x = x.astype(np.float32).astype(np.float64)
    y = y.astype(np.float32).astype(np.float64)
    params = {"kernel": w, "bias": b}
    slots = {k: (np.zeros_like(p), np.zeros_like(p)) for k, p in params.items()}
    beta_1, beta_2, eps, decay = 0.9, 0.999, 1e-6, 0.01
    rows = []
    for t in range(1, STEPS + 1):
        lr = 1e-2 * (1.0 - (t - 1) / 10**9)
        residual = x @ params["kernel"] + params["bias"] - y
        grads = {
            "kernel": 2.0 / 16 * x.T @ residual,
            "bias": 2.0 / 16 * residual.sum(axis=0),
        }
        norm = np.sqrt(sum(float(np.sum(g**2)) for g in grads.values()))
        grads = {k: g / max(norm, 1.0) for k, g in grads.items()}
        for key, p in params.items():
            m, v = slots[key]
            m = beta_1 * m + (1 - beta_1) * grads[key]
            v = beta_2 * v + (1 - beta_2) * grads[key] ** 2
            slots[key] = (m, v)
            if optimizer_type == "lamb":
                update = (m / (1 - beta_1**t)) / (np.sqrt(v / (1 - beta_2**t)) + eps)
            else:
                update = m / (np.sqrt(v) + eps)
            if key == "kernel":  # "bias" is excluded from weight decay
                update = update + decay * p
            ratio = 1.0
            if optimizer_type == "lamb":
                w_norm, u_norm = np.linalg.norm(p), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[key] = p - ratio * lr * update
        rows.append(params["kernel"].ravel().tolist() + params["bias"].tolist())
    return rows


def _assert_trains_like_reference(results: dict) -> None:
    for config, rows in results.items():
        expected = _reference(config.split(":")[0])
        assert [r["global_step"] for r in rows] == list(range(1, STEPS + 1)), config
        # float32 LAMB: 1 - 0.999**2 loses about 3e-5 of its value to cancellation
        np.testing.assert_allclose(
            [r["weights"] for r in rows], expected, rtol=1e-4, atol=1e-6, err_msg=config
        )


def test_reads_in_the_update_read_the_advanced_step(trees: tuple[Path, Path]) -> None:
    tree = ast.parse((trees[1] / "optimization.py").read_text())
    lamb = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LAMBOptimizer")
    apply = next(
        n for n in lamb.body if isinstance(n, ast.FunctionDef) and n.name == "apply_gradients"
    )
    code = ast.unparse(apply)
    assert "steps = tf.cast(new_global_step, tf.float32)" in code
    assert "new_global_step = tf.identity(global_step + 1, name='step_update')" in code
    reads = [n for n in ast.walk(apply) if isinstance(n, ast.Name) and n.id == "global_step"]
    # What still names global_step: its two `is not None` tests, `global_step + 1`, the assign.
    assert len(reads) == 4
    adam = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AdamWeightDecayOptimizer"
    )
    assert "new_global_step" in ast.unparse(adam)  # advanced there too, by the plain template


def test_ported_script_trains_like_the_reference_on_this_tensorflow(
    trees: tuple[Path, Path],
) -> None:
    _assert_trains_like_reference(_train(sys.executable, trees[1], CONFIGS))


def test_unported_lamb_reads_the_old_step_on_tensorflow_2(trees: tuple[Path, Path]) -> None:
    """The failure the move must not carry over: run unported on TF 2, LAMB writes NaN."""
    results = _train(sys.executable, trees[0], ["lamb:resource:fp32"])
    assert all(np.isnan(r["weights"]).all() for r in results["lamb:resource:fp32"])


@pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
def test_unported_script_on_tf115_is_the_reference_or_its_race(trees: tuple[Path, Path]) -> None:
    """The original's fp32 run on TF 1.15's default reference variables. Its read of the step in
    LAMB is unordered with the assignment outside: in most runs it sees the step being made and
    trains exactly like the reference, but not always (2 of 16 runs on a loaded machine read 0
    and wrote NaN). So every run is the reference or all NaN, nothing else; the port, which
    writes the order out, is the reference every time (the tests above and below)."""
    results = _train(TF115, trees[0], ["lamb:ref:fp32", "adam:ref:fp32"])
    for config, rows in results.items():
        if config.startswith("lamb") and np.isnan([r["weights"] for r in rows]).all():
            continue  # the race lost: the read saw the old step
        _assert_trains_like_reference({config: rows})


@pytest.mark.skipif(
    not TF115.exists(), reason="the TF 1.15 stack (.venv-tf115, `make stack-venvs`) is not built"
)
def test_ported_script_on_tf115_trains_like_the_reference(trees: tuple[Path, Path]) -> None:
    """Where the scripts were written: TF 1.15, reference variables, with and without fp16."""
    _assert_trains_like_reference(
        _train(TF115, trees[1], ["lamb:ref:fp32", "lamb:ref:fp16", "adam:ref:fp16"])
    )
