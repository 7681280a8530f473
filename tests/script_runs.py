"""Running a training script a test wrote (or ported) in its own interpreter and reading the JSON
line it prints last: the stacks' tests start TF 1.15 or TF 2.6.5 this way, beside the main one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_json(python: Path | str, cwd: Path, *args: str, extra_path: tuple[str, ...] = ()) -> dict:
    """This tree's library first on the path (whatever the interpreter has installed), TF's
    start-up log silenced, and no INF_NAN_MODE_ENABLE from the caller's shell deciding the mode."""
    path = os.pathsep.join([str(REPO_ROOT), *extra_path])
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    proc = subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
