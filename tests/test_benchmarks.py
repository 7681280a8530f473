"""The benchmark scripts still run: each on a toy size, as a user would start it.

Timing is not tested here (the machines are shared and noisy); what is checked is that every
script finishes, prints the ratio it exists to report, and rejects a nonsensical size.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
TIMEOUT_S = 300

TOY_RUNS = {
    "overhead.py": ["--rounds", "2", "--steps", "1", "--layouts", "2", "--width", "16"],
    "distributed_overhead.py": ["--steps", "3", "--width", "8"],
    "migrate_speed.py": ["--files", "20"],
    "keras_overhead.py": ["--rounds", "2", "--steps", "2", "--width", "8", "--depth", "1"],
}
# What each script must print, once per figure it reports. At toy sizes the overheads are noise,
# so a ratio may come out negative: only its presence is checked.
EXPECTED_RATIOS = {
    "overhead.py": (r"ratio to TensorFlow's (\S+) \(95% interval \S+; per layout \S+ \S+\)", 6),
    "distributed_overhead.py": (r"ratio all-reduced / local: (\S+)", 1),
    "migrate_speed.py": (r"ratio ours / tf_upgrade_v2: (\S+)", 1),
    "keras_overhead.py": (r"ratio ours-\S+ / keras overhead \(\w+\): (\S+) \(95% interval", 4),
}


def _run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("script", sorted(TOY_RUNS))
def test_benchmark_runs_and_reports_its_ratio(script: str) -> None:
    result = _run(script, TOY_RUNS[script])
    assert result.returncode == 0, result.stderr[-3000:]
    pattern, count = EXPECTED_RATIOS[script]
    ratios = [float(r) for r in re.findall(pattern, result.stdout)]
    assert len(ratios) == count, result.stdout


def test_overhead_rejects_zero_layouts() -> None:
    result = _run("overhead.py", ["--layouts", "0"])
    assert result.returncode == 2
    assert "--layouts must be at least 1, got 0" in result.stderr
