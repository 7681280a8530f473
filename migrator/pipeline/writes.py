"""Writing a run's results: in place (--write) or into a mirrored tree (--output-dir).

The files of one global-step move that spans files are written together or not at all
(migrator.sources.files.write_together), and held back together when one of them failed to port:
a move applied in one file and not in the other leaves a script whose global_step never advances.
A move an earlier run left half that this run does not complete fails its file (report_half_moves).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from migrator.selection.half_moves import half_applied
from migrator.sources.files import (
    atomic_write,
    common_root,
    copy_file,
    mirrored_path,
    write_new_file,
    write_together,
)
from migrator.sources.module_paths import norm

if TYPE_CHECKING:
    from migrator.codemods.global_step import GlobalStepPlan
    from migrator.pipeline.outcomes import FileOutcome, RunConfig


def step_groups(plan: GlobalStepPlan | None) -> list[list[str]]:
    """The files of each global-step move that spans files, in the order to write them.

    A move takes the update out of a function (`plan.moves`) and puts it into the classes that
    function's optimizer uses (`plan.inserts`, named in the move's `where`); files sharing a class
    are one group. The class files come first: a run killed between two renames then leaves a
    step advanced twice rather than never; the next run completes either (the class's increment
    carries npu-migrate's comment, the trainer's note names the class).
    """
    if plan is None:
        return []
    parent: dict[str, str] = {}

    def find(path: str) -> str:
        while parent.setdefault(path, path) != path:
            path = parent[path]
        return path

    by_class: dict[str, list[str]] = {}
    for path, cls, _ in plan.inserts:
        by_class.setdefault(cls, []).append(path)
    for path, _, where in plan.moves:
        for cls in re.findall(r"(\w+)\.apply_gradients", where):
            for other in by_class.get(cls, []):
                parent[find(other)] = find(path)
    inserting = {path for path, _, _ in plan.inserts}
    members: dict[str, set[str]] = {}
    for path in list(parent):
        members.setdefault(find(path), set()).add(path)
    return [
        sorted(group, key=lambda p: (p not in inserting, p))
        for group in members.values()
        if len(group) > 1
    ]


def report_half_moves(outcomes: list[FileOutcome], read: Sequence[tuple[str, bytes]]) -> None:
    """Fail the files whose moved update will still point at a class that does not advance the
    step once this run's results are written (migrator.selection.half_moves): the plan completes
    the half-applied moves it safely can, and these are the others, left for the user to undo.

    `read` holds (path, bytes) of the files with `apply_gradients` in them as they were read.
    """
    by_path = {o.path: o for o in outcomes}
    after = dict(read)
    for outcome in outcomes:
        if outcome.status == "changed" and outcome.new is not None:
            after[outcome.path] = outcome.new
    for path, error in half_applied(after.items()).items():
        outcome = by_path.get(path)
        if outcome is not None:
            outcome.status = "failed"
            outcome.error = error


def hold_back(outcomes: list[FileOutcome], groups: list[list[str]]) -> None:
    """A move's files stay as they are when one of them failed: half a move is worse than none."""
    by_path = {norm(o.path): o for o in outcomes}
    for group in groups:
        members = [by_path[p] for p in group if p in by_path]
        failed = [o.path for o in members if o.status == "failed"]
        if not failed:
            continue
        for outcome in members:
            if outcome.status == "changed":
                outcome.status = "failed"
                outcome.error = (
                    f"left untouched: its global-step move continues in {', '.join(failed)}, "
                    "which failed; the files of one move are written together or not at all"
                )


def apply(
    outcomes: list[FileOutcome],
    config: RunConfig,
    inputs: Sequence[Path],
    groups: Sequence[Sequence[str]] = (),
) -> None:
    if config.mode == "diff":
        return
    root = common_root(inputs) if config.mode == "output-dir" else None
    by_path = {norm(o.path): o for o in outcomes}
    together: dict[int, list[FileOutcome]] = {}  # outcome id -> its group's changed files
    for group in groups:
        members = [by_path[p] for p in group if p in by_path and by_path[p].status == "changed"]
        if len(members) > 1:
            for outcome in members:
                together[id(outcome)] = members
    done: set[int] = set()
    for outcome in outcomes:
        if id(outcome) in done:
            continue
        try:
            if config.mode == "write":
                if id(outcome) in together:
                    _write_group(together[id(outcome)])
                    done.update(map(id, together[id(outcome)]))
                elif outcome.status == "changed":
                    assert outcome.new is not None
                    atomic_write(outcome.source.path, outcome.new)
            else:
                assert root is not None and config.output_dir is not None
                target = mirrored_path(outcome.source.path, root, config.output_dir)
                if outcome.status == "changed":
                    assert outcome.new is not None
                    write_new_file(target, outcome.new)
                elif config.copy_unchanged and (outcome.error is None or outcome.old is not None):
                    # Unparsable files are copied too: untouched, but the mirror stays complete.
                    copy_file(outcome.source.path, target)
        except OSError as exc:
            # Name what could not be written: with --output-dir it is not the input file.
            outcome.status = "failed"
            where = exc.filename or outcome.source.path
            outcome.error = f"cannot write {where}: {exc.strerror or exc}"


def _write_group(members: list[FileOutcome]) -> None:
    """One move's files, all or none (migrator.sources.files.write_together)."""
    try:
        write_together([(o.source.path, o.new or b"", o.old or b"") for o in members])
    except OSError as exc:
        where = exc.filename or members[0].source.path
        for outcome in members:
            outcome.status = "failed"
            outcome.error = (
                f"cannot write {where}: {exc.strerror or exc}"
                if str(where) == str(outcome.source.path)
                else f"left untouched: its global-step move continues in {where}, which could "
                f"not be written ({exc.strerror or exc}); the files of one move are written "
                "together or not at all"
            )
