"""`is_distributed=` for three ways scripts hold Horovod (issue 23, items 6-8), ported and trained.

- hvd_param.py: Horovod handed in as a parameter without a default, the function testing it
  against None itself (callers pass `hvd if use_horovod else None`): the port keeps that guard.
- hvd_count.py: the worker count kept in a variable and tested as a flag (`is_mpi = hvd.size()`,
  `if is_mpi:`): the port passes a flag (`is_mpi > 1`), never the count.
- hvd_optional.py: `try: import horovod.tensorflow as hvd / except ImportError: hvd = None`: the
  port keeps the guard the optimizer is wrapped under, `hvd is not None` (never a bare True).
- hvd_initialized.py: the optional import, and the optimizer wrapped only where Horovod was
  initialised elsewhere (Habana's BERT): the port keeps that guard, never `hvd.size()` (which
  raises on an installed Horovod nobody initialised; trained that way too).
- hvd_count_param.py: the flag is a parameter with a number for default, handed the worker count
  (IntelAI's BERT): the port passes `bool(...)`, since the library refuses a count of 2; of the
  wrapper's guard `use_multi_cpu and (accum_steps == 1)` only the Horovod part (with accumulation
  the script all-reduces by hand, and the workers' overflow flags must still be summed).
- hvd_lazy.py: `hvd = LazyImport("horovod.tensorflow")`, a helper of the script's own: Horovod
  all the same (the condition under which it wraps the optimizer), and the
  `tensorflow.compat.v1.train.MomentumOptimizer` that wrapper holds (in a file that also uses
  Keras) is a tf.compat.v1 optimizer: no optimizer-kind-unknown.

Each ported file is trained with no Horovod (hvd None, or not importable), with the single-worker
stand-in (benchmarks/realcode/stubs) and with the stand-in reporting two workers (so the
multi-worker condition is taken; its all-reduce is the identity of one process), and compared
step by step with the unported original: on TF 2.21 with the original's fp32 path (tf.contrib is
gone there) for clean steps, on TF 1.15 with the original's own contrib loss scaling for every
step, overflows included.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json

FIXTURE = MIGRATOR_FIXTURES / "tf1_shapes"
STUBS = REPO_ROOT / "benchmarks" / "realcode" / "stubs"
TF115 = REPO_ROOT / ".venv-tf115" / "bin" / "python"
EXPECTED = {
    "hvd_param": "hvd is not None and hvd.size() > 1",
    "hvd_count": "is_mpi > 1",
    "hvd_optional": "hvd is not None",
    "hvd_initialized": "hvd is not None and hvd.is_initialized()",
    "hvd_count_param": "bool(use_multi_cpu)",
    "hvd_lazy": "use_horovod",
}
# (module, workers): "none" runs without Horovod (hvd None; hvd_optional without the stand-in, so
# its import fails; hvd_count imports Horovod unconditionally and so always needs it).
RUNS = [(m, w) for m in EXPECTED for w in ("none", "1", "2")] + [("hvd_initialized", "uninit")]


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("hvd")
    src, out, report = tmp / "src", tmp / "out", tmp / "report.json"
    shutil.copytree(FIXTURE, src)
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged", "--report", report)
    assert proc.returncode == 0, proc.stderr
    return src, out, json.loads(report.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def train() -> Callable[..., list[dict]]:
    """`train(python, tree, module, workers, precision, pattern)`: the rows of that run. Every
    run of RUNS with one interpreter, tree, precision and pattern is made in one process, the
    first time one of them is asked for (run_steps.py --each: each in a new graph, with the
    fixture's modules and Horovod imported afresh)."""
    batches: dict[tuple[str, Path, str, str], dict[str, list[dict]]] = {}

    def rows(
        python: str, tree: Path, module: str, workers: str, precision: str, pattern: str = "cocc"
    ) -> list[dict]:
        key = (python, tree, precision, pattern)
        if key not in batches:
            builders = [f"{m}:{w}:{precision}" for m, w in RUNS]
            args = ("run_steps.py", "--each", pattern, *builders)
            batches[key] = run_json(python, tree, *args, extra_path=(str(STUBS),))["runs"]
        return batches[key][f"{module}:{workers}:{precision}"]

    return rows


@pytest.mark.parametrize("module", list(EXPECTED))
def test_is_distributed_is_the_scripts_own_guard(ported, module: str) -> None:
    _, out, report = ported
    findings = [f for f in report["findings"] if f["path"].endswith(f"{module}.py")]
    assert [f for f in findings if f["kind"] != "change"] == []
    code = (out / f"{module}.py").read_text(encoding="utf-8")
    assert f"NPULossScaleOptimizer(optimizer, manager, is_distributed={EXPECTED[module]})" in code


@pytest.mark.parametrize(("module", "workers"), RUNS)
def test_ported_trains_like_the_original_on_tf2(ported, train, module: str, workers: str) -> None:
    src, out, _ = ported
    original = train(sys.executable, src, module, workers, "fp32", "ccc")  # no contrib on TF 2
    rows = train(sys.executable, out, module, workers, "fp16")
    clean = [rows[0], rows[2], rows[3]]
    assert [(r["w"], r["global_step"]) for r in clean] == [
        (r["w"], r["global_step"]) for r in original
    ]
    assert rows[1]["w"] == rows[0]["w"] and rows[1]["global_step"] == 1  # the overflow skipped
    assert [r["scale"] for r in rows] == [1024.0] * 4


@pytest.mark.skipif(not TF115.exists(), reason="the TF 1.15 stack is not built")
@pytest.mark.parametrize(("module", "workers"), RUNS)
def test_ported_trains_like_the_original_contrib_on_tf115(ported, train, module, workers) -> None:
    src, out, _ = ported
    original = train(str(TF115), src, module, workers, "fp16")
    rows = train(str(TF115), out, module, workers, "fp16")
    assert [(r["w"], r["global_step"]) for r in rows] == [
        (r["w"], r["global_step"]) for r in original
    ]
    assert rows[1]["w"] == rows[0]["w"]
