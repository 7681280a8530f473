"""Links, paths above the working directory, and long files: what the CLI writes and prints.

Each test runs the real CLI on files in a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import run_cli

NEEDS_PORT = (
    "import tensorflow as tf\n\nmanager = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
)


def _headers(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line.startswith(("--- ", "+++ "))]


def test_a_file_reached_twice_through_links_is_processed_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(NEEDS_PORT)
    (src / "alias.py").symlink_to("train.py")
    (tmp_path / "again").symlink_to(src, target_is_directory=True)
    result = run_cli(src, tmp_path / "again", "--no-color")
    assert result.returncode == 0, result.stderr
    assert len(_headers(result.stdout)) == 2, result.stdout  # one file, one ---/+++ pair
    assert "1 file scanned" in result.stderr


def test_a_link_leading_outside_the_paths_given_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "shared.py").write_text(NEEDS_PORT)
    src = tmp_path / "src"
    src.mkdir()
    (src / "shared.py").symlink_to(outside / "shared.py")
    report = tmp_path / "report.json"
    result = run_cli("--write", "--report", report, src)
    assert result.returncode == 0, result.stderr
    assert (outside / "shared.py").read_text() == NEEDS_PORT
    assert (src / "shared.py").is_symlink()
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    assert [(Path(f["path"]).name, f["rule"]) for f in findings] == [
        ("shared.py", "symlink-outside")
    ]
    assert str(outside / "shared.py") in findings[0]["message"]


def test_a_path_above_the_working_directory_gets_an_absolute_header(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NEEDS_PORT)
    work = tmp_path / "work"
    work.mkdir()
    result = run_cli("../train.py", "--no-color", cwd=work)
    assert result.returncode == 0, result.stderr
    absolute = str(tmp_path / "train.py")
    assert _headers(result.stdout) == [f"--- {absolute}", f"+++ {absolute}"]


def test_the_diff_of_a_long_repetitive_file_shows_only_the_changed_lines(tmp_path: Path) -> None:
    """difflib's junk heuristic replaced every line of such a file (5,000 lines, 3 changed)."""
    body = "".join(f"x{i % 7} = x{i % 5} + 1\n" if i % 3 else "\n" for i in range(2500))
    path = tmp_path / "generated.py"
    path.write_text(
        NEEDS_PORT + body + "opt = tf.contrib.mixed_precision.LossScaleOptimizer("
        "tf.train.AdamOptimizer(0.1), manager)\n" + body
    )
    result = run_cli(path, "--no-color")
    assert result.returncode == 0, result.stderr
    changed = [
        line
        for line in result.stdout.splitlines()
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    ]
    assert len(changed) == 5, changed  # the import, the manager, the optimizer (old and new)
