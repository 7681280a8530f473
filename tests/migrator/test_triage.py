"""The `ast` triage clears only files the full libcst pipeline leaves unchanged and unreported.

Proven on every migrator fixture, folder by folder as one project each (cross-file facts included):
the full pipeline runs over every file the byte pre-filter admits, exactly as before the triage
existed, and every file the triage clears must come out unchanged with no finding. Then the CLI
shows what the triage buys: a flag named `loss_scale` no longer costs a libcst parse, while a
class file another file's optimizer comes from is still seen by the global-step plan.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, run_cli

from migrator.pipeline.runner import (
    EARLY_TRIAGE_FILES,
    TRIAGE_BATCH,
    TRIAGE_FILES_PER_WORKER,
    _migrate_all,
    _split,
    _triage,
    _Verdicts,
)
from migrator.pipeline.transform import MigrateOptions
from migrator.selection.prefilter import might_need_migration
from migrator.sources.files import SourceFile

FIXTURES = MIGRATOR_FIXTURES
FOLDERS = sorted({p.parent for p in FIXTURES.rglob("*.py")})


def _admitted(folder: Path, add: bool) -> list[tuple[SourceFile, bytes]]:
    files = sorted(folder.glob("*.py"))
    out = [(SourceFile(p, str(p)), p.read_bytes()) for p in files]
    return [(s, d) for s, d in out if might_need_migration(d, add_loss_scale=add)]


@pytest.mark.parametrize("add", [None, "dynamic"], ids=["plain", "add-loss-scale"])
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_cleared_fixture_files_are_untouched_by_the_full_pipeline(folder: Path, add: str | None):
    admitted = _admitted(folder, add is not None)
    _, _, cleared = _triage(admitted, add_loss_scale=add is not None)
    if not cleared:
        return
    options = MigrateOptions(add_loss_scale=add)
    items = [(s.display, d) for s, d in admitted]
    outcomes, _ = _migrate_all(items, options, 1, list)
    results = dict(zip([s.display for s, _ in admitted], outcomes))
    for display in (s.display for s in cleared):
        result, error = results[display]
        assert error is None, display
        assert result is not None
        assert not result.changed, display
        assert list(result.findings) == [], display


@pytest.mark.parametrize("add", [None, "dynamic"], ids=["plain", "add-loss-scale"])
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_reading_only_the_plan_facts_of_put_back_files_changes_nothing(
    folder: Path, add: str | None
):
    # A file put back for the plan was cleared: the ports find nothing in it on their own, so
    # only its plan facts are read. The plan may still edit it (a class that takes the step
    # update), and then `finish` ports it whole: every outcome is the same either way.
    admitted = _admitted(folder, add is not None)
    kept, for_plan, _ = _triage(admitted, add_loss_scale=add is not None)
    if not for_plan:
        return
    options = MigrateOptions(add_loss_scale=add)
    items = [(s.display, d) for s, d in kept]
    whole, whole_plan = _migrate_all(items, options, 1, list)
    facts_only, plan = _migrate_all(items, options, 1, list, frozenset(for_plan))
    assert plan == whole_plan
    assert facts_only == whole


def test_some_fixture_files_are_put_back_for_the_plan_alone():
    # Non-vacuous: the property above meets a file the plan needs but the ports do not.
    put_back = [
        p for folder in FOLDERS for p in _triage(_admitted(folder, False), add_loss_scale=False)[1]
    ]
    assert put_back


LOSS_SCALE_TRAIN = """import tensorflow as tf

from mylib.opt import WarmupAdam


def build(loss, global_step):
    opt = WarmupAdam(1e-3)
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(
        opt, tf.contrib.mixed_precision.FixedLossScaleManager(128))
    train_op = opt.minimize(loss)
    new_global_step = global_step + 1
    return tf.group(train_op, [global_step.assign(new_global_step)])
"""

# Admitted by the byte gate (the word loss_scale in a comment), cleared by the ast read, but the
# train script's optimizer comes from here, so the plan must still see its class.
CLASS_FILE = '''"""Warm-up Adam; run with --loss_scale 128 for fp16."""
import tensorflow as tf
from cli_runner import MIGRATOR_FIXTURES


class WarmupAdam(tf.train.AdamOptimizer):
    pass
'''

FLAG_FILE = """import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--loss_scale", type=float, default=128.0)
FLAGS = parser.parse_args()
print(FLAGS.loss_scale * 2)
"""


def _project(root: Path, **more: str) -> list[tuple[SourceFile, bytes]]:
    """A training script, the class file its optimizer comes from, and `more` files (name without
    .py -> text); the files the byte pre-filter admits."""
    (root / "mylib").mkdir()
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "opt.py").write_text(CLASS_FILE)
    (root / "train.py").write_text(LOSS_SCALE_TRAIN)
    for name, text in more.items():
        (root / f"{name}.py").write_text(text)
    admitted = [(SourceFile(p, str(p)), p.read_bytes()) for p in sorted(root.rglob("*.py"))]
    return [(s, d) for s, d in admitted if might_need_migration(d)]


def test_cli_clears_a_flag_file_and_keeps_the_class_file_in_the_plan(tmp_path: Path):
    admitted = _project(tmp_path, flags=FLAG_FILE)
    full, for_plan, cleared = _triage(admitted, add_loss_scale=False)
    assert sorted(Path(s.display).name for s, _ in full) == ["opt.py", "train.py"]
    assert [Path(p).name for p in for_plan] == ["opt.py"]  # its plan facts only: see above
    assert [Path(s.display).name for s in cleared] == ["flags.py"]

    proc = run_cli(tmp_path, "--check", "--report", tmp_path / "r.json", cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    text = json.dumps(report)
    # The move resolved WarmupAdam in mylib/opt.py (the plan saw that file: without it the move is
    # refused with "not among the processed files") and took the update out of train.py.
    assert "not among the processed files" not in text, text
    assert "+    return train_op" in proc.stdout
    assert report["summary"]["warnings"] == 0, report["summary"]


# Cleared by the ast read (a hand-made step update, no loss-scale API), but it imports train.py, so
# its update may block a move there: put back for the plan, with the function's facts.
STEP_FILE = """import tensorflow as tf

from train import build


def train_more(loss, global_step):
    train_op = build(loss, global_step)
    return tf.group(train_op, global_step.assign_add(1))
"""


def test_plan_facts_alone_give_the_same_outcomes_on_a_project(tmp_path: Path):
    kept, for_plan, _ = _triage(_project(tmp_path, more=STEP_FILE), add_loss_scale=False)
    assert sorted(Path(p).name for p in for_plan) == ["more.py", "opt.py"]
    items = [(s.display, d) for s, d in kept]
    whole, whole_plan = _migrate_all(items, MigrateOptions(), 1, list)
    facts_only, plan = _migrate_all(items, MigrateOptions(), 1, list, frozenset(for_plan))
    assert plan == whole_plan
    assert facts_only == whole
    # Not vacuous: the move resolved WarmupAdam through opt.py's class facts.
    assert plan.global_step is not None and plan.global_step.moves, plan


def test_the_triage_in_two_processes_splits_a_project_as_one_process_does(tmp_path: Path):
    flags = {f"flags{i:03d}": FLAG_FILE for i in range(2 * TRIAGE_FILES_PER_WORKER)}
    admitted = _project(tmp_path, more=STEP_FILE, **flags)
    assert len(admitted) // TRIAGE_FILES_PER_WORKER >= 2  # enough files for two workers
    one = _triage(admitted, add_loss_scale=False, jobs=1)
    two = _triage(admitted, add_loss_scale=False, jobs=2)
    assert two == one
    # Not vacuous: put back for the plan through the imports the workers read.
    assert sorted(Path(p).name for p in two[1]) == ["more.py", "opt.py"]
    assert len(two[2]) == 2 * TRIAGE_FILES_PER_WORKER


def test_the_triage_workers_start_during_the_scan_and_a_killed_one_costs_no_verdict(
    tmp_path: Path,
) -> None:
    flags = {f"flags{i:03d}": FLAG_FILE for i in range(3 * TRIAGE_FILES_PER_WORKER)}
    admitted = _project(tmp_path, more=STEP_FILE, **flags)
    one = _triage(admitted, add_loss_scale=False, jobs=1)
    enough = 2 * TRIAGE_FILES_PER_WORKER
    with _Verdicts(add_loss_scale=False, jobs=2) as verdicts:
        for _, data in admitted[: enough - 1]:
            verdicts.add(data)
        assert verdicts._pool is None  # too few files yet for two workers
        verdicts.add(admitted[enough - 1][1])
        pool = verdicts._pool
        assert pool is not None  # reading while the scan goes on
        workers = list(pool._processes)  # started with the first batch
        assert len(workers) == 2
        for worker in workers:
            os.kill(worker, signal.SIGKILL)  # as the OOM killer would
        for _, data in admitted[enough:]:
            verdicts.add(data)
        read = verdicts.collect()
    assert _split(admitted, read) == one


def test_a_large_run_starts_its_triage_workers_with_the_first_batch(tmp_path: Path) -> None:
    flags = {f"flags{i:03d}": FLAG_FILE for i in range(TRIAGE_BATCH + 5)}
    admitted = _project(tmp_path, more=STEP_FILE, **flags)
    one = _triage(admitted, add_loss_scale=False, jobs=1)
    with _Verdicts(add_loss_scale=False, jobs=2, scanned=EARLY_TRIAGE_FILES) as verdicts:
        for _, data in admitted[: TRIAGE_BATCH - 1]:
            verdicts.add(data)
        assert verdicts._pool is None
        verdicts.add(admitted[TRIAGE_BATCH - 1][1])
        assert verdicts._pool is not None and len(verdicts._batches) == 1
        for _, data in admitted[TRIAGE_BATCH:]:
            verdicts.add(data)
        read = verdicts.collect()
        # The files left at the end are shared by the two workers, not read by one.
        assert len(verdicts._batches) == 3
    assert _split(admitted, read) == one
