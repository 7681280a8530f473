"""`npu-migrate`: port tf.contrib.mixed_precision training scripts to the npu_lossscale library.

Only argument handling and console output live here. The module imports nothing heavier than click
at start-up, so `npu-migrate --help` answers at once and never loads TensorFlow or libcst.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from collections.abc import Callable

    from migrator.pipeline.outcomes import RunResult
    from migrator.sources.git_state import WorkTree

EXIT_OK = 0
EXIT_CHANGES_PENDING = 1
EXIT_USAGE = 2
EXIT_FAILED = 123

# Below this many files to migrate a progress bar only flickers.
PROGRESS_MIN_FILES = 50
_LOCATED = re.compile(r"\d+:\d+: ")

EPILOG = f"""\b
Modes:
  (default)      print a unified diff on stdout, write nothing
  --check        same, and exit {EXIT_CHANGES_PENDING} when anything would change
  --write        rewrite files in place (atomically, permissions kept)
  --output-dir   write migrated files into a mirrored tree

\b
Exit codes:
  {EXIT_OK}    nothing to change, or all changes written
  {EXIT_CHANGES_PENDING}    --check: some file would change
  {EXIT_USAGE}    usage error (bad option, missing path, conflicting options)
  {EXIT_FAILED}  some file could not be read, decoded, parsed or written (or a report could
       not be written); those files are left untouched, the others are processed.
       Takes precedence over {EXIT_CHANGES_PENDING}.
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("npu-lossscale")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _check_loss_scale(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    from migrator.codemods.shared.add_loss_scale_choice import manager_call

    if value is not None:
        try:
            manager_call(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"npu-migrate {_version()}")
        ctx.exit(EXIT_OK)


class _ClickProgress:
    """Adapts click.progressbar to the runner's tick() protocol."""

    def __init__(self, total: int) -> None:
        self._bar = click.progressbar(length=total, label="migrating", file=sys.stderr)

    def __enter__(self) -> _ClickProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def tick(self) -> None:
        self._bar.update(1)


def _progress_factory(quiet: bool) -> Callable[[int], object]:
    from migrator.pipeline.runner import _no_progress

    if quiet or not sys.stderr.isatty():
        return _no_progress

    def make(total: int) -> object:
        return _ClickProgress(total) if total >= PROGRESS_MIN_FILES else _no_progress(total)

    return make


def _available_cpus() -> int:
    # The CPUs this process may run on (a container or taskset may allow fewer than exist).
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _use_color(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _write_stdout(data: bytes) -> None:
    """Diff bytes to stdout whatever the locale, surviving a closed pipe."""
    stream = click.get_binary_stream("stdout")
    try:
        stream.write(data)
        stream.flush()
    except BrokenPipeError:
        # `npu-migrate . | head`: stop printing, but still finish the run (reports, summary).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--write", is_flag=True, help="Rewrite changed files in place.")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write migrated files under DIR, mirroring their paths relative to the inputs' "
    "common directory; the originals are not touched.",
)
@click.option(
    "--copy-unchanged",
    is_flag=True,
    help="With --output-dir: also copy files that need no change (byte for byte).",
)
@click.option("--check", is_flag=True, help="Exit 1 when any file would change (CI, pre-commit).")
@click.option(
    "--report",
    "reports",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a report of every change, warning and failure; the format follows the suffix: "
    ".json, .md or .html. Repeatable.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes for migrating files [default: number of CPUs].",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Skip paths matching GLOB (relative path, any leading directory, or file name). "
    "Repeatable.",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print only errors and the diff (no warnings, progress or summary).",
)
@click.option(
    "--distributed",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Whether migrated optimizers all-reduce the overflow status: 'auto' detects "
    "Horovod/distribution strategies in the file.",
)
@click.option(
    "--add-loss-scale",
    metavar="dynamic|N",
    default=None,
    callback=_check_loss_scale,
    help="Give loss scaling to scripts that have none: wrap their tf.compat.v1 optimizers in "
    "NPULossScaleOptimizer with a dynamic scale (the vendor guide's values) or a fixed scale N.",
)
@click.option(
    "--target",
    type=click.Choice(["npulossscale", "npu-bridge"]),
    default="npulossscale",
    show_default=True,
    help="What the ported TF1 code imports: npu_lossscale, or the Ascend adapter's own classes "
    "(from npu_bridge.npu_init import *), for hosts that keep only the vendor's runtime.",
)
@click.option(
    "--color/--no-color",
    default=None,
    help="Colour the diff [default: when stdout is a terminal and NO_COLOR is unset].",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
def cli(
    paths: tuple[Path, ...],
    write: bool,
    output_dir: Path | None,
    copy_unchanged: bool,
    check: bool,
    reports: tuple[Path, ...],
    jobs: int | None,
    exclude: tuple[str, ...],
    quiet: bool,
    distributed: str,
    add_loss_scale: str | None,
    target: str,
    color: bool | None,
) -> None:
    """Port loss-scaling scripts to npu_lossscale: TF1 (tf.contrib.mixed_precision, tf.train),
    Keras/TF2 (mixed_precision.LossScaleOptimizer) and PyTorch (torch.cuda.amp.GradScaler).

    PATHS are files and directories; directories are searched for *.py files recursively
    (hidden directories, venv/.venv, __pycache__, site-packages and node_modules are skipped).
    By default a unified diff is printed and nothing is written: review first.
    """
    from migrator.pipeline.runner import RunConfig, run
    from migrator.sources.files import discover

    _validate(write, output_dir, copy_unchanged, check, reports, paths)
    mode = "write" if write else "output-dir" if output_dir else "diff"
    prune = output_dir.resolve() if output_dir else None
    found = discover(paths, exclude, prune=prune)
    if not (found.files or found.errors or found.outside):
        # As Black and ruff say it: an empty tree is no error, but no silent "0 files" either.
        click.echo("No Python files are present to be migrated. Nothing to do.", err=True)
        sys.exit(EXIT_OK)
    work_tree = None
    if mode == "write":
        from migrator.sources.git_state import dirty_work_tree

        work_tree = dirty_work_tree(paths)
        _remove_leftovers(found.temps, quiet)
    config = RunConfig(
        mode=mode,
        output_dir=output_dir,
        copy_unchanged=copy_unchanged,
        jobs=jobs or _available_cpus(),
        distributed=distributed,
        add_loss_scale=add_loss_scale,
        target=target,
    )
    result = run(
        found.files,
        config,
        paths,
        progress=_progress_factory(quiet),
        listing_errors=found.errors,
        outside=found.outside,
    )

    if mode == "diff":
        _print_diffs(result, _use_color(color))
    _print_messages(result, quiet)
    report_failed = False
    for report_path in reports:
        from migrator.report.documents import write_report

        try:
            write_report(report_path, result)
        except OSError as exc:
            click.echo(f"{report_path}: error: cannot write report: {exc.strerror}", err=True)
            report_failed = True
    if work_tree is not None and result.changed and not quiet:
        click.echo(_undo_note(result, work_tree), err=True)
    if not quiet:
        click.echo(_summary_line(result), err=True)
    if result.failed or report_failed:
        sys.exit(EXIT_FAILED)
    if check and result.changed:
        sys.exit(EXIT_CHANGES_PENDING)
    sys.exit(EXIT_OK)


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing ancestor of a folder to create (or the folder) when it is not a
    directory: every write under it would fail, so it is named once, before any work."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _validate(
    write: bool,
    output_dir: Path | None,
    copy_unchanged: bool,
    check: bool,
    reports: tuple[Path, ...],
    paths: tuple[Path, ...],
) -> None:
    if write and output_dir:
        raise click.UsageError("--write and --output-dir exclude each other: pick one.")
    if check and (write or output_dir):
        raise click.UsageError(
            "--check only reports; it cannot be combined with --write or --output-dir."
        )
    if copy_unchanged and not output_dir:
        raise click.UsageError("--copy-unchanged needs --output-dir.")
    if output_dir and output_dir.exists() and not output_dir.is_dir():
        raise click.BadParameter(f"{output_dir} is not a directory", param_hint="--output-dir")
    blocked = _file_in_the_way(output_dir) if output_dir else None
    if blocked is not None:
        raise click.BadParameter(
            f"{blocked} is a file, so {output_dir} cannot be created under it",
            param_hint="--output-dir",
        )
    if output_dir:
        from migrator.sources.files import common_root

        if Path(os.path.abspath(output_dir)) == common_root(paths):
            raise click.BadParameter(
                f"{output_dir} is where the inputs live; use --write to rewrite in place",
                param_hint="--output-dir",
            )
    for report_path in reports:
        blocked = _file_in_the_way(report_path.parent)
        if blocked is not None:
            raise click.BadParameter(
                f"{blocked} is a file, so {report_path} cannot be written under it",
                param_hint="--report",
            )
        if report_path.suffix.lower() not in (".json", ".md", ".html"):
            raise click.BadParameter(
                f"{report_path}: the report format comes from the suffix, which must be "
                ".json, .md or .html",
                param_hint="--report",
            )


def _print_diffs(result: RunResult, color: bool) -> None:
    from migrator.report.diffing import colorize, diff_bytes, unified_diff

    for outcome in result.outcomes:
        if outcome.status != "changed":
            continue
        if color:  # for a terminal: UTF-8 text
            diff = unified_diff(outcome.old, outcome.new, outcome.path)
            _write_stdout(colorize(diff).encode("utf-8", "replace"))
        else:  # for `patch` / `git apply`: the files' own bytes
            _write_stdout(diff_bytes(outcome.old, outcome.new, outcome.path))


def _print_messages(result: RunResult, quiet: bool) -> None:
    for outcome in result.outcomes:
        if outcome.status == "failed":
            # A source error starts with LINE:COL, which goes straight after the path.
            separator = ":" if _LOCATED.match(outcome.error or "") else ": error: "
            click.echo(f"{outcome.path}{separator}{outcome.error}", err=True)
        if not quiet:
            for finding in outcome.warnings:
                click.echo(
                    f"{finding.path}:{finding.line}: {finding.rule}: {finding.message}", err=True
                )


def _remove_leftovers(temps: list[Path], quiet: bool) -> None:
    """Delete the hidden temporary files a killed --write left beside the files it was writing."""
    removed = 0
    for temp in temps:
        try:
            temp.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            click.echo(f"{temp}: warning: cannot remove a leftover temporary file: {exc}", err=True)
    if removed and not quiet:
        click.echo(
            f"npu-migrate: removed {_count(removed, 'temporary file')} an interrupted run left "
            "beside the files it was writing",
            err=True,
        )


def _undo_note(result: RunResult, work_tree: WorkTree) -> str:
    """How to undo a --write on a work tree that held uncommitted or untracked changes."""
    import shlex

    changed = [o for o in result.outcomes if o.status == "changed"]
    clean = [o.path for o in changed if os.path.realpath(o.source.path) not in work_tree.dirty]
    mixed = [o.path for o in changed if os.path.realpath(o.source.path) in work_tree.dirty]
    note = (
        f"npu-migrate: note: the git work tree {work_tree.root} had uncommitted or untracked "
        "changes; the port was written anyway. To undo it:"
    )
    if clean:
        note += f"\n  git checkout -- {' '.join(map(shlex.quote, clean))}"
    if mixed:
        note += (
            f"\n  {', '.join(mixed)}: held your own uncommitted changes too; review them with "
            "`git diff` and undo the port by hand"
        )
    return note + "\n  Commit or `git stash` first to keep a port apart from your own edits."


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _summary_line(result: RunResult) -> str:
    changed = "changed" if result.mode != "diff" else "would change"
    return (
        f"npu-migrate: {_count(result.scanned, 'file')} scanned, {result.changed} {changed}, "
        f"{_count(result.warnings, 'warning')}, {result.failed} failed ({result.seconds:.2f}s)"
    )


def main() -> None:
    """Console-script entry point."""
    from migrator.pipeline.processes import configure_process

    configure_process()
    cli(prog_name="npu-migrate")
