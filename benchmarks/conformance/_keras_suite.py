"""Run an upstream Keras LossScaleOptimizer test file against our class and against stock's.

Shared by keras3.py and tf_keras.py. The test file is read from SNAPSHOT_DIR (written there by
``--materialize`` from the project's bare git mirrors at a pinned commit, never copied into this
repository) and run unmodified, except for one binding: the name through which the file reaches
the loss-scale optimizer class (a module global, or the module it imports the class from) is
pointed at ours. Each side runs in a fresh process with unittest; skipped tests are left out of
N. ``-v`` lists the tests ours fails (to stderr).

The tf_keras repository keeps its sources under ``tf_keras/`` while its wheel ships them under
``tf_keras/src/`` and rewrites every ``tf_keras.`` import to ``tf_keras.src.`` as it builds; its
test file gets the same rewrite here, and nothing else.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import types
import unittest
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
# The scripts' own folder is first on sys.path, and tf_keras.py there would shadow the tf_keras
# package the tests import: once this module is loaded the folder is not needed.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]


def materialize(snapshot: Path, mirrors: Path, repository: str, commit: str, path: str) -> Path:
    """Write ``path`` at ``commit`` of ``repository``'s mirror to SNAPSHOT_DIR/owner+name/path."""
    mirror = mirrors / repository.replace("/", "+") / "repo"
    target = snapshot / repository.replace("/", "+") / path
    text = subprocess.run(
        ["git", "--git-dir", str(mirror), "show", f"{commit}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def load_test_module(path: Path, rewrite_tf_keras: bool) -> types.ModuleType:
    source = path.read_text(encoding="utf-8")
    if rewrite_tf_keras:
        source = source.replace("from tf_keras.", "from tf_keras.src.").replace(
            "from tf_keras import", "from tf_keras.src import"
        )
    module = types.ModuleType("upstream_loss_scale_optimizer_test")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def run_side(module: types.ModuleType) -> dict[str, object]:
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0).run(suite)
    failed = [test.id() for test, _ in result.failures + result.errors]
    skipped = len(result.skipped)
    total = result.testsRun - skipped
    return {
        "passed": total - len(failed),
        "total": total,
        "failed": failed,
        "tracebacks": [text for _, text in result.failures + result.errors],
    }


def worker(side: str, bind: Callable[[types.ModuleType], None], path: Path, rewrite: bool) -> None:
    """One side in this process: print its result as JSON on the last stdout line."""
    module = load_test_module(path, rewrite)
    if side == "ours":
        bind(module)
    print(json.dumps(run_side(module)))


def main(suite: str, path_for: Callable[[Path], Path], argv: list[str]) -> None:
    """``python benchmarks/conformance/<suite>.py SNAPSHOT_DIR``: one line, ours and stock."""
    parser = argparse.ArgumentParser(prog=f"{suite}.py")
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--side", choices=("ours", "stock"), help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.side:
        return
    results = {}
    for side in ("ours", "stock"):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        done = subprocess.run(
            [sys.executable, sys.argv[0], str(args.snapshot), "--side", side],
            capture_output=True,
            text=True,
            env=env,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"{suite}: the {side} run failed (exit {done.returncode})")
        results[side] = json.loads(lines[-1])
    ours, stock = results["ours"], results["stock"]
    if args.verbose:
        for test, trace in zip(ours["failed"], ours["tracebacks"]):
            sys.stderr.write(f"--- ours fails {test}\n{trace}\n")
        for test in stock["failed"]:
            sys.stderr.write(f"--- stock fails {test}\n")
    print(
        f"{suite}: ours {ours['passed']}/{ours['total']}, stock {stock['passed']}/{stock['total']}"
    )


def side_requested(argv: list[str]) -> str:
    return argv[argv.index("--side") + 1] if "--side" in argv else ""


def load_ours(module_name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(module_name)
    if spec is None:
        raise SystemExit(f"{module_name} is not importable from {REPO_ROOT}")
    return importlib.import_module(module_name)
