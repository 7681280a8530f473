"""Kill `npu-migrate --write` at random moments and check that no global-step move is left half.

A move spanning files (the update leaves a trainer, an increment enters the optimizer class in
another file) is correct only whole: with the trainer ported and the class not, global_step never
advances again. The script builds a tree of `--files` Python files in which `--plans` such moves
span two directories each (the BERT cross-file shape of tests/migrator/fixtures/bert/crossfile),
times one uninterrupted `--write`, then `--kills` times: copies the original tree, starts a
`--write`, SIGKILLs it at a random moment of the run (seeded), and classifies every file. Then it
runs `--write` again and checks that each move is ported or reported.

Half the kills fall anywhere in the run, half in its writing (after its first file is replaced:
writing is the last second or so of a run, where a kill can split a move). Printed per kill: the
moment (seconds after the start, or after the first write), how many moves were original /
ported / half-applied right after the kill, the leftover temporary files, how long the killed
run's workers outlived it, and after the re-run how many moves are ported or reported. Exit
status 1 if a move is left half and
unreported after a re-run, if a file is neither original nor ported, or if workers outlive the
kill by more than 5 s.

Usage: python benchmarks/faults.py [--files 2000] [--plans 50] [--kills 10] [--seed 0] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CROSSFILE = REPO / "tests" / "migrator" / "fixtures" / "bert" / "crossfile"
PORTABLE = "import tensorflow as tf\nm = tf.contrib.mixed_precision.FixedLossScaleManager({n})\n"
PLAIN = "import os\n\n\ndef f{n}(x):\n    return os.path.join(x, '{n}')\n"
WORKERS_GRACE_S = 5.0


def build_tree(root: Path, files: int, plans: int) -> list[tuple[str, str]]:
    """The tree; returns each move's (class file, trainer file), relative to root."""
    opt = (CROSSFILE / "custom_opt.py").read_text()
    trainer = (CROSSFILE / "run_pretraining.py").read_text()
    moves = []
    for k in range(plans):
        lib, train = root / f"lib{k}", root / f"train{k}"
        lib.mkdir(parents=True)
        train.mkdir(parents=True)
        (lib / "__init__.py").write_text("")
        (lib / "custom_opt.py").write_text(opt.replace("LambLike", f"LambLike{k}"))
        (train / "run_pretraining.py").write_text(
            trainer.replace(
                "from custom_opt import LambLike", f"from lib{k}.custom_opt import LambLike{k}"
            ).replace("LambLike(", f"LambLike{k}(")
        )
        moves.append((f"lib{k}/custom_opt.py", f"train{k}/run_pretraining.py"))
    rest = files - 3 * plans
    singles = rest // 10
    for n in range(rest):
        folder = root / f"pkg{n % 40}"
        folder.mkdir(exist_ok=True)
        text = PORTABLE if n < singles else PLAIN
        (folder / f"m{n}.py").write_text(text.format(n=n + 1))
    return moves


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.suffix == ".py"
    }


def temps(root: Path) -> int:
    return sum(1 for p in root.rglob(".*.tmp"))


def run_cli(root: Path, jobs: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "migrator", "--write", "-q", "-j", str(jobs), *extra, "."],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _env() -> dict[str, str]:
    env = dict(os.environ, NO_COLOR="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _start(root: Path, jobs: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "migrator", "--write", "-q", "-j", str(jobs), "."],
        cwd=root,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the workers can be found after the kill
    )


def _wait_for_change(path: Path, proc: subprocess.Popen[bytes]) -> float:
    """Seconds until `path` is replaced (the first write of the run), or the run ends."""
    start, first = time.perf_counter(), path.stat().st_ino
    while proc.poll() is None and path.stat().st_ino == first:
        time.sleep(0.002)
    return time.perf_counter() - start


def timed_run(root: Path, jobs: int, first: Path) -> tuple[float, float]:
    """(seconds to the first write, seconds in all) of an uninterrupted --write."""
    start = time.perf_counter()
    proc = _start(root, jobs)
    to_write = _wait_for_change(first, proc)
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"the uninterrupted --write failed (exit {proc.returncode})")
    return to_write, time.perf_counter() - start


def kill_at(root: Path, jobs: int, moment: float, first: Path | None) -> float:
    """Start a --write, SIGKILL its main process `moment` seconds after the start, or after its
    first write when `first` (the file written first) is given; returns how long its workers
    outlived it (WORKERS_GRACE_S + 1 when they were still there then)."""
    proc = _start(root, jobs)
    if first is not None:
        _wait_for_change(first, proc)
    time.sleep(moment)
    if proc.poll() is not None:
        return 0.0
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while not _group_gone(proc.pid):
        if time.monotonic() - killed > WORKERS_GRACE_S:
            os.killpg(proc.pid, signal.SIGKILL)
            return WORKERS_GRACE_S + 1
        time.sleep(0.05)
    return time.monotonic() - killed


def classify(now: dict[str, bytes], before: dict[str, bytes], after: dict[str, bytes]) -> dict:
    states = {}
    for path, data in now.items():
        states[path] = (
            "original" if data == before[path] else "ported" if data == after[path] else "other"
        )
    return states


def move_states(states: dict[str, str], moves: list[tuple[str, str]]) -> dict[str, int]:
    count = {"original": 0, "ported": 0, "class only": 0, "trainer only": 0, "other": 0}
    for cls, trainer in moves:
        pair = (states[cls], states[trainer])
        if pair[0] == pair[1] and pair[0] in ("original", "ported"):
            count[pair[0]] += 1
        elif pair == ("ported", "original"):
            count["class only"] += 1
        elif pair == ("original", "ported"):
            count["trainer only"] += 1
        else:
            count["other"] += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--plans", type=int, default=50)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.plans < 1 or args.files < 3 * args.plans or args.kills < 1:
        parser.error("need --plans >= 1, --files >= 3 * --plans and --kills >= 1")
    rng = random.Random(args.seed)
    failures = []
    with tempfile.TemporaryDirectory(prefix="npu-migrate-faults-") as scratch:
        original = Path(scratch) / "original"
        moves = build_tree(original, args.files, args.plans)
        before = snapshot(original)
        reference = Path(scratch) / "reference"
        shutil.copytree(original, reference)
        first = Path(moves[0][0])  # the class file of the first move: written first
        to_write, whole = timed_run(reference, args.jobs, reference / first)
        after = snapshot(reference)
        ported_moves = move_states(classify(after, before, after), moves)["ported"]
        print(
            f"tree: {len(before)} files, {len(moves)} cross-file moves ({ported_moves} ported by "
            f"an uninterrupted --write -j {args.jobs} in {whole:.1f}s, writing from "
            f"{to_write:.1f}s)"
        )
        print("even kills: at a random moment of the run; odd kills: of its writing")
        print(
            "kill  at (s)  original ported half other files  temps  workers  "
            "| re-run: ported reported unresolved temps"
        )
        for kill in range(args.kills):
            tree = Path(scratch) / f"kill{kill}"
            shutil.copytree(original, tree)
            during_writes = kill % 2 == 1
            window = (whole - to_write) if during_writes else whole
            moment = rng.uniform(0.0, 1.0) * window
            outlived = kill_at(tree, args.jobs, moment, tree / first if during_writes else None)
            states = classify(snapshot(tree), before, after)
            moved = move_states(states, moves)
            written = sum(s == "ported" for s in states.values())
            odd = sum(s == "other" for s in states.values())
            left = temps(tree)
            report = tree.parent / f"kill{kill}.json"
            rerun = run_cli(tree, args.jobs, "--report", str(report))
            findings = json.loads(report.read_text())
            mentioned = {f["path"] for f in findings.get("findings", [])} | {
                f["path"] for f in findings.get("failed", [])
            }
            again = classify(snapshot(tree), before, after)
            ported = reported = unresolved = 0
            for cls, trainer in moves:
                if again[cls] == again[trainer] == "ported":
                    ported += 1
                elif trainer in mentioned or cls in mentioned:
                    reported += 1
                else:
                    unresolved += 1
            half = moved["class only"] + moved["trainer only"] + moved["other"]
            print(
                f"{kill:>4}  {moment:6.2f}  {moved['original']:>8} {moved['ported']:>6} {half:>4} "
                f"{odd:>5} {written:>5}  {left:>5}  {outlived:5.2f}s  |         {ported:>6} "
                f"{reported:>8} {unresolved:>10} {temps(tree):>5}"
                + (
                    f"  (re-run exit {rerun.returncode})"
                    if rerun.returncode not in (0, 123)
                    else ""
                )
            )
            if odd:
                failures.append(f"kill {kill}: {odd} files neither original nor ported")
            if unresolved:
                failures.append(
                    f"kill {kill}: {unresolved} moves half and unreported after a re-run"
                )
            if outlived > WORKERS_GRACE_S:
                failures.append(f"kill {kill}: workers outlived the killed run by over 5 s")
            if temps(tree):
                failures.append(f"kill {kill}: temporary files left after the re-run")
            shutil.rmtree(tree)
    for failure in failures:
        print(f"FAILED {failure}")
    print(
        "faults: "
        + (
            "every move whole or reported after each kill"
            if not failures
            else f"{len(failures)} problems"
        )
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
