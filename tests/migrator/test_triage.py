"""The `ast` triage clears only files the full libcst pipeline leaves unchanged and unreported.

Proven on every migrator fixture, folder by folder as one project each (cross-file facts included):
the full pipeline runs over every file the byte pre-filter admits, exactly as before the triage
existed, and every file the triage clears must come out unchanged with no finding. Then the CLI
shows what the triage buys: a flag named `loss_scale` no longer costs a libcst parse, while a
class file another file's optimizer comes from is still seen by the global-step plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, run_cli

from migrator.pipeline.runner import _migrate_all, _triage
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
    _, cleared = _triage(admitted, add_loss_scale=add is not None)
    if not cleared:
        return
    options = MigrateOptions(add_loss_scale=add)
    items = [(s.display, d) for s, d in admitted]
    outcomes, _ = _migrate_all(items, options, 1, list)
    results = dict(zip([s.display for s, _ in admitted], outcomes))
    for source in cleared:
        result, error = results[source.display]
        assert error is None, source.display
        assert result is not None
        assert not result.changed, source.display
        assert list(result.findings) == [], source.display


def test_the_triage_clears_some_fixtures_and_never_a_changed_one():
    # Non-vacuous: the property above is checked on real cleared files, and every fixture the
    # port changes (cases/ has an expected/ twin) is sent to the full pass.
    cleared_total = 0
    for folder in FOLDERS:
        admitted = _admitted(folder, False)
        full, cleared = _triage(admitted, add_loss_scale=False)
        cleared_total += len(cleared)
        changed = {p.name for p in (FIXTURES / "expected").glob("*.py")}
        if folder.name == "cases":
            assert not {Path(s.display).name for s in cleared} & changed
    assert cleared_total >= 3


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


def test_cli_clears_a_flag_file_and_keeps_the_class_file_in_the_plan(tmp_path: Path):
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "opt.py").write_text(CLASS_FILE)
    (tmp_path / "train.py").write_text(LOSS_SCALE_TRAIN)
    (tmp_path / "flags.py").write_text(FLAG_FILE)
    admitted = [(SourceFile(p, str(p)), p.read_bytes()) for p in sorted(tmp_path.rglob("*.py"))]
    admitted = [(s, d) for s, d in admitted if might_need_migration(d)]
    full, cleared = _triage(admitted, add_loss_scale=False)
    assert sorted(Path(s.display).name for s, _ in full) == ["opt.py", "train.py"]
    assert [Path(s.display).name for s in cleared] == ["flags.py"]

    proc = run_cli(tmp_path, "--check", "--report", tmp_path / "r.json", cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    text = json.dumps(report)
    # The move resolved WarmupAdam in mylib/opt.py (the plan saw that file: without it the move is
    # refused with "not among the processed files") and took the update out of train.py.
    assert "not among the processed files" not in text, text
    assert "+    return train_op" in proc.stdout
    assert report["summary"]["warnings"] == 0, report["summary"]
