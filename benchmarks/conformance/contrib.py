"""tf.contrib.mixed_precision's own tests, run against our TF1 classes and against contrib's.

    python benchmarks/conformance/contrib.py SNAPSHOT_DIR [--python PYTHON] [-v]
    python benchmarks/conformance/contrib.py SNAPSHOT_DIR --materialize [--mirrors DIR]

SNAPSHOT_DIR holds TensorFlow's loss_scale_manager_test.py and loss_scale_optimizer_test.py from
tensorflow/contrib/mixed_precision/python/ (TF 1.x; read at tensorflow/tensorflow commits
0b024689d0e080abe459c6e0fa245b5d35af2d54 and c2c91d939591e34e874c46b06698527747b300eb), anywhere
below it; they stay outside the repository. Each suite file is run unmodified in TF 1.15 (the
only TensorFlow with contrib; by default the venv `make test` builds, .venv-tf115): once as it
is, against contrib's classes, and once with its two module names bound to ours -- ``lsm_lib``
to npu_lossscale's managers and ``lso.LossScaleOptimizer`` to NPULossScaleOptimizer. Each side
runs in a fresh process. Prints one line, ``contrib: ours P/N, stock C/N`` (N test methods; each
runs in graph and in eager mode), with ``-v`` one ``--- ours fails TEST`` line on stderr per test
ours fails, and exits 1 when ours fails any. ``--materialize`` writes the two files from a bare
clone at MIRRORS/tensorflow+tensorflow/repo at those commits; where there is none it says how to
get them (the repository is too big for a whole clone here: read the two files at those
commits) and leaves the snapshot as it is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITES = ("loss_scale_manager_test.py", "loss_scale_optimizer_test.py")
DEFAULT_PYTHON = REPO / ".venv-tf115" / "bin" / "python"


PINNED = {
    "loss_scale_manager_test.py": "0b024689d0e080abe459c6e0fa245b5d35af2d54",
    "loss_scale_optimizer_test.py": "c2c91d939591e34e874c46b06698527747b300eb",
}
FOLDER = "tensorflow/contrib/mixed_precision/python"


def materialize(snapshot: Path, mirrors: Path) -> int:
    repo = mirrors / "tensorflow+tensorflow" / "repo"
    if not repo.exists():
        print(
            f"contrib.py: no mirror at {repo}; put {FOLDER}/{{{','.join(PINNED)}}} at the pinned "
            f"commits under {snapshot}/tensorflow+tensorflow/ by hand",
            file=sys.stderr,
        )
        return 0
    for name, commit in PINNED.items():
        text = subprocess.run(
            ["git", "--git-dir", str(repo), "show", f"{commit}:{FOLDER}/{name}"],
            capture_output=True,
            check=True,
        ).stdout
        target = snapshot / "tensorflow+tensorflow" / FOLDER / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
    return 0


def find_suites(snapshot: Path) -> list[Path]:
    found = []
    for name in SUITES:
        matches = sorted(p for p in snapshot.rglob(name) if "contrib/mixed_precision" in str(p))
        if not matches:
            raise SystemExit(f"contrib.py: no {name} under {snapshot} (see this file's docstring)")
        found.append(matches[0])
    return found


def bind_to_ours(module) -> None:
    """Point the suite's ``lsm_lib`` and ``lso`` at our classes; the test text stays as it is."""
    import types

    import npu_lossscale as nl

    module.lsm_lib = types.SimpleNamespace(
        LossScaleManager=nl.LossScaleManager,
        FixedLossScaleManager=nl.FixedLossScaleManager,
        ExponentialUpdateLossScaleManager=nl.ExponentialUpdateLossScaleManager,
    )
    if hasattr(module, "lso"):
        module.lso = types.SimpleNamespace(LossScaleOptimizer=nl.NPULossScaleOptimizer)


def run_side(side: str, suites: list[str]) -> dict:
    """In the TF 1.15 process: load each suite file as a module, bind, run with unittest."""
    import importlib.util
    import io
    import unittest

    loaded = unittest.TestSuite()
    for path in suites:
        spec = importlib.util.spec_from_file_location(Path(path).stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if side == "ours":
            bind_to_ours(module)
        for test in unittest.defaultTestLoader.loadTestsFromModule(module):
            # tf.test.TestCase's own test_session() is a helper, not one of the suite's tests.
            loaded.addTests(t for t in test if not t.id().endswith(".test_session"))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(loaded)
    failed = [test.id() for test, _ in result.failures + result.errors]
    return {
        "total": result.testsRun,
        "passed": result.testsRun - len(failed),
        "failed": failed,
        "details": [text.splitlines()[-1] for _, text in result.failures + result.errors],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="a TF 1.15 interpreter")
    parser.add_argument("--side", choices=("ours", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true", help="list ours' failures")
    parser.add_argument("--materialize", action="store_true", help="write the texts and exit")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    args = parser.parse_args()
    if args.materialize:
        return materialize(args.snapshot, args.mirrors)
    suites = [str(p) for p in find_suites(args.snapshot)]
    if args.side:  # the child process
        print(json.dumps(run_side(args.side, suites)))
        return 0
    if not Path(args.python).exists():
        raise SystemExit(f"contrib.py: no TF 1.15 Python at {args.python}; run `make test-tf115`")
    results = {}
    for side in ("ours", "stock"):
        done = subprocess.run(
            [args.python, __file__, str(args.snapshot), "--side", side],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"contrib.py: the {side} run failed:\n{done.stderr[-3000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, stock = results["ours"], results["stock"]
    print(
        f"contrib: ours {ours['passed']}/{ours['total']}, stock {stock['passed']}/{stock['total']}"
    )
    for name, detail in zip(ours["failed"], ours["details"]):
        print(f"--- ours fails {name}\n{detail}" if args.verbose else f"--- ours fails {name}",
              file=sys.stderr)
    return 0 if ours["passed"] == ours["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
