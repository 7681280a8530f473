"""The benchmark scripts still run: each on a toy size, as a user would start it.

Timing is not tested here (the machines are shared and noisy); what is checked is that every
script finishes, prints the ratio it exists to report, and rejects a nonsensical size.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
TIMEOUT_S = 300

TOY_RUNS = {
    "overhead.py": ["--rounds", "2", "--steps", "1", "--layouts", "2", "--width", "16"],
    "distributed_overhead.py": ["--steps", "3", "--width", "8"],
    "migrate_speed.py": ["--files", "20"],
    "keras_overhead.py": ["--rounds", "2", "--steps", "2", "--width", "8", "--depth", "1"],
    "torch_overhead.py": ["--quick"],
    "torch_distributed_overhead.py": ["--quick"],
}
# What each script must print, once per figure it reports. At toy sizes the overheads are noise,
# so a ratio may come out negative: only its presence is checked.
EXPECTED_RATIOS = {
    "overhead.py": (r"ratio to TensorFlow's (\S+) \(95% interval \S+; per layout \S+ \S+\)", 6),
    "distributed_overhead.py": (r"ratio all-reduced / local: (\S+)", 1),
    "migrate_speed.py": (r"ratio ours / tf_upgrade_v2: (\S+)", 1),
    "keras_overhead.py": (
        r"ratio (?:ours|pure)-\S+ / keras overhead \(\w+\): (\S+) \(95% interval",
        8,
    ),
    "torch_overhead.py": (
        r"ratio ours-\S+ / stock(?: overhead \(\w+\)|, own calls): (\S+) \(95% interval",
        6,
    ),
    "torch_distributed_overhead.py": (r"ratio all-reduced / local: (\S+)", 1),
}


def _run(script: str, args: list[str], **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        **options,
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


def test_migrate_speed_times_one_long_module() -> None:
    result = _run("migrate_speed.py", ["--long", "300"])
    assert result.returncode == 0, result.stderr[-3000:]
    # 300 generated statements after a seven-line head that holds the one loss-scale call.
    assert "tree: 1 files, 307 lines, 1 pass the byte pre-filter, 1 of them" in result.stdout
    assert re.search(r"one 307-line module: npu-migrate --check \d+\.\d+ s", result.stdout)


def test_migrate_speed_times_a_real_tree_without_the_files_tf_upgrade_v2_aborts_on(
    tmp_path: Path,
) -> None:
    """tf_upgrade_v2 --intree ends the whole run on one file its annotating parser refuses (a
    tuple of slices, found in NVIDIA's examples): the benchmark leaves such files out of the
    tree both tools are timed on, says so, and still reports the ratio."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "crop.py").write_text("def crop(a, b):\n    return a[(b - 1) : (b + 1), 0:2]\n")
    (tree / "pkg" / "train.py").write_text(
        "import tensorflow as tf\n"
        "opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(\n"
        "    tf.compat.v1.train.GradientDescentOptimizer(0.1))\n"
        "session = tf.Session()\n"
    )
    result = _run("migrate_speed.py", ["--tree", str(tree)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tf_upgrade_v2 aborts a whole run on 1 of the tree's files" in result.stdout
    assert "crop.py): both tools are timed on the others" in result.stdout
    assert "tree: 1 files, 4 lines, 1 pass the byte pre-filter, 1 of them" in result.stdout
    assert re.search(r"ratio ours / tf_upgrade_v2: \S+", result.stdout), result.stdout
    assert "Renamed" not in result.stdout  # tf_upgrade_v2's own notes stay out of the table


def test_torch_overhead_counts_host_reads_and_ours_adds_none() -> None:
    result = _run("torch_overhead.py", ["--quick"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^  (bare|stock|ours-\S+)\s+(\d+)  \(", result.stdout, re.M)
    reads = {variant: int(count) for variant, count in rows}
    assert set(reads) == {"bare", "stock", "ours-inf_nan", "ours-saturation"}, result.stdout
    # Stock's scaler reads found_inf once to decide the step: the counter must see that read.
    assert reads["stock"] > reads["bare"]
    assert reads["ours-inf_nan"] <= reads["stock"] and reads["ours-saturation"] <= reads["stock"]


def _live_in_session(session: int) -> list[int]:
    """Pids of the processes still running in ``session`` (Linux /proc)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_torch_distributed_overhead_ends_its_ranks_at_the_time_limit() -> None:
    process = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "torch_distributed_overhead.py"), "--timeout", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the ranks inherit the session: any left behind is found
    )
    try:
        _, stderr = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 1, stderr[-3000:]
        assert "did not finish within 2 s" in stderr or "a rank failed" in stderr, stderr[-3000:]
        # multiprocessing's resource tracker leaves a moment after the job's own exit (it
        # watches a pipe the job held); a rank left running would still be there seconds later
        deadline = time.monotonic() + 5
        while _live_in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _live_in_session(process.pid) == []
    finally:
        for pid in _live_in_session(process.pid):
            os.kill(pid, signal.SIGKILL)
