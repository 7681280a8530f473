"""What a user meets around the port itself: leftovers of a killed run, workers of a killed run,
errors that name the right file and line, an empty tree, and --write over uncommitted work.

Every case runs the real CLI on real files; the kill is a real SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import cli_env, run_cli

PORTABLE = b"import tensorflow as tf\nm = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"


def _ported(data: bytes) -> bool:
    return b"contrib" not in data and b"FixedLossScaleManager(128)" in data


def test_a_killed_runs_temporary_files_are_removed_by_the_next_write(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_bytes(PORTABLE)
    (tmp_path / "b.py").write_bytes(b"x = 1\n")
    # What a kill between staging and renaming leaves: mkstemp's names beside the files.
    left = [tmp_path / "pkg" / ".a.py.k2x_9q0z.tmp", tmp_path / ".b.py.abcdefgh.tmp"]
    for temp in left:
        temp.write_bytes(b"half")
    unrelated = tmp_path / ".c.py.abcdefgh.tmp"  # no c.py beside it: not ours to remove
    unrelated.write_bytes(b"keep")
    diff = run_cli(".", cwd=tmp_path)  # a diff run writes (and removes) nothing
    assert diff.returncode == 0 and all(t.exists() for t in left)
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not any(t.exists() for t in left) and unrelated.exists()
    assert "removed 2 temporary files an interrupted run left" in proc.stderr
    assert _ported((tmp_path / "pkg" / "a.py").read_bytes())


def _children(pid: int) -> set[int]:
    """The run's worker processes (forks of it, so with its command line; not a `git` it runs)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    workers = set()
    for child in found:
        try:
            if b"migrator" in Path(f"/proc/{child}/cmdline").read_bytes():
                workers.add(child)
        except FileNotFoundError:
            pass
    return workers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_workers_end_soon_after_their_parent_is_killed(tmp_path: Path) -> None:
    # Long files keep the workers busy for a while; the parent is killed while they work.
    body = PORTABLE + b"".join(b"x%d = [%d] * 3\n" % (i, i) for i in range(1500))
    for index in range(16):
        (tmp_path / f"f{index}.py").write_bytes(body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "migrator", "-j", "2", "."],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            workers = _children(proc.pid)
            time.sleep(0.05)
        assert len(workers) >= 2, "the run ended before its workers could be seen"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), "workers outlived the killed run by 5 s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kill_a_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL one pool worker of a run, as the OOM killer would. A child seen twice, 0.3 s apart,
    is a worker (a fork about to become `git` is gone by then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        seen = _children(proc.pid)
        time.sleep(0.3)
        for worker in sorted(seen & _children(proc.pid)):
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                continue
            return
    raise AssertionError("the run ended before a worker could be killed")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_killed_worker_costs_its_files_not_the_run(tmp_path: Path) -> None:
    body = PORTABLE + b"".join(b"x%d = [%d] * 3\n" % (i, i) for i in range(1500))
    for index in range(16):
        (tmp_path / f"f{index:02}.py").write_bytes(body)
    proc = subprocess.Popen(
        [sys.executable, "-m", "migrator", "--write", "-j", "2", "."],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _kill_a_worker(proc)
    _, stderr = proc.communicate(timeout=300)
    lines = stderr.decode().splitlines()
    assert proc.returncode == 123, lines
    died = [line for line in lines if "a worker process died while porting it" in line]
    assert died and lines[-1].startswith("npu-migrate: 16 files scanned, ")
    for index in range(16):
        data = (tmp_path / f"f{index:02}.py").read_bytes()
        dead = any(line.startswith(f"f{index:02}.py: error: ") for line in died)
        assert data == body if dead else _ported(data)


def test_an_unwritable_directory_names_the_file_not_a_temporary_file(tmp_path: Path) -> None:
    from test_faults import _immutable

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_bytes(PORTABLE)
    with _immutable(tmp_path / "src"):
        proc = run_cli("--write", "src", cwd=tmp_path)
    assert proc.returncode == 123
    assert "src/a.py: error: cannot write src/a.py: Operation not permitted" in proc.stderr
    assert ".tmp" not in proc.stderr
    assert (tmp_path / "src" / "a.py").read_bytes() == PORTABLE


def test_a_nul_byte_is_reported_where_python_reports_it(tmp_path: Path) -> None:
    source = b"import tensorflow as tf\nx = 1\x00\n" + PORTABLE.split(b"\n", 1)[1]
    (tmp_path / "a.py").write_bytes(source)
    python = subprocess.run([sys.executable, "a.py"], cwd=tmp_path, capture_output=True, text=True)
    assert "line 2" in python.stderr and "null bytes" in python.stderr
    proc = run_cli("a.py", cwd=tmp_path)
    assert proc.returncode == 123
    assert proc.stderr.startswith("a.py:2:6: cannot parse: source code cannot contain null bytes\n")


def test_an_empty_directory_says_there_is_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no python here\n")
    proc = run_cli("empty", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr == "No Python files are present to be migrated. Nothing to do.\n"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_write_over_uncommitted_changes_proceeds_and_says_how_to_undo(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "clean.py").write_bytes(PORTABLE)
    (tmp_path / "edited.py").write_bytes(PORTABLE)
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "scripts")
    committed = run_cli("--write", "--check", ".", cwd=tmp_path)  # usage error: nothing written
    assert committed.returncode == 2
    (tmp_path / "edited.py").write_bytes(PORTABLE + b"# my own edit\n")
    (tmp_path / "new.py").write_bytes(b"x = 1\n")  # untracked
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _ported((tmp_path / "clean.py").read_bytes())
    assert "had uncommitted or untracked changes; the port was written anyway" in proc.stderr
    assert "\n  git checkout -- clean.py\n" in proc.stderr
    assert "\n  edited.py: held your own uncommitted changes too" in proc.stderr
    # The advice works: it restores the file that was clean, and only that one.
    _git(tmp_path, "checkout", "--", "clean.py")
    assert (tmp_path / "clean.py").read_bytes() == PORTABLE
    assert b"# my own edit" in (tmp_path / "edited.py").read_bytes()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_write_on_a_clean_work_tree_adds_no_note(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_bytes(PORTABLE)
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "scripts")
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 0 and "note:" not in proc.stderr
