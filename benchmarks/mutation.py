"""Mutation testing with cosmic-ray: how many small plausible bugs the tests catch, per area.

    python benchmarks/mutation.py                       # every area, 15 mutants each, seed 0
    python benchmarks/mutation.py --sample 0            # every mutant (hours: not for 2 cores)
    python benchmarks/mutation.py --areas rule,torch --sample 40 --seed 3 --jobs 2

cosmic-ray (pinned in the `dev` extra) makes the mutants and runs them; this script only scopes
it. Each area names the modules it mutates and the tests that cover them, and each mutant runs
only those tests (`pytest -x`, so a killed mutant stops at its first failing test; pytest-randomly's
shuffle off). cosmic-ray edits the files it mutates in place, so every worker (`--jobs`, default 2)
gets its own copy of the checkout's files in a temporary directory and the checkout is never
touched.

Order: before its mutants, an area's tests run once unmutated under coverage (coverage.py, also
in the `dev` extra), in the pytest process and in every process a test starts (the CLI, training
scripts, workers: mutation_hooks/sitecustomize.py), recording which test ran which line of the
area's modules and how long each test took. A mutant's run then starts with the test files that
ran its statement, quickest first, then the rest (mutation_hooks/mutation_order.py). Only the order
changes, never the set: a mutant survives exactly when every test of its area passes, so what the
recording misses costs time, never a wrong kill or survival. A killed mutant mostly stops within
seconds instead of after every test before the one that fails.

Sampling: cosmic-ray's session lists every mutant of an area. Mutants inside annotations are
dropped first (every module here has `from __future__ import annotations`: an annotation is never
evaluated, so such a mutant cannot change behaviour); then, unless `--sample 0`, a
`random.Random(seed)` draw keeps `--sample` of the rest, ordered by module, position, operator
and occurrence, and marks the others skipped before `cosmic-ray exec` runs. The same seed draws
the same mutants for the same code.

Killed: the tests failed, errored or timed out (cosmic-ray's timeout: `--timeout`; the table counts
the timeouts apart, since on a loaded machine a slow survivor can time out), or the mutant could
not be imported (cosmic-ray's "incompetent"). Survived: every test passed. A survivor listed
in benchmarks/mutation_equivalent.tsv (module, line, operator, reason) is a mutant that cannot
change behaviour; it is printed with its reason and left out of the score. Prints one row per area
(`killed/run`, score) and every other survivor with its diff; exit status 0 either way (a
measurement, not a gate). Not part of `make test`; `make mutate` runs it.
"""

from __future__ import annotations

import argparse
import ast
import csv
import glob
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EQUIVALENT = Path(__file__).resolve().parent / "mutation_equivalent.tsv"

# area -> (modules mutated, globs relative to the checkout; tests that cover them)
AREAS: dict[str, tuple[list[str], list[str]]] = {
    "rule": (
        ["npu_lossscale/rule.py"],
        ["tests/library/test_rule_trace.py", "tests/library/test_rule_survivors.py"],
    ),
    "tf/managers": (
        ["npu_lossscale/tf/managers.py"],
        [
            "tests/library/tf/test_managers.py",
            "tests/library/keras/test_keras_managers.py",
            "tests/library/tf/test_contrib_contract.py",
            "tests/library/tf/test_tf_mutation_kills.py",
            "tests/library/tf/test_variable_kinds.py",
        ],
    ),
    "tf/optimizer": (
        ["npu_lossscale/tf/optimizer.py", "npu_lossscale/tf/gating.py"],
        [
            "tests/library/tf/test_optimizer.py",
            "tests/library/tf/test_gating.py",
            "tests/library/tf/test_checkpoint_eager.py",
            "tests/library/tf/test_contrib_contract.py",
            "tests/library/tf/test_tf_mutation_kills.py",
        ],
    ),
    "tf/distributed": (
        ["npu_lossscale/tf/distributed.py"],
        [
            "tests/library/tf/test_distributed.py",
            "tests/library/tf/test_multiworker.py",
            "tests/library/tf/test_tf_mutation_kills.py",
        ],
    ),
    "keras": (["npu_lossscale/keras/optimizer*.py"], ["tests/library/keras"]),
    "torch": (
        ["npu_lossscale/torch/scaler*.py", "npu_lossscale/torch/decision*.py"],
        [
            "tests/library/torch/test_torch.py",
            "tests/library/torch/test_torch_distributed.py",
            "tests/library/torch/test_torch_mutation_kills.py",
        ],
    ),
    "codemods/torch": (["migrator/codemods/torch/*.py"], ["tests/migrator/codemods/torch"]),
    "codemods/global_step": (
        ["migrator/codemods/global_step/*.py"],
        ["tests/migrator/codemods/global_step"],
    ),
    "codemods/distributed": (
        ["migrator/codemods/shared/distributed.py"],
        ["tests/migrator/codemods/tf1", "tests/migrator/codemods/keras"],
    ),
    "codemods/other": (
        [
            "migrator/codemods/tf1/*.py",
            "migrator/codemods/keras/*.py",
            "migrator/codemods/add_loss_scale/*.py",
        ],
        ["tests/migrator/codemods"],
    ),
}


# Minutes each area took in the seed-0 run of 2026-11-27 (two cores, nothing else running; the
# whole run 36.8 min), for the order of the queue: the run lasts about as long as its longest area
# when that one starts first.
MINUTES = {
    "codemods/other": 28,
    "codemods/torch": 12,
    "keras": 10,
    "codemods/distributed": 7,
    "tf/distributed": 4,
    "codemods/global_step": 4,
    "tf/optimizer": 2.5,
    "torch": 2.4,
    "tf/managers": 2.3,
    "rule": 0.6,
}


@dataclass
class Outcome:
    area: str
    killed: int = 0
    run: int = 0
    survivors: list[tuple[str, int, str, str]] | None = None  # module, line, operator, diff
    explained: list[tuple[str, int, str, str]] | None = None  # module, line, operator, reason
    seconds: float = 0.0  # wall clock for the area's baseline, init and exec
    timeouts: int = 0  # killed by --timeout: on a loaded machine, a slow survivor would be one


def _copy_checkout(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files, as `git` lists them."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / name.decode()
        if source.is_file() and not source.is_symlink():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _modules(root: Path, patterns: list[str]) -> list[str]:
    found = sorted({p for pattern in patterns for p in glob.glob(str(root / pattern))})
    return [str(Path(p).relative_to(root)) for p in found if not p.endswith("__init__.py")]


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    spans = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        found = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        spans.extend(
            ((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0))
            for a in found
        )
    return spans


def _in_annotation(root: Path, item, cache: dict) -> bool:
    mutation = item.mutations[0]
    path = root / mutation.module_path
    if path not in cache:
        cache[path] = _annotation_spans(path)
    start = tuple(mutation.start_pos)
    return any(begin <= start < end for begin, end in cache[path])


HOOKS = "benchmarks/mutation_hooks"  # sitecustomize (coverage) and the mutation_order plugin


def _test_command(root: Path, tests: list[str], **env: str) -> str:
    # PYTHONPATH, not only the working directory: tests that start a worker script (the
    # MirroredStrategy, multi-worker and gloo scenarios) would otherwise import npu_lossscale
    # from wherever it is installed, and a mutant of the copy would never run there.
    settings = "".join(f"{name}={value} " for name, value in env.items())
    return (
        f"env PYTHONPATH={root}:{root / HOOKS} {settings}{sys.executable} -m pytest -x -q "
        "-p no:cacheprovider -p no:randomly -p mutation_order -o addopts='' " + " ".join(tests)
    )


def _record(root: Path, modules: list[str], tests: list[str], slug: str) -> Path:
    """Run the area's tests once, unmutated, recording which test runs which line of its modules
    (in every process) and how long each takes; returns the map each mutant's run orders by."""
    data = root / f"mutation-{slug}-coverage"
    data.mkdir()
    durations = root / f"mutation-{slug}-durations.json"
    command = _test_command(
        root,
        tests,
        NPU_MUTATION_COVERAGE=str(data / "coverage"),
        NPU_MUTATION_INCLUDE=os.pathsep.join(str(root / m) for m in modules),
        NPU_MUTATION_DURATIONS=str(durations),
    )
    # A suite that fails (or fails to collect) unmutated would count every mutant as killed.
    baseline = subprocess.run(command, shell=True, cwd=root, capture_output=True, text=True)
    if baseline.returncode != 0:
        tail = "\n".join(baseline.stdout.splitlines()[-5:])
        raise SystemExit(f"{slug}: its tests fail on the unmutated code, no score:\n{tail}")
    import coverage

    # Reads every process's coverage.<suffix> file of the folder into one.
    combined = coverage.Coverage(data_file=str(data / "coverage"), config_file=False)
    combined.combine([str(data)])
    recorded = combined.get_data()
    lines: dict[str, dict[int, list[str]]] = {}
    for measured in recorded.measured_files():
        by_line = recorded.contexts_by_lineno(measured)
        lines[str(Path(measured).relative_to(root))] = {n: sorted(c) for n, c in by_line.items()}
    shutil.rmtree(data)
    target = root / f"mutation-{slug}-map.json"
    texts = {m: (root / m).read_text(encoding="utf-8") for m in modules}
    durations_by_test = json.loads(durations.read_text(encoding="utf-8"))
    target.write_text(
        json.dumps({"texts": texts, "lines": lines, "durations": durations_by_test}),
        encoding="utf-8",
    )
    return target


def _config(
    root: Path, modules: list[str], tests: list[str], timeout: float, ordering: Path
) -> str:
    command = _test_command(root, tests, NPU_MUTATION_MAP=str(ordering))
    listed = ", ".join(f'"{m}"' for m in modules)
    return (
        "[cosmic-ray]\n"
        f"module-path = [{listed}]\n"
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f'test-command = "{command}"\n'
        "\n[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def _equivalents() -> dict[tuple[str, int, str], str]:
    if not EQUIVALENT.exists():
        return {}
    with EQUIVALENT.open(encoding="utf-8") as handle:
        rows = [r for r in csv.reader(handle, delimiter="\t") if r and not r[0].startswith("#")]
    return {(module, int(line), operator): reason for module, line, operator, reason in rows}


def _mutant_key(item) -> tuple:
    mutation = item.mutations[0]
    return (
        str(mutation.module_path),
        tuple(mutation.start_pos),
        tuple(mutation.end_pos),
        mutation.operator_name,
        mutation.occurrence,
    )


def _run_area(area: str, root: Path, sample: int, seed: int, timeout: float) -> Outcome:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    started = time.monotonic()
    patterns, tests = AREAS[area]
    modules = _modules(root, patterns)
    outcome = Outcome(area, survivors=[], explained=[])
    if not modules:
        return outcome
    slug = area.replace("/", "_")
    ordering = _record(root, modules, tests, slug)
    config = root / f"mutation-{slug}.toml"
    session = root / f"mutation-{slug}.sqlite"
    config.write_text(_config(root, modules, tests, timeout, ordering), encoding="utf-8")
    cosmic_ray = str(Path(sys.executable).parent / "cosmic-ray")
    subprocess.run([cosmic_ray, "init", str(config), str(session)], cwd=root, check=True)
    with use_db(str(session), WorkDB.Mode.open) as db:
        spans: dict = {}
        # In a fixed order: the session lists its mutants in no set order (job ids are random
        # uuids), and a seeded draw over an unordered list is not a repeatable sample.
        items = sorted(db.work_items, key=_mutant_key)
        skipped = [item.job_id for item in items if _in_annotation(root, item, spans)]
        items = [item for item in items if item.job_id not in set(skipped)]
        if sample and len(items) > sample:
            kept = set(random.Random(seed).sample(range(len(items)), sample))
            skipped += [item.job_id for i, item in enumerate(items) if i not in kept]
        if skipped:
            db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    subprocess.run(
        [cosmic_ray, "exec", str(config), str(session)],
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    equivalent = _equivalents()
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            mutation = item.mutations[0]
            line = mutation.start_pos[0]
            module = str(mutation.module_path)
            if result.test_outcome == TestOutcome.SURVIVED:
                reason = equivalent.get((module, line, mutation.operator_name))
                if reason is not None:
                    outcome.explained.append((module, line, mutation.operator_name, reason))
                    continue
                outcome.survivors.append((module, line, mutation.operator_name, result.diff or ""))
            else:
                outcome.killed += 1
                outcome.timeouts += result.output == "timeout"  # how cosmic-ray records one
            outcome.run += 1
    outcome.seconds = time.monotonic() - started
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areas", default=",".join(AREAS), help="comma-separated area names")
    parser.add_argument("--sample", type=int, default=15, help="mutants per area; 0 for all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="areas mutated at once")
    # Above the slowest area's whole test run on a loaded machine (codemods/other: all of
    # tests/migrator/codemods, 8 minutes quiet), so a slow survivor is not counted killed.
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    args = parser.parse_args(argv)
    areas = [a for a in args.areas.split(",") if a]
    unknown = [a for a in areas if a not in AREAS]
    if unknown:
        parser.error(f"unknown area(s) {', '.join(unknown)}; known: {', '.join(AREAS)}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="npu-mutation-") as tmp:
        roots = []
        for i in range(min(args.jobs, len(areas))):
            root = Path(tmp) / f"worker{i}"
            _copy_checkout(root)
            roots.append(root)
        # One queue, longest areas first, each copy taking the next area when it is free (one
        # area at a time per copy: cosmic-ray edits that copy's files in place).
        pending: queue.SimpleQueue[str] = queue.SimpleQueue()
        for area in sorted(areas, key=lambda a: -MINUTES.get(a, 0)):
            pending.put(area)

        def work(root: Path) -> list[Outcome]:
            done = []
            while True:
                try:
                    area = pending.get_nowait()
                except queue.Empty:
                    return done
                done.append(_run_area(area, root, args.sample, args.seed, args.timeout))

        with ThreadPoolExecutor(max_workers=len(roots)) as pool:
            futures = [pool.submit(work, root) for root in roots]
            outcomes = {o.area: o for f in futures for o in f.result()}
    print(f"mutation score (seed {args.seed}, {args.sample or 'all'} mutants per area)")
    print(f"{'area':24} {'killed/run':>12} {'score':>7} {'minutes':>8} {'timeouts':>9}")
    for area in areas:
        o = outcomes[area]
        score = f"{100 * o.killed / o.run:.0f}%" if o.run else "-"
        row = f"{area:24} {f'{o.killed}/{o.run}':>12} {score:>7} {o.seconds / 60:>8.1f}"
        print(f"{row} {o.timeouts:>9}")
    print(f"whole run: {(time.monotonic() - started) / 60:.1f} min with --jobs {len(roots)}")
    for area in areas:
        for module, line, operator, reason in outcomes[area].explained or []:
            print(f"\nequivalent {module}:{line} {operator}: {reason}")
        for module, line, operator, diff in outcomes[area].survivors or []:
            print(f"\nSURVIVED [{area}] {module}:{line} {operator}\n{diff.rstrip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
