"""Check the long-file view on real code: every file of a tree ported whole and through its view.

    python benchmarks/view_check.py DIR [DIR...]

migrator.pipeline.slicing ports files past its length threshold through a view of the statements
that can matter; tests/migrator/test_slicing.py proves that on the fixtures. This runs the same
comparison with the threshold lowered to nothing on any tree (the real-code snapshots, a checkout),
so each file that the byte pre-filter admits goes through its view, and prints every file where
the two ports differ in bytes or findings. Exit status 1 if any does."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from migrator.pipeline import slicing, transform
from migrator.selection import prefilter


def _port(source: bytes, path: str) -> tuple[bytes, list[dict]] | str:
    try:
        result = transform.migrate_source(source, path=path)
    except transform.SourceError as error:
        return f"error: {error}"
    return result.new_source, [dataclasses.asdict(f) for f in result.findings]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    args = parser.parse_args()
    files = sorted(p for tree in args.trees for p in tree.rglob("*.py") if p.is_file())
    compared = viewed = 0
    differ: list[str] = []
    for path in files:
        source = path.read_bytes()
        if not prefilter.might_need_migration(source):
            continue
        slicing.MIN_LINES = 10**9
        whole = _port(source, str(path))
        slicing.MIN_LINES = 0
        viewed += slicing.view_of(source) is not None
        if _port(source, str(path)) != whole:
            differ.append(str(path))
        compared += 1
    for path in differ:
        print(f"differs: {path}")
    print(f"{compared} files compared ({viewed} through a view): {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
