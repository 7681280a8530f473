"""The other interpreters benchmarks/realcode.py runs the ported files with: the stacks Ascend's
TensorFlow adapter supports (TF 1.15 on Python 3.7, TF 2.6.5 with Keras 2), and the Python a port
must still compile on."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Stack:
    """Another interpreter the changed files are imported and trained with (label=python). A TF 1
    stack (TF 1.x, or --tf1-stack) runs the TF 1 files only; a TF 2 one given with --stack runs
    the TF 2 / Keras 2 files too (TF 2.6.5's tf.keras is Keras 2)."""

    label: str
    python: str
    tf1_only: bool
    tf_version: str = ""

    def runs(self, style: str | None) -> bool:
        if style == "tf1":
            return True
        return style == "tf2" and not self.tf1_only and not self.tf_version.startswith("1.")


def stack_version(python: str) -> str:
    """The TensorFlow version an interpreter imports; exits 2 where it has none."""
    done = subprocess.run(
        [python, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} does not import tensorflow: {done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


# Compiles each file given on stdin (a JSON list) with the interpreter that runs it.
_COMPILE = r"""
import json, sys
out = {}
for path in json.load(sys.stdin):
    try:
        compile(open(path, "rb").read(), path, "exec", dont_inherit=True)
        out[path] = "ok"
    except SyntaxError as error:
        out[path] = f"{type(error).__name__}: {error.msg} (line {error.lineno})"
print(json.dumps(out))
"""


def compile_with(python: str, pairs: list[tuple[Any, Path, Path]], label: str) -> None:
    """Compile every changed file (ported, and its original) with another interpreter in one
    process, e.g. Python 3.7: the port must write code that Python accepts. A file whose
    original does not compile there either is n/a (the project needs a newer Python)."""
    paths = [str(p) for _, *pair in pairs for p in pair]
    done = subprocess.run(
        [python, "-c", _COMPILE], input=json.dumps(paths), capture_output=True, text=True
    )
    results = json.loads(done.stdout) if done.returncode == 0 else {}
    for row, ported, original in pairs:
        now = results.get(str(ported), f"FAIL {python} did not run: {done.stderr[-200:]}")
        before = results.get(str(original), "")
        if now == "ok":
            row.compiled[label] = "ok"
        elif before != "ok":
            row.compiled[label] = f"n/a (unported too: {before})"
        else:
            row.compiled[label] = f"FAIL {now}"
            row.failures.append(f"compile on {label} failed: {now}")
