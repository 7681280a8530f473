"""Faults a real run meets, made by real means: a planted codemod bug, files that crash the parser,
a read-only directory, a killed process. Each must cost the files it concerns and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, cli_env, run_cli

PORTABLE = b"import tensorflow as tf\nm = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"


def _assert_ported(data: bytes) -> None:
    assert b"contrib" not in data and b"FixedLossScaleManager(128)" in data


def _run_copy(copy: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI from a copy of the package (with a planted bug), not from the checkout."""
    env = cli_env()
    env["PYTHONPATH"] = str(copy)
    return subprocess.run(
        [sys.executable, "-m", "migrator", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# Lines before and after the broken import: none, then enough for a long file, ported through its
# view and checked by parsing only the lines around the change (migrator.pipeline.output_check).
FILLER = {
    "short": (0, 0),
    "long, change near the top": (40, 2500),
    "long, in the middle": (1200, 1200),
}


@pytest.mark.parametrize("filler", FILLER.values(), ids=FILLER.keys())
def test_a_rewrite_that_would_not_parse_fails_alone(
    tmp_path: Path, filler: tuple[int, int]
) -> None:
    # Plant a plausible one-line bug in a copy of the package: when the port drops the last name of
    # a `from ... import a, b`, it forgets to drop that name's comma too (libcst renders the
    # dangling comma without complaint; Python rejects it).
    copy = tmp_path / "pkg"
    shutil.copytree(REPO_ROOT / "migrator", copy / "migrator")
    shutil.copytree(REPO_ROOT / "templates", copy / "templates")
    rewrite = copy / "migrator" / "codemods" / "shared" / "rewriting.py"
    line = "kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)"
    text = rewrite.read_text()
    assert text.count(line) == 1
    rewrite.write_text(text.replace(line, "pass"))

    tree = tmp_path / "tree"
    tree.mkdir()
    before, after = filler
    bad = (
        b"import tensorflow as tf\n"
        + b"".join(b"def f%d(x):\n    return x + %d\n" % (i, i) for i in range(before // 2))
        + b"from tensorflow.contrib.mixed_precision import "
        + b"LossScaleManager, FixedLossScaleManager\n"
        + b"m = FixedLossScaleManager(128)\n"
        + b"".join(b"table = tf.add(table, %d)\n" % i for i in range(after))
    )
    broken_line = 2 + 2 * (before // 2)
    (tree / "bad.py").write_bytes(bad)
    (tree / "good.py").write_bytes(PORTABLE)
    report = tmp_path / "report.json"
    proc = _run_copy(copy, "--write", "--report", report, ".", cwd=tree)

    assert proc.returncode == 123, proc.stderr
    assert (tree / "bad.py").read_bytes() == bad
    _assert_ported((tree / "good.py").read_bytes())
    assert (
        "bad.py: error: internal error in npu-migrate: the ported file would not parse "
        f"({broken_line}:" in proc.stderr
    )
    assert "trailing comma not allowed" in proc.stderr
    (failed,) = json.loads(report.read_text())["failed"]
    assert failed["path"] == "bad.py" and "would not parse" in failed["reason"]
    # The unbroken package ports the same file: the failure came from the planted bug.
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    assert b"FixedLossScaleManager(128)" in (tree / "bad.py").read_bytes() != bad


# Each crashed libcst's native parser with signal 11 (measured: 3,000 brackets, 8,000 terms), or
# took minutes (a statement of hundreds of thousands of list items).
PATHOLOGICAL = {
    "brackets.py": "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n",
    "sum.py": "x = " + "+".join(["a"] * 8000) + "\n",
    "calls.py": "x = f" + "()" * 8000 + "\n",
    "data.py": "x = [" + ", ".join(["1"] * 30_000) + "]\n",
}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_too_deep_for_the_parser_fails_alone_with_its_line(
    tmp_path: Path, jobs: str
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    header = PORTABLE.decode() + "y = 1\n"  # the pathological statement is on line 4
    for name, statement in PATHOLOGICAL.items():
        (tree / name).write_text(header + statement)
    for index in range(4):  # enough files for worker processes with -j2
        (tree / f"good{index}.py").write_bytes(PORTABLE)
    proc = run_cli("--write", "-j", jobs, ".", cwd=tree, timeout=120)

    assert proc.returncode == 123, proc.stderr
    for index in range(4):
        _assert_ported((tree / f"good{index}.py").read_bytes())
    for name, statement in PATHOLOGICAL.items():
        assert (tree / name).read_text() == header + statement
    lines = proc.stderr.splitlines()
    for name in ("brackets.py", "sum.py", "calls.py"):
        assert any(
            line.startswith(f"{name}:4:") and ": too deeply nested for the parser: " in line
            for line in lines
        ), proc.stderr
    assert any(line.startswith("data.py:4:1: statement too long for the parser") for line in lines)
    assert lines[-1].startswith("npu-migrate: 8 files scanned, 4 changed, 0 warnings, 4 failed")


def test_the_depth_measure_tells_deep_from_long_and_flat() -> None:
    from migrator.findings import SourceError
    from migrator.sources import limits

    flat = "x = [" + ", ".join(["-1"] * 10_000) + "]\n"  # long, but every item is shallow
    limits.check(flat.encode())
    assert limits.deepest_line(("y = 1\n" + flat + "z = a+b+c\n").encode()) == 2
    chain = "x = " + ".".join(["a"] * (limits.MAX_DEPTH + 5)) + "\n"
    with pytest.raises(SourceError, match=r"^2:\d+: too deeply nested for the parser"):
        limits.check(("y = 1\n" + chain).encode())
    # Python's own limit is 200 nested brackets: all of them pass.
    limits.check(("x = " + "(" * 199 + "1" + ")" * 199 + "\n").encode())
    past = ("x = " + "(" * 250 + "1" + ")" * 250 + "\n").encode()
    if sys.version_info >= (3, 12):
        # The compiler's tokenizer stops at the 201st, before any count of ours gets deep: the
        # file is refused at that bracket, where libcst's parser would crash on thousands.
        with pytest.raises(SourceError, match=r"^1:205: too deeply nested .* 200 levels"):
            limits.check(past)
    else:
        limits.check(past)  # 750 levels by the count: within what libcst parses safely
    # Not Python at all: left to the parser, which reports the syntax error.
    limits.check(b"def f(:\n")


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """Nothing in `path` can be created, renamed or removed, even by root (a read-only mount's
    effect, by the file system's own flag); skips where the flag is not available."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not available")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system or user cannot set the immutable flag")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def _crossfile_tree(root: Path) -> tuple[Path, Path]:
    """The BERT cross-file shape with the optimizer class in another directory (lib/)."""
    (root / "lib").mkdir(parents=True)
    (root / "train").mkdir()
    crossfile = MIGRATOR_FIXTURES / "bert" / "crossfile"
    shutil.copy(crossfile / "custom_opt.py", root / "lib")
    (root / "lib" / "__init__.py").write_bytes(b"")
    trainer = (crossfile / "run_pretraining.py").read_text()
    (root / "train" / "run_pretraining.py").write_text(
        trainer.replace("from custom_opt import", "from lib.custom_opt import")
    )
    return root / "lib" / "custom_opt.py", root / "train" / "run_pretraining.py"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("blocked", ["class directory", "trainer file"])
def test_a_cross_file_move_is_written_all_or_none(tmp_path: Path, blocked: str) -> None:
    # The class file is renamed first. A read-only lib/ fails its staging (nothing renamed yet);
    # an immutable trainer fails the second rename, after the class file was replaced: it must get
    # its old bytes back.
    tree = tmp_path / "tree"
    class_file, trainer = _crossfile_tree(tree)
    before = _snapshot(tree)
    report = tmp_path / "report.json"
    with _immutable(class_file.parent if blocked == "class directory" else trainer):
        proc = run_cli("--write", "--report", report, ".", cwd=tree)
    assert proc.returncode == 123, proc.stderr
    assert _snapshot(tree) == before  # no temporary file either
    failed = {f["path"]: f["reason"] for f in json.loads(report.read_text())["failed"]}
    culprit, other = ("lib", "train") if blocked == "class directory" else ("train", "lib")
    (culprit_reason,) = [r for p, r in failed.items() if p.startswith(culprit)]
    (other_reason,) = [r for p, r in failed.items() if p.startswith(other)]
    assert culprit_reason.startswith("cannot write ") and culprit in culprit_reason
    assert ".tmp" not in culprit_reason
    assert "written together or not at all" in other_reason
    # Once writable, the same run ports both.
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    assert b"new_global_step" in class_file.read_bytes()
    assert b"# train_op = tf.group(train_op, global_step.assign_add(1))" in trainer.read_bytes()


@pytest.mark.parametrize("restored", ["class file", "trainer"])
def test_a_half_applied_move_in_the_tree_is_completed(tmp_path: Path, restored: str) -> None:
    # What a kill between the two writes of a move leaves (or a file restored by hand): the class
    # file renamed first has its increment and the trainer still advances the step itself (twice
    # per step), or the trainer is ported and the class has no increment (never). A re-run
    # finishes the move: the tree is then byte for byte what one uninterrupted run writes.
    tree = tmp_path / "tree"
    class_file, trainer = _crossfile_tree(tree)
    original = {class_file: class_file.read_bytes(), trainer: trainer.read_bytes()}
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    ported = _snapshot(tree)
    half = class_file if restored == "class file" else trainer
    half.write_bytes(original[half])
    check = run_cli("--check", ".", cwd=tree)
    assert check.returncode == 1, check.stderr  # the half move is something to do, not "clean"
    proc = run_cli("--write", ".", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert "1 changed, 0 warnings, 0 failed" in proc.stderr
    assert _snapshot(tree) == ported
    assert run_cli("--check", ".", cwd=tree).returncode == 0


def test_a_half_applied_move_that_cannot_be_completed_is_reported(tmp_path: Path) -> None:
    # The trainer ported, the class back without its increment and edited by hand so that the
    # increment has nowhere to go (apply_gradients no longer returns `tf.group(*updates)`): the
    # re-run cannot finish the move, so it names the half move and leaves the tree as it is.
    tree = tmp_path / "tree"
    class_file, trainer = _crossfile_tree(tree)
    original_class = class_file.read_text()
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    assert "return tf.group(*updates, name=name)" in original_class
    class_file.write_text(
        original_class.replace("return tf.group(*updates, name=name)", "return updates[0]")
    )
    half = _snapshot(tree)
    proc = run_cli("--write", ".", cwd=tree)
    assert proc.returncode == 123
    (line,) = [
        number
        for number, text in enumerate(trainer.read_text().splitlines(), 1)
        if "npu-migrate: global_step now advances in" in text
    ]
    assert (
        f"train/run_pretraining.py:{line}:1: half-applied global-step move: the update below this "
        "line was moved into LambLike.apply_gradients, but LambLike (lib/custom_opt.py:5) does "
        "not advance global_step" in proc.stderr
    )
    assert _snapshot(tree) == half


def test_a_half_applied_move_into_an_ambiguous_class_is_reported(tmp_path: Path) -> None:
    # Two files the run ports define the class the note names (the second one uses the ported
    # library too): which one the move meant cannot be told from the note, so nothing is guessed.
    tree = tmp_path / "tree"
    class_file, _ = _crossfile_tree(tree)
    original_class = class_file.read_bytes()
    assert run_cli("--write", ".", cwd=tree).returncode == 0
    class_file.write_bytes(original_class)
    (tree / "other").mkdir()
    (tree / "other" / "custom_opt.py").write_bytes(
        original_class + b"\nfrom npu_lossscale import NPULossScaleOptimizer\n"
    )
    half = _snapshot(tree)
    proc = run_cli("--write", ".", cwd=tree)
    assert proc.returncode == 123
    assert "half-applied global-step move" in proc.stderr
    assert _snapshot(tree) == half
