"""Running a training script a test wrote (or ported) in its own interpreter and reading the JSON
it prints: the stacks' tests start TF 1.15 or TF 2.6.5 this way, beside the main one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_script(python: Path | str, cwd: Path, *args: str, extra_path: tuple[str, ...] = ()) -> str:
    """The script's stdout. This tree's library first on the path (whatever the interpreter has
    installed), TF's start-up log silenced, and nothing from the caller's shell deciding the
    overflow mode (INF_NAN_MODE_ENABLE) or which Keras tf.keras is (TF_USE_LEGACY_KERAS)."""
    path = os.pathsep.join([str(REPO_ROOT), *extra_path])
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
    for name in ("INF_NAN_MODE_ENABLE", "TF_USE_LEGACY_KERAS"):
        env.pop(name, None)
    proc = subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def run_json(python: Path | str, cwd: Path, *args: str, extra_path: tuple[str, ...] = ()) -> dict:
    """The last line the script prints, as JSON (its summary)."""
    out = run_script(python, cwd, *args, extra_path=extra_path)
    return json.loads(out.strip().splitlines()[-1])


def json_lines(
    python: Path | str, cwd: Path, *args: str, extra_path: tuple[str, ...] = ()
) -> list[dict]:
    """Every JSON object line the script prints (one per step), its other output skipped."""
    out = run_script(python, cwd, *args, extra_path=extra_path)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
