"""The comments the global-step move writes keep to the line length the script itself keeps.

Real CLI, real fixture scripts copied to a temporary directory. A script's limit is the smallest of
the common ones (79, 80, 88, 99, 100, 110, 119, 120) its own lines fit in, tabs counted as 4
columns; the limits below were read off each fixture by hand.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, run_cli

# fixture folder -> {file the move writes comments into: the limit its own lines keep}
LIMITS = {
    "bert/crossfile": {"custom_opt.py": 79, "run_pretraining.py": 88},  # longest 78 (tabs), 81
    "bert_accum": {"optimization.py": 99},  # longest 99
    "bert_lamb": {"optimization.py": 110},  # longest 101
}
INCREMENT_COMMENT = (
    "npu-migrate: the loss-scale optimizer calls apply_gradients only on clean steps, so advance "
    "here."
)


def _width(line: str) -> int:
    return len(line.expandtabs(4))


def _added_comments(old: str, new: str) -> list[list[str]]:
    """Runs of consecutive comment lines in `new` that the port wrote (not a commented-out copy
    of one of the script's own lines)."""
    own = {line.strip() for line in old.splitlines()}
    runs: list[list[str]] = []
    previous = False
    for line in new.splitlines():
        text = line.strip()
        ours = text.startswith("#") and text not in own and text[1:].strip() not in own
        if ours and previous:
            runs[-1].append(line)
        elif ours:
            runs.append([line])
        previous = ours
    return runs


def _port(tmp_path: Path, folder: str) -> tuple[Path, Path]:
    src, before = tmp_path / "src", tmp_path / "before"
    shutil.copytree(MIGRATOR_FIXTURES / folder, src)
    shutil.copytree(src, before)
    proc = run_cli("--write", "-j", "1", src)
    assert proc.returncode == 0, proc.stderr
    return src, before


@pytest.mark.parametrize("folder", sorted(LIMITS))
def test_moved_step_comments_fit_the_scripts_line_length(tmp_path: Path, folder: str) -> None:
    src, before = _port(tmp_path, folder)
    wrapped = 0
    for name, limit in LIMITS[folder].items():
        old = (before / name).read_text()
        new = (src / name).read_text()
        assert max(map(_width, old.splitlines())) <= limit
        runs = _added_comments(old, new)
        assert runs, f"{name}: the port wrote no comment"
        for run in runs:
            for line in run:
                assert _width(line) <= limit, f"{name}: {_width(line)} > {limit}: {line!r}"
            wrapped += len(run) > 1 and any("npu-migrate:" in line for line in run)
    assert wrapped  # some note really needed wrapping (else this test proves nothing)
    # The wrapped notes still read as notes: a second run finds nothing to do.
    assert run_cli("--check", "-j", "1", src).returncode == 0


def test_the_increment_comment_is_wrapped_whole(tmp_path: Path) -> None:
    # Tab-indented class two levels deep, lines up to 78 columns: the 99-character comment above
    # the increment becomes two lines, every word kept, in the file's own indentation.
    src, before = _port(tmp_path, "bert/crossfile")
    new = (src / "custom_opt.py").read_text()
    (run,) = [
        r
        for r in _added_comments((before / "custom_opt.py").read_text(), new)
        if "npu-migrate:" in r[0]
    ]
    assert len(run) == 2
    assert all(line.startswith("\t\t# ") for line in run)
    assert " ".join(line.strip()[2:] for line in run) == INCREMENT_COMMENT


def test_a_script_with_longer_lines_keeps_one_line_comments(tmp_path: Path) -> None:
    # bert/optimization.py has a 121-column line: it keeps no common limit, so nothing is wrapped.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(MIGRATOR_FIXTURES / "bert" / "optimization.py", src)
    old = (src / "optimization.py").read_text()
    assert max(map(_width, old.splitlines())) == 121
    assert run_cli("--write", "-j", "1", src).returncode == 0
    new = (src / "optimization.py").read_text()
    notes = [line for line in new.splitlines() if "npu-migrate: global_step now advances" in line]
    assert notes and all(line.rstrip().endswith("Original update:") for line in notes)
