"""The per-file pipeline: read, pre-filter, plan, migrate (in worker processes if worth it), apply.

Presentation (diffs, messages, reports) lives elsewhere; this module decides *what happened* to each
file and performs the writes, so every output format describes the same facts. The transform is
imported lazily: a tree with nothing to port never pays for loading libcst.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from migrator.files import (
    SourceFile,
    atomic_write,
    common_root,
    copy_file,
    mirrored_path,
    write_new_file,
)
from migrator.findings import Finding, MigrationResult, SourceError

if TYPE_CHECKING:
    from migrator.transform import MigrateOptions, ProjectPlan

Mode = Literal["diff", "write", "output-dir"]
Status = Literal["unchanged", "changed", "failed"]

# A worker process costs a fork plus its share of pickling; below this many candidate files per
# worker the pool is slower than doing the work in place.
MIN_FILES_PER_WORKER = 4


@dataclass
class FileOutcome:
    """What happened to one discovered file; `old`/`new` are kept only for migrated files."""

    source: SourceFile
    status: Status
    findings: list[Finding] = field(default_factory=list)
    old: bytes | None = None
    new: bytes | None = None
    error: str | None = None

    @property
    def path(self) -> str:
        return self.source.display

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.kind != "change"]

    @property
    def changes(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "change"]


@dataclass
class RunConfig:
    mode: Mode = "diff"
    output_dir: Path | None = None
    copy_unchanged: bool = False
    jobs: int = 1
    distributed: str = "auto"


@dataclass
class RunResult:
    outcomes: list[FileOutcome]
    seconds: float
    mode: Mode

    @property
    def scanned(self) -> int:
        return len(self.outcomes)

    @property
    def changed(self) -> int:
        return sum(o.status == "changed" for o in self.outcomes)

    @property
    def warnings(self) -> int:
        return sum(len(o.warnings) for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


def _read(source: SourceFile) -> tuple[bytes | None, str | None]:
    try:
        return source.path.read_bytes(), None
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"


def migrate_one(
    path: str, source: bytes, options: MigrateOptions, plan: ProjectPlan | None
) -> tuple[MigrationResult | None, str | None]:
    """Migrate one file, turning every way it can fail into a reason instead of an abort.

    A crash inside a codemod on one odd file must not stop a project-wide run nor touch that file,
    so unexpected exceptions become a failure the report names (and asks to be reported).
    """
    from migrator.transform import migrate_source

    try:
        return migrate_source(source, path=path, options=options, plan=plan), None
    except SourceError as exc:
        return None, str(exc) or "cannot parse"
    except RecursionError:
        return None, "too deeply nested for the parser"
    except Exception as exc:  # see docstring: one odd file must not abort the run
        return None, f"internal error in npu-migrate ({type(exc).__name__}: {exc}); left untouched"


_worker_state: tuple[MigrateOptions, ProjectPlan | None] | None = None


def _init_worker(options: MigrateOptions, plan: ProjectPlan | None) -> None:
    # The plan can be large; shipping it once per worker instead of once per file.
    global _worker_state
    _worker_state = (options, plan)


def _migrate_in_worker(item: tuple[str, bytes]) -> tuple[MigrationResult | None, str | None]:
    assert _worker_state is not None
    return migrate_one(item[0], item[1], *_worker_state)


def _migrate_all(
    items: list[tuple[str, bytes]],
    options: MigrateOptions,
    plan: ProjectPlan | None,
    jobs: int,
    tick: Callable[[], None],
) -> list[tuple[MigrationResult | None, str | None]]:
    workers = min(jobs, len(items) // MIN_FILES_PER_WORKER)
    results: list[tuple[MigrationResult | None, str | None]] = []
    if workers <= 1:
        for path, data in items:
            results.append(migrate_one(path, data, options, plan))
            tick()
        return results
    from concurrent.futures import ProcessPoolExecutor

    chunksize = max(1, len(items) // (workers * 8))
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_init_worker, initargs=(options, plan)
    ) as pool:
        for result in pool.map(_migrate_in_worker, items, chunksize=chunksize):
            results.append(result)
            tick()
    return results


def run(
    files: Sequence[SourceFile],
    config: RunConfig,
    inputs: Sequence[Path],
    progress: Callable[[int], _ProgressContext] | None = None,
    listing_errors: Iterable[tuple[str, str]] = (),
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
    pending: list[tuple[SourceFile, bytes]] = []
    filter_fn: Callable[[bytes], bool] | None = None
    for source in files:
        data, error = _read(source)
        if data is None:
            outcomes.append(FileOutcome(source, "failed", error=error))
            continue
        if filter_fn is None:
            from migrator.transform import might_need_migration

            filter_fn = might_need_migration
        if filter_fn(data):
            pending.append((source, data))
        else:
            outcomes.append(FileOutcome(source, "unchanged"))

    if pending:
        from migrator.transform import MigrateOptions, plan_project

        options = MigrateOptions(distributed=config.distributed)  # type: ignore[arg-type]
        plan = plan_project({s.display: data for s, data in pending})
        items = [(s.display, data) for s, data in pending]
        with (progress or _no_progress)(len(items)) as bar:
            results = _migrate_all(items, options, plan, config.jobs, bar.tick)
        for (source, data), (result, error) in zip(pending, results):
            if result is None:
                outcomes.append(FileOutcome(source, "failed", old=data, error=error))
            else:
                status: Status = "changed" if result.changed else "unchanged"
                outcomes.append(
                    FileOutcome(source, status, list(result.findings), data, result.new_source)
                )

    outcomes.sort(key=lambda o: o.path)
    _apply(outcomes, config, inputs)
    return RunResult(outcomes, time.perf_counter() - start, config.mode)


def _apply(outcomes: list[FileOutcome], config: RunConfig, inputs: Sequence[Path]) -> None:
    if config.mode == "diff":
        return
    root = common_root(inputs) if config.mode == "output-dir" else None
    for outcome in outcomes:
        try:
            if config.mode == "write":
                if outcome.status == "changed":
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
            outcome.status = "failed"
            outcome.error = f"cannot write: {exc.strerror or exc}"


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
