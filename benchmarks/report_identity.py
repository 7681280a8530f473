"""Record npu-migrate's JSON reports on a set of trees, and compare two recordings.

    python benchmarks/report_identity.py record OUT --tree NAME=DIR ... [--snapshot SNAPSHOT_DIR]
    python benchmarks/report_identity.py compare BASELINE OUT

A change meant only to make the migrator faster must not change a single byte it reports: record
the reports with the code before the change, again after, and compare. Each `--tree` is run with
`--check`; the real-code snapshot (benchmarks/realcode.py --materialize) is run once per
repository folder, as realcode.py ports it, and once as a whole with `--add-loss-scale=dynamic`
and with `--target npu-bridge`, which take other paths through the pipeline. The run's duration
(`summary.seconds`) is the only thing dropped before comparing; the diffs are in the reports, so
identical reports mean identical output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def runs(trees: list[tuple[str, Path]], snapshot: Path | None) -> list[tuple[str, list[str]]]:
    """(name, CLI arguments) of every run to record."""
    found = [(name, ["--check", str(tree)]) for name, tree in trees]
    if snapshot is not None:
        folders = sorted(p for p in snapshot.iterdir() if p.is_dir() and not p.name.startswith("."))
        found += [(f"realcode-{p.name}", ["--check", str(p)]) for p in folders]
        rows = [str(p) for p in folders]
        found.append(("realcode-add-loss-scale", ["--check", "--add-loss-scale=dynamic", *rows]))
        found.append(("realcode-npu-bridge", ["--check", "--target", "npu-bridge", *rows]))
    return found


def report_of(arguments: list[str]) -> dict:
    """The JSON report of one run of this checkout's CLI, without its duration."""
    with tempfile.TemporaryDirectory(prefix="report-identity-") as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-m", "migrator", "--quiet", "--report", str(report), *arguments],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if proc.returncode not in (0, 1):
            error = proc.stderr.decode()[-2000:]
            raise SystemExit(f"npu-migrate exited {proc.returncode}: {error}")
        data = json.loads(report.read_text())
    del data["summary"]["seconds"]
    return data


def record(out: Path, trees: list[tuple[str, Path]], snapshot: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, arguments in runs(trees, snapshot):
        data = report_of(arguments)
        (out / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        summary = data["summary"]
        print(
            f"{name}: {summary['files_scanned']} scanned, {summary['files_changed']} changed, "
            f"{summary['warnings']} warnings, {summary['files_failed']} failed"
        )


def compare(baseline: Path, out: Path) -> int:
    """Print every report that differs (and the first differing file entry); the count."""
    differ = 0
    names = sorted({p.name for p in baseline.glob("*.json")} | {p.name for p in out.glob("*.json")})
    for name in names:
        old, new = baseline / name, out / name
        if not (old.exists() and new.exists()):
            print(f"{name}: only in {'the baseline' if old.exists() else out}")
            differ += 1
            continue
        if old.read_bytes() == new.read_bytes():
            continue
        differ += 1
        before, after = json.loads(old.read_text()), json.loads(new.read_text())
        print(f"{name}: differs (summary {before['summary']} -> {after['summary']})")
        by_path = {f["path"]: f for f in before["files"]}
        for entry in after["files"]:
            if by_path.pop(entry["path"], None) != entry:
                print(f"  first differing file: {entry['path']}")
                break
        else:
            print(f"  a file listed before only: {next(iter(by_path), '?')}")
    print(f"{len(names) - differ} of {len(names)} reports identical")
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    rec.add_argument("--snapshot", type=Path, default=None)
    cmp = sub.add_parser("compare")
    cmp.add_argument("baseline", type=Path)
    cmp.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        trees = []
        for item in args.tree:
            name, sep, folder = item.partition("=")
            if not sep:
                parser.error(f"--tree takes NAME=DIR, got {item!r}")
            trees.append((name, Path(folder).resolve()))
        record(args.out, trees, args.snapshot)
    else:
        sys.exit(1 if compare(args.baseline, args.out) else 0)


if __name__ == "__main__":
    main()
