"""benchmarks/faults.py at a toy size: real kills of real --write runs, every move whole or
reported afterwards (the full size, 2,000 files and ten kills, is run by hand: see its doc)."""

from __future__ import annotations

import subprocess
import sys

from cli_runner import REPO_ROOT, cli_env


def test_faults_benchmark_kills_runs_and_finds_every_move_whole_or_reported() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "faults.py"),
            *("--files", "60", "--plans", "6", "--kills", "2", "--jobs", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tree: 60 files, 6 cross-file moves (6 ported" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 2
    assert done.stdout.rstrip().endswith("faults: every move whole or reported after each kill")
