"""Finding the Python files to migrate and writing results back without ever leaving a half file.

Kept free of libcst and of the migration itself so that discovery, exclusion and atomic writes
can be reasoned about (and tested) on their own, and so `npu-migrate --help` stays cheap to import.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Directories that hold other people's code or build debris, never the user's training scripts.
SKIPPED_DIR_NAMES = frozenset({".venv", "venv", "__pycache__", "site-packages", "node_modules"})


@dataclass(frozen=True)
class SourceFile:
    """A discovered file: where it is on disk and how it is named in diffs, warnings and reports."""

    path: Path
    display: str
    # named on the command line (not found in a directory): its parse errors are reported even
    # when it holds nothing to port
    named: bool = False


def _is_skipped_dir(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIR_NAMES


def is_excluded(relative: str, patterns: Sequence[str]) -> bool:
    """True when a glob matches the path relative to its input, or one of its leading parts.

    Matching the leading parts as well lets `--exclude build` or `--exclude 'tests/*'` drop a whole
    directory, and matching the bare name lets `--exclude '*_pb2.py'` work at any depth.
    """
    if not patterns:
        return False
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))] + parts
    return any(fnmatch.fnmatchcase(c, p) for p in patterns for c in candidates)


def _walk_python_files(
    root: Path,
    patterns: Sequence[str],
    prune: Path | None,
    errors: list[tuple[str, str]],
    temps: list[Path],
) -> Iterator[Path]:
    def unlistable(exc: OSError) -> None:
        errors.append((os.path.normpath(exc.filename), f"cannot list directory: {exc.strerror}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not _is_skipped_dir(d)
            and not is_excluded(prefix + d, patterns)
            and (prune is None or (here / d).resolve() != prune)
        )
        temps += leftover_temps(here, filenames)
        for name in sorted(filenames):
            if name.endswith(".py") and not is_excluded(prefix + name, patterns):
                yield here / name


@dataclass
class Discovery:
    files: list[SourceFile]
    # (path, reason) of directories that could not be listed: reported, never skipped quietly.
    errors: list[tuple[str, str]]
    # symlinks found in a directory that lead outside every path given: not followed (a write
    # through them would change a file the user did not ask about), reported instead
    outside: list[tuple[SourceFile, str]] = field(default_factory=list)
    # hidden temporary files a killed --write left beside the files (see `stage`)
    temps: list[Path] = field(default_factory=list)


def discover(
    inputs: Sequence[Path], exclude: Sequence[str] = (), prune: Path | None = None
) -> Discovery:
    """Expand files and directories into the Python files to process, once each.

    A file named explicitly is taken whatever its suffix (the user asked for it) unless an exclude
    glob matches its name; directories contribute their `*.py` files recursively. `prune` is a
    directory never to descend into (the --output-dir when it lies inside an input).
    """
    seen: set[str] = set()
    found: list[SourceFile] = []
    errors: list[tuple[str, str]] = []
    outside: list[tuple[SourceFile, str]] = []
    temps: list[Path] = []
    roots = [os.path.realpath(item) for item in inputs]

    def inside(real: str) -> bool:
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)

    def add(path: Path, named: bool) -> None:
        # By real path: a file reached twice, through a linked file or directory, is one file
        # (processed and diffed once, under the first name found).
        key = os.path.realpath(path)
        if key in seen:
            return
        seen.add(key)
        source = SourceFile(path, os.path.normpath(path), named)
        if named or inside(key):
            found.append(source)
        else:
            outside.append((source, key))

    for item in inputs:
        if item.is_dir():
            for path in _walk_python_files(item, exclude, prune, errors, temps):
                add(path, named=False)
        elif not is_excluded(item.name, exclude):
            add(item, named=True)
            with contextlib.suppress(OSError):
                beside = leftover_temps(item.parent, os.listdir(item.parent))
                temps += [t for t in beside if t.name.startswith(f".{item.name}.")]
    return Discovery(found, errors, outside, sorted(set(temps)))


def common_root(inputs: Iterable[Path]) -> Path:
    """The deepest directory containing every input; a file input counts through its parent.

    Paths are made absolute without resolving symlinks, so a linked file inside the tree is
    mirrored where it appears, not where it points.
    """
    dirs = [os.path.abspath(p if p.is_dir() else p.parent) for p in inputs]
    return Path(os.path.commonpath(dirs))


def mirrored_path(path: Path, root: Path, output_dir: Path) -> Path:
    return output_dir / Path(os.path.abspath(path)).relative_to(root)


TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")
"""A temporary file `stage` makes beside NAME (mkstemp's eight random characters)."""


class WriteError(OSError):
    """A write that failed, naming the file the user asked for (never the temporary file)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc), str(path))


def stage(path: Path, data: bytes) -> tuple[Path, str]:
    """Write `data` to a hidden temporary file beside `path`'s target, with its permission bits;
    returns (target, temporary name). `commit` puts it in place. A symlink is followed so the link
    stays a link and its target is updated."""
    target = Path(os.path.realpath(path))
    try:
        old_mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        old_mode = None
    try:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise WriteError(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if old_mode is None:
            umask = os.umask(0)
            os.umask(umask)
            old_mode = 0o666 & ~umask
        os.chmod(tmp_name, old_mode)
    except BaseException as exc:
        discard(tmp_name)
        if isinstance(exc, OSError):
            raise WriteError(path, exc) from exc
        raise
    return target, tmp_name


def commit(path: Path, staged: tuple[Path, str]) -> None:
    """Put a staged file in place: one rename, so readers see the old file or the new one."""
    target, tmp_name = staged
    try:
        os.replace(tmp_name, target)
    except OSError as exc:
        discard(tmp_name)
        raise WriteError(path, exc) from exc


def discard(tmp_name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp_name)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so readers only ever see the old or the new file, never a mix.

    The bytes go to a temporary file in the same directory (same file system, so `os.replace` is
    atomic) which receives the original permission bits before it takes the original's place.
    Errors name `path`, not the temporary file.
    """
    commit(path, stage(path, data))


def write_together(writes: Sequence[tuple[Path, bytes, bytes]]) -> None:
    """Write (path, new, old) all or none: files that only make sense together (one global-step
    move: the increment leaves one file and enters a class in another).

    Every new file is staged first (the slow, failure-prone part: space, permissions); then all are
    renamed in the order given; if a rename fails, the files already renamed get their old bytes
    back. Raises the WriteError of the file that failed.
    """
    staged: list[tuple[Path, str]] = []
    try:
        for path, new, _ in writes:
            staged.append(stage(path, new))
    except BaseException:
        for _, tmp_name in staged:
            discard(tmp_name)
        raise
    done: list[tuple[Path, bytes]] = []
    for index, (path, _, old) in enumerate(writes):
        try:
            commit(path, staged[index])
        except BaseException:
            for _, tmp_name in staged[index + 1 :]:
                discard(tmp_name)
            for written, data in reversed(done):
                atomic_write(written, data)
            raise
        done.append((path, old))


def leftover_temps(directory: Path, names: Iterable[str]) -> list[Path]:
    """Temporary files `stage` left in `directory` (a run killed between staging and renaming):
    hidden, named after a file that is there, ending in `.tmp`."""
    present = set(names)
    found = []
    for name in present:
        match = TEMP_NAME.match(name)
        if match is not None and match["name"] in present:
            found.append(directory / name)
    return sorted(found)


def write_new_file(path: Path, data: bytes) -> None:
    """Write into a mirrored output tree, creating its directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def copy_file(source: Path, destination: Path) -> None:
    """Byte copy (with permission bits) for --copy-unchanged, so untouched files stay identical."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, destination)
