"""The per-file pipeline: read, pre-filter, plan, migrate (in worker processes if worth it), apply.

Presentation (diffs, messages, reports) lives elsewhere; this module decides *what happened* to each
file and has them written (migrator.pipeline.writes), so every output format describes the same
facts. The transform is
imported lazily: a tree with nothing to port never pays for loading libcst.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from migrator import registry
from migrator.codemods.shared.alignment import realign
from migrator.findings import Finding, MigrationResult, SourceError
from migrator.pipeline.outcomes import FileOutcome, RunConfig, RunResult, Status
from migrator.pipeline.output_check import output_error
from migrator.pipeline.processes import configure_process, one_file, watch_parent
from migrator.pipeline.writes import apply, hold_back, report_half_moves, step_groups
from migrator.selection import auto_mixed_precision
from migrator.selection.horovod_importers import horovod_inits
from migrator.selection.horovod_sites import init_sites, name_init_sites
from migrator.selection.keras_helpers import KerasHelper, legacy_keras_helpers
from migrator.selection.loss_scale_modules import builds_loss_scale_optimizer
from migrator.selection.prefilter import might_need_migration
from migrator.selection.reexports import imported_from
from migrator.selection.scaler_attrs import other_scaler_attrs
from migrator.selection.scaler_helpers import ScalerHelper, calls_helper, scaler_helpers
from migrator.selection.strategy_importers import builds_strategy, strategy_importers
from migrator.selection.triage import Verdict, imports, parses, verdict, widen
from migrator.sources import limits, pytree
from migrator.sources.files import SourceFile
from migrator.sources.module_paths import norm

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from migrator.codemods.global_step import GlobalStepFacts
    from migrator.pipeline.transform import MigrateOptions, PreparedFile, ProjectPlan

WORKER_DIED = (
    "a worker process died while porting it (killed, or a crash in the parser); left untouched: "
    "run npu-migrate again (with -j 1 to see which file is at fault)"
)
# A worker process costs a fork plus its share of pickling; below this many candidate files per
# worker the pool is slower than doing the work in place.
MIN_FILES_PER_WORKER = 4


def _read(source: SourceFile) -> tuple[bytes | None, str | None]:
    try:
        return source.path.read_bytes(), None
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"


_Outcome = tuple[MigrationResult | None, str | None]
_Prepared = tuple["PreparedFile | None", "GlobalStepFacts | None", "str | None"]


def _guarded(work: Callable[[], MigrationResult], source: bytes) -> _Outcome:
    """Run one file's work, turning every way it can fail into a reason instead of an abort.

    A crash inside a codemod on one odd file must not stop a project-wide run nor touch that file,
    so unexpected exceptions become a failure the report names (and asks to be reported).
    """
    try:
        return work(), None
    except SourceError as exc:
        return None, str(exc) or "cannot parse"
    except RecursionError:
        line = limits.deepest_line(source)
        where = f"{line}:1: " if line is not None else ""
        return (
            None,
            f"{where}too deeply nested for the parser; split the expression, or port "
            "this file by hand",
        )
    except Exception as exc:  # see docstring: one odd file must not abort the run
        return None, f"internal error in npu-migrate ({type(exc).__name__}: {exc}); left untouched"


def prepare_one(
    path: str, source: bytes, options: MigrateOptions, facts_only: bool = False
) -> _Prepared:
    """First pass over one file: its plan facts and, when it prepared cleanly, the prepared file.

    A file whose port fails is still scanned on its own, so that one failing file does not change
    what the plan decides for the others. `facts_only`: see `transform.prepare_source`.
    """
    from migrator.pipeline.transform import prepare_source, scan_source

    prepared: PreparedFile | None = None

    def work() -> MigrationResult:
        nonlocal prepared
        prepared = prepare_source(source, path=path, options=options, facts_only=facts_only)
        return prepared.ported

    with one_file():
        _, error = _guarded(work, source)
        if prepared is not None:
            return prepared, prepared.facts, None
        try:
            facts = scan_source(source, path=path)
        except Exception:  # the failure is reported through `error` already
            facts = None
    return None, facts, error


def finish_one(prepared: PreparedFile, plan: ProjectPlan, options: MigrateOptions) -> _Outcome:
    """Second pass: the file's final result under the project plan, checked to parse."""
    from migrator.pipeline.transform import finish

    with one_file():
        result, error = _guarded(lambda: finish(prepared, plan, options), _user_bytes(prepared))
        if result is not None and result.changed:
            # Calls whose opening bracket moved keep their continuation lines aligned with it.
            starts = _user_starts(prepared)
            result = dataclasses.replace(
                result, new_source=realign(result.old_source, result.new_source, starts)
            )
            error = output_error(result.old_source, result.new_source, starts)
            if error is not None:
                return None, error
    return result, error


def _user_starts(prepared: PreparedFile) -> tuple[int, ...] | None:
    """Where the top-level statements of `_user_bytes` start (0-based lines), where known."""
    if prepared.view is not None:
        return prepared.view.starts
    if prepared.original is None:
        return prepared.starts or None
    return None


def _user_bytes(prepared: PreparedFile) -> bytes:
    """The file as the user wrote it (not a long file's view, nor with loss scaling added)."""
    if prepared.view is not None:
        return prepared.view.original
    return prepared.original or prepared.source


_worker_options: MigrateOptions | None = None


def _init_worker(options: MigrateOptions) -> None:
    global _worker_options
    _worker_options = options
    configure_process()
    watch_parent()


def _init_triage_worker() -> None:
    configure_process()
    watch_parent()


# A file's result under the plan of its own facts, with that plan's share for it (`plan_share`).
_Alone = tuple[tuple[object, ...], _Outcome]


def _prepare_in_worker(
    item: tuple[str, bytes, bool],
) -> tuple[_Prepared, _Outcome | None, _Alone | None]:
    """The file prepared, and finished already under a plan that moves nothing (`NO_PLAN`): the
    final result of nearly every file, computed here in parallel instead of one by one in the
    parent once the plan is known (the checks of the user's own bytes, realignment and the parse
    check of a port were 3.3 s of the parent's time on the dense speed tree).

    A file the global-step move edits on its own facts (a BERT fork's optimization.py defines
    the optimizer and advances the step by hand) is finished under that plan too: the project's
    nearly always holds the same for it, and then that is its result. Finished after the plan,
    such files kept both workers for the last second of the dense tree's run."""
    from migrator.pipeline.transform import NO_PLAN, is_cheap_to_finish, plan_from_facts, plan_share

    assert _worker_options is not None
    path, source, facts_only = item
    prepared = prepare_one(path, source, _worker_options, facts_only)
    if prepared[0] is None:
        return prepared, None, None
    done = finish_one(prepared[0], NO_PLAN, _worker_options)
    own = plan_from_facts([prepared[1]])
    if is_cheap_to_finish(prepared[0], own):
        return prepared, done, None
    alone = finish_one(prepared[0], own, _worker_options)
    return prepared, done, (plan_share(prepared[0], own), alone)


def _finish_in_worker(item: tuple[PreparedFile, ProjectPlan]) -> _Outcome:
    assert _worker_options is not None
    return finish_one(item[0], item[1], _worker_options)


def _migrate_all(
    items: list[tuple[str, bytes]],
    options: MigrateOptions,
    jobs: int,
    tick: Callable[[], None],
    facts_only: frozenset[str] = frozenset(),
) -> tuple[list[_Outcome], ProjectPlan]:
    """Prepare every file (in worker processes if worth it), plan, then finish every file.

    Preparing is the expensive part and independent per file; the plan needs all files' facts;
    finishing is cheap except for the few files the global-step move edits. In worker processes
    a file is finished as it is prepared, under a plan that moves nothing (and one the move edits
    on its own facts under that plan too, `_prepare_in_worker`), and that result stands unless the
    project plan edits or warns about the file otherwise. The files whose paths are in
    `facts_only` are here for the plan alone (`_triage`).
    """
    from migrator.pipeline.transform import is_cheap_to_finish, plan_from_facts, plan_share

    workers = min(jobs, len(items) // MIN_FILES_PER_WORKER)
    if workers <= 1:
        prepared = []
        for path, data in items:
            prepared.append(prepare_one(path, data, options, path in facts_only))
            tick()
        plan = plan_from_facts(facts for _, facts, _ in prepared)
        return [
            finish_one(p, plan, options) if p is not None else (None, error)
            for p, _, error in prepared
        ], plan
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # Largest files first, one at a time: the cost of a file grows with its size, and handing
    # out the small ones last keeps every worker busy until the end (in chunks of files in path
    # order, one worker was left porting the last chunk alone).
    order = sorted(range(len(items)), key=lambda i: -len(items[i][1]))
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_init_worker, initargs=(options,)
    ) as pool:
        answers: dict[int, tuple[_Prepared, _Outcome | None, _Alone | None]] = {}
        broken = False
        try:
            flagged = [(items[i][0], items[i][1], items[i][0] in facts_only) for i in order]
            for index, answer in zip(order, pool.map(_prepare_in_worker, flagged)):
                answers[index] = answer
                tick()
        except BrokenProcessPool:
            # A worker was killed (the OOM killer, a signal) or crashed: the run goes on without
            # the files it had not answered for, which fail alone.
            broken = True
        lost: tuple[_Prepared, None, None] = ((None, None, WORKER_DIED), None, None)
        rows = [answers.get(i, lost) for i in range(len(items))]
        prepared = [row[0] for row in rows]
        early = [row[1] for row in rows]
        plan = plan_from_facts(facts for _, facts, _ in prepared)
        reworked: dict[int, _Outcome] = {}
        for (p, _, _), _, alone in rows:
            if p is not None and alone is not None and alone[0] == plan_share(p, plan):
                reworked[id(p)] = alone[1]
        # Only files the move edits are worth a round trip to a worker (none to a broken pool).
        heavy = [
            p
            for p, _, _ in prepared
            if p is not None
            and id(p) not in reworked
            and not broken
            and not is_cheap_to_finish(p, plan)
        ]
        try:
            finished = list(pool.map(_finish_in_worker, [(p, plan) for p in heavy]))
        except BrokenProcessPool:
            finished = [(None, WORKER_DIED)] * len(heavy)
        reworked.update(zip(map(id, heavy), finished))
    return [
        (None, error)
        if p is None
        else reworked[id(p)]
        if id(p) in reworked
        else _final(p, done, plan, options)
        for (p, _, error), done in zip(prepared, early)
    ], plan


def _final(
    prepared: PreparedFile, done: _Outcome | None, plan: ProjectPlan, options: MigrateOptions
) -> _Outcome:
    """A file's outcome under `plan`, from `done`, its outcome under NO_PLAN where a worker
    finished it so: the same where the plan neither edits nor warns about the file, the same with
    the plan's warnings sorted in where it only warns (`with_plan_warnings`), else finished here.
    """
    from migrator.pipeline.transform import plan_matters, with_plan_warnings

    if done is None:
        return finish_one(prepared, plan, options)
    result = done[0]
    if not plan_matters(prepared, plan):
        return done
    warned = with_plan_warnings(prepared, plan, options, result) if result is not None else None
    return (warned, None) if warned is not None else finish_one(prepared, plan, options)


def run(
    files: Sequence[SourceFile],
    config: RunConfig,
    inputs: Sequence[Path],
    progress: Callable[[int], _ProgressContext] | None = None,
    listing_errors: Iterable[tuple[str, str]] = (),
    outside: Iterable[tuple[SourceFile, str]] = (),
) -> RunResult:
    """Process `files` and apply the results according to `config.mode`.

    `listing_errors` are (path, reason) of directories discovery could not list; they count as
    failed so the exit code and reports show that part of the tree was not looked at.
    """
    start = time.perf_counter()
    outcomes: list[FileOutcome] = [
        FileOutcome(SourceFile(Path(path), path), "failed", error=reason)
        for path, reason in listing_errors
    ]
    outcomes += [
        FileOutcome(
            source,
            "unchanged",
            [
                Finding(
                    source.display,
                    1,
                    registry.SYMLINK_OUTSIDE,
                    f"a symlink to {target}, outside the paths given: not followed, so nothing "
                    "outside them is rewritten; name the target itself to port it",
                    "warning",
                )
            ],
        )
        for source, target in outside
    ]
    pending: list[tuple[SourceFile, bytes]] = []
    groups: list[list[str]] = []  # files of one global-step move: written all or none
    read: list[tuple[str, bytes]] = []  # files a global-step move may have touched
    sites: list[tuple[str, int]] = []  # where the run initialises Horovod, for the warnings
    reexports: set[tuple[str, str]] = set()  # what files import from each other, by name
    keras_helpers: set[KerasHelper] = set()  # functions that set TF_USE_LEGACY_KERAS
    loss_scale_modules: set[str] = set()  # modules that build a LossScaleOptimizer
    scaler_attrs: set[str] = set()  # self.<attr> given a scaler the port does not build
    helpers: set[ScalerHelper] = set()  # functions that build a scaler
    quiet: list[tuple[SourceFile, bytes]] = []  # no trigger: only a helper call may matter
    builders: list[tuple[str, bytes]] = []  # files that build a tf.distribute strategy
    every: list[str] = []  # the paths of every file read, which their imports may name
    add_loss_scale = config.add_loss_scale is not None
    with _Verdicts(add_loss_scale=add_loss_scale, jobs=config.jobs, scanned=len(files)) as verdicts:
        for source in files:
            data, error = _read(source)
            if data is None:
                outcomes.append(FileOutcome(source, "failed", error=error))
                continue
            if b"apply_gradients" in data:  # what a half-applied global-step move involves
                read.append((source.display, data))
            sites += init_sites([(source.display, data)])
            reexports |= imported_from(data)
            keras_helpers |= legacy_keras_helpers(source.display, data)
            builder = builds_loss_scale_optimizer(source.display, data)
            if builder is not None:
                loss_scale_modules.add(builder)
            scaler_attrs |= other_scaler_attrs(data)
            helpers |= scaler_helpers(source.display, data)
            every.append(norm(source.display))
            if builds_strategy(data):
                builders.append((source.display, data))
            if might_need_migration(data, add_loss_scale=add_loss_scale) or (
                source.named and not parses(data)  # the full pass reports why, in its own words
            ):
                pending.append((source, data))
                verdicts.add(data)
            else:
                quiet.append((source, data))
        # While the workers read the admitted files, what needs no verdict.
        # a file calling another file's scaler helper may rely on a scale below 1 (below_one)
        built_by_helpers = frozenset(helpers)
        quiet_callers = [
            bool(built_by_helpers) and calls_helper(d, built_by_helpers) for _, d in quiet
        ]

        def options_of_run() -> MigrateOptions:
            """The options and cross-file facts every file's port is given."""
            from migrator.pipeline.transform import MigrateOptions

            return MigrateOptions(
                distributed=config.distributed,  # type: ignore[arg-type]
                add_loss_scale=config.add_loss_scale,
                target=config.target,
                reexports=frozenset(reexports),
                keras_helpers=frozenset(keras_helpers),
                loss_scale_modules=frozenset(loss_scale_modules),
                scaler_attrs=frozenset(scaler_attrs),
                scaler_helpers=built_by_helpers,
                strategy_importers=strategy_importers(builders, every),
                horovod_inits=horovod_inits(sites, every),
            )

        options = options_of_run() if pending else None
        read_back = verdicts.collect()
    admitted = {s.display: d for s, d in pending}
    pending, for_plan, cleared = _split(pending, read_back)
    facts_only = frozenset(
        s.display
        for s, data in pending
        if s.display in for_plan and not calls_helper(data, built_by_helpers)
    )
    others = [(s, admitted[s.display]) for s in cleared]
    callers = quiet_callers + [
        bool(built_by_helpers) and calls_helper(d, built_by_helpers) for _, d in others
    ]
    for (source, data), caller in zip(quiet + others, callers):
        if caller:
            pending.append((source, data))
        else:
            # Nothing to port or plan, but a switch only NVIDIA's TensorFlow reads is still said.
            found = auto_mixed_precision.findings(data, source.display)
            kept = (data, data) if found else (None, None)
            outcomes.append(FileOutcome(source, "unchanged", found, *kept))

    if pending:
        if options is None:  # only files calling a helper are left
            options = options_of_run()
        items = [(s.display, data) for s, data in pending]
        with (progress or _no_progress)(len(items)) as bar:
            results, plan = _migrate_all(items, options, config.jobs, bar.tick, facts_only)
        groups = step_groups(plan.global_step)
        for (source, data), (result, error) in zip(pending, results):
            if result is None:
                outcomes.append(FileOutcome(source, "failed", old=data, error=error))
            else:
                status: Status = "changed" if result.changed else "unchanged"
                outcomes.append(
                    FileOutcome(source, status, list(result.findings), data, result.new_source)
                )

    pytree.forget()
    for outcome in outcomes:
        outcome.findings = name_init_sites(outcome.findings, sites)
    outcomes.sort(key=lambda o: o.path)
    report_half_moves(outcomes, read)
    hold_back(outcomes, groups)
    apply(outcomes, config, inputs, groups)
    return RunResult(outcomes, time.perf_counter() - start, config.mode)


def _triage(
    pending: list[tuple[SourceFile, bytes]], *, add_loss_scale: bool, jobs: int = 1
) -> tuple[list[tuple[SourceFile, bytes]], set[str], list[SourceFile]]:
    """Split the byte-admitted files into those the codemods must see and those they cannot touch.

    See migrator.selection.triage: an `ast` read of each file decides, then the files the
    global-step plan needs beside the others are put back, so the plan sees what it would see
    without the triage. Returns the files to process, the paths among them put back for the
    plan alone (nothing in them to port on their own), and the cleared files.
    """
    with _Verdicts(add_loss_scale=add_loss_scale, jobs=jobs) as verdicts:
        for _, data in pending:
            verdicts.add(data)
        return _split(pending, verdicts.collect())


def _split(
    pending: list[tuple[SourceFile, bytes]], read: list[tuple[Verdict, frozenset[str]]]
) -> tuple[list[tuple[SourceFile, bytes]], set[str], list[SourceFile]]:
    """`_triage`'s answer from each file's verdict and imports."""
    full = {s.display: m for (s, _), (v, m) in zip(pending, read) if v == "full"}
    rest = {s.display: (m, v == "step") for (s, _), (v, m) in zip(pending, read) if v != "full"}
    for_plan = widen(rest, full)
    keep = full.keys() | for_plan
    return (
        [(s, d) for s, d in pending if s.display in keep],
        for_plan,
        [s for s, _ in pending if s.display not in keep],
    )


# An `ast` read for the triage costs about 10 ms a file; below this many admitted files per
# worker, forking and pickling cost more than the reads they share.
TRIAGE_FILES_PER_WORKER = 50
# Files handed to a worker at a time.
TRIAGE_BATCH = 16
# A run over this many files starts its triage workers with the first batch: scanning that many
# takes longer than starting them (waiting for enough files for two, the workers sat idle for the
# first half second of the dense tree's scan).
EARLY_TRIAGE_FILES = 1000


class _Verdicts:
    """Each admitted file's verdict and imports, read in worker processes from the moment there
    are enough files for two, while the parent goes on scanning the tree.

    Read after the scan, in a pool of their own, the reads left the parent idle for 3 s of the
    dense speed tree's run, after a 2 s scan that left the workers idle. What a broken pool (a
    worker killed) did not answer is read here, in the parent; so are all reads where there are
    too few files, or `jobs` is 1.
    """

    def __init__(self, *, add_loss_scale: bool, jobs: int, scanned: int = 0) -> None:
        """`scanned`: how many files the run reads (admitted or not)."""
        self._add_loss_scale = add_loss_scale
        self._jobs = jobs
        early = scanned >= EARLY_TRIAGE_FILES
        self._start = TRIAGE_BATCH if early else 2 * TRIAGE_FILES_PER_WORKER
        self._files: list[bytes] = []
        self._sent = 0  # files [0, _sent) are in `_batches`
        self._batches: list[Future[list[tuple[Verdict, frozenset[str]]]]] = []
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Verdicts:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            for batch in self._batches:
                batch.cancel()  # those not started yet, when the run ends early
            self._pool.shutdown()

    def add(self, data: bytes) -> None:
        self._files.append(data)
        if self._pool is None and self._jobs > 1:
            if len(self._files) < self._start:
                return
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                max_workers=self._jobs, initializer=_init_triage_worker
            )
        if self._pool is not None and len(self._files) - self._sent >= TRIAGE_BATCH:
            self._send()

    def _send(self, parts: int = 1) -> None:
        """Hand the files not sent yet to the workers, in `parts` batches."""
        from concurrent.futures.process import BrokenProcessPool

        assert self._pool is not None
        rest = [(data, self._add_loss_scale) for data in self._files[self._sent :]]
        size = -(-len(rest) // parts)
        try:
            for start in range(0, len(rest), size):
                self._batches.append(self._pool.submit(_triage_batch, rest[start : start + size]))
        except BrokenProcessPool:
            return  # read here by `collect`
        self._sent = len(self._files)

    def collect(self) -> list[tuple[Verdict, frozenset[str]]]:
        """Every added file's verdict and imports, in the order added."""
        from concurrent.futures.process import BrokenProcessPool

        if self._pool is not None and self._sent < len(self._files):
            self._send(parts=self._jobs)  # the last files, shared by the workers
        done: list[tuple[Verdict, frozenset[str]]] = []
        try:
            for batch in self._batches:
                done += batch.result()
        except BrokenProcessPool:
            pass
        return done + [_triage_one((d, self._add_loss_scale)) for d in self._files[len(done) :]]


def _triage_batch(items: list[tuple[bytes, bool]]) -> list[tuple[Verdict, frozenset[str]]]:
    return [_triage_one(item) for item in items]


def _triage_one(item: tuple[bytes, bool]) -> tuple[Verdict, frozenset[str]]:
    data, add_loss_scale = item
    with one_file():
        return verdict(data, add_loss_scale=add_loss_scale), imports(data)


class _ProgressContext:
    """The minimal protocol `run` needs from a progress display."""

    def __enter__(self) -> _ProgressContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def tick(self) -> None:
        return None


def _no_progress(total: int) -> _ProgressContext:
    return _ProgressContext()
