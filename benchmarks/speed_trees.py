"""Build the two trees `migrate_speed.py --tree` is measured on, outside the repository.

    python benchmarks/speed_trees.py dense DIR --snapshot SNAPSHOT_DIR [--mirrors /work/.mirror]
    python benchmarks/speed_trees.py typical DIR

`dense` is a tree the way a platform team that ports framework trainers sees it: the real-code
snapshot (benchmarks/realcode.py --materialize, rows and their projects' sibling modules) plus whole
framework-trainer repositories, each exported from its bare mirror at the commit pinned in
DENSE_REPOSITORIES, so the tree is the same on every machine that has those mirrors. Many of its
files use loss scaling (AMP GradScaler, contrib and Keras loss-scale optimizers), so most of the
time goes to libcst rather than to the byte pre-filter.

`typical` is migrate_speed.py's seeded generated tree (2,000 files, a few per cent with loss-scale
code), written to DIR instead of a temporary folder.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (mirror folder, commit): whole repositories of framework trainers, Python files only.
DENSE_REPOSITORIES = (
    ("NVIDIA+DeepLearningExamples", "729963dd47e7c8bd462ad10bfac7a7b0b604e6dd"),
    ("NVIDIA+OpenSeq2Seq", "8681d381ed404fde516e2c1b823de5a213c59aba"),
)


def export(mirrors: Path, folder: str, commit: str, target: Path) -> int:
    """Write the repository's *.py files at `commit` under `target`; how many were written."""
    git_dir = mirrors / folder / "repo"
    if not git_dir.is_dir():
        raise SystemExit(f"no mirror {git_dir}: fetch github:{folder.replace('+', '/')} first")
    data = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "--format=tar", commit],
        check=True,
        capture_output=True,
    ).stdout
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                path = target / member.name
                path.parent.mkdir(parents=True, exist_ok=True)
                extracted = archive.extractfile(member)
                assert extracted is not None
                path.write_bytes(extracted.read())
                count += 1
    return count


def build_dense(root: Path, snapshot: Path, mirrors: Path) -> None:
    if not snapshot.is_dir():
        raise SystemExit(f"{snapshot}: materialize it first (benchmarks/realcode.py --materialize)")
    shutil.copytree(snapshot, root / "realcode", ignore=shutil.ignore_patterns("*.pyc"))
    # realcode.py keeps the projects' modules in a hidden folder, which npu-migrate skips.
    extras = root / "realcode" / ".extras"
    if extras.is_dir():
        extras.rename(root / "realcode" / "extras")
    for folder, commit in DENSE_REPOSITORIES:
        count = export(mirrors, folder, commit, root / folder)
        print(f"{folder}@{commit[:12]}: {count} files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("dense", "typical"))
    parser.add_argument("dir", type=Path, help="where to build it (must not exist)")
    parser.add_argument("--snapshot", type=Path, help="the materialized real-code snapshot")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    args = parser.parse_args()
    if args.dir.exists():
        parser.error(f"{args.dir} exists")
    if args.kind == "dense":
        if args.snapshot is None:
            parser.error("dense needs --snapshot")
        build_dense(args.dir, args.snapshot, args.mirrors)
    else:
        sys.path.insert(0, str(HERE))
        from migrate_speed import generate_tree

        files, lines = generate_tree(args.dir, 2000, 0)
        print(f"{files} files, {lines} lines")
    print(f"{sum(1 for _ in args.dir.rglob('*.py'))} Python files under {args.dir}")


if __name__ == "__main__":
    main()
