"""Port real public training files with npu-migrate and check what a correct port must show.

    python benchmarks/realcode.py SNAPSHOT_DIR --materialize   # write the files from the mirrors
    python benchmarks/realcode.py SNAPSHOT_DIR                 # port, check, print the table

The files are listed in benchmarks/realcode/manifest.tsv (repository, commit, path, kind, expect),
pinned by commit. `--materialize` reads them from the bare git mirrors under --mirrors (one
`owner+name/repo` directory per repository, as the project's fetch tool leaves them) into
SNAPSHOT_DIR/owner+name/path; the snapshots stay outside the repository and outside `make test`.

Each repository's files are ported together (cross-file facts need the whole set) with the real
CLI into a temporary copy, and every row's expectations are checked against the ported file and
the JSON report. Expectations, separated by `;`:

    changed | unchanged       the file was rewritten / left byte-identical
    no-contrib                no tf.contrib.mixed_precision use is left (comments aside)
    warn:RULE                 the report warns about this file with that rule
    no-warn:RULE              ... and does not
    has:TEXT | not:TEXT       the ported code (comments aside) contains / does not contain TEXT
    option:FLAG               port this row with an extra CLI flag (e.g. --add-loss-scale=dynamic)

Besides the expectations, every changed file is compiled and imported in a fresh process under
TensorFlow 2.21; that reference run also says the file's style (the table's column): TF 1 code (it
imports tensorflow.compat.v1, or names tf.contrib or a symbol only TF 1's API has, or uses neither
Keras nor tf.function) runs through tf.compat.v1 there, TF 2 / Keras code as written. Where
benchmarks/realcode/extras.tsv names the project root a file sits in, `--materialize` also writes
that project's sibling modules (same commit) under SNAPSHOT_DIR/.extras/, outside what the rows'
port reads; they are ported in a run of their own and put beside the ported rows, the root goes
first on sys.path and the file is imported by its module name, as the project's scripts run it.
Third-party packages this machine cannot install have single-worker stand-ins in
benchmarks/realcode/stubs (horovod, dllogger), last on sys.path, and every result that loaded one
names it ("ok (stub: horovod)"): no such result is evidence about a multi-worker run. A file whose
import needs a package still missing is "n/a (needs NAME)"; a ported file that fails is probed
again as the original in the same tree, and where the original fails the same way the cause is not
the port: "n/a (fails unported too)". A file that defines `create_optimizer` is then trained on a
toy variable for three steps (clean, overflow, clean); where it scales the loss the overflowed step
must leave the weights and global_step exactly as they were; one that takes `hvd` is trained with
hvd=None and again with the horovod stub where the file loaded it. A file the PyTorch port changed
(it imports npu_lossscale.torch) is checked under torch instead, without TensorFlow: it must
compile, npu_lossscale.torch must import, every call of the ported GradScaler must bind to its
signature, and then the file is imported as above. An import or build failure counts against the
port only when the report has no warning for that file (the torch port's standing note about device
strings does not count as one). `--only TEXT` runs the rows whose repository or path has TEXT and
leaves REPORT.md alone.

`--tf1-stack LABEL=PYTHON` (repeatable) imports and trains every changed TF 1 file once more with
another interpreter, e.g. `tf1.15=/work/main/.venv-tf115/bin/python`: on TF 1.x the file runs as
written (no tf.compat.v1 alias, reference variables, tf.contrib present; the train cell names the
variables' kind). `--stack LABEL=PYTHON` does the same and, on a TF 2 interpreter, imports the TF 2
/ Keras files too (e.g. `tf2.6.5=/work/main/.venv-tf265/bin/python`, whose tf.keras is Keras 2): a
Keras file never goes to TF 1.x. The table gets an import and a train column per stack. Where
npu_lossscale itself does not import there, the row says so ("FAIL npu_lossscale.tf does not
import here: ...") and it counts as a failure. Every probe puts this repository first on
PYTHONPATH (the stack venvs install another checkout editable) and reports the npu_lossscale it
imported; a row whose probe imported another one fails. `--compile LABEL=PYTHON` compiles every
changed file with that interpreter (e.g. `py3.7=...`: the port must write Python 3.7), and its
original where it fails ("n/a (unported too)" where the project itself needs a newer Python).

`--target npu-bridge` ports with that npu-migrate target and puts the test suite's stand-in
`npu_bridge` (tests/migrator/codemods/targets/stub: the adapter's signatures, records each call,
delegates to npu_lossscale) on the probes' path, so the vendor-target port is trained end to end;
training then also requires that the adapter's NPULossScaleOptimizer was built. Expectations that
check the default target's spelling (npu_lossscale's import, our Keras class's call) are not
checked there (counted), a changed file must not name npu_lossscale,
a file the target leaves as it was with its warning is checked for nothing more, and the PyTorch
rows are left out (the target has none). The table's foot sums expectations met and ok/fail/n/a
per column.

Exit status 1 when any expectation, import or training check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from realcode_probes import PROBE, TORCH_PROBE
from realcode_stacks import Stack, compile_with, stack_version
from realcode_table import render

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MANIFEST = HERE / "realcode" / "manifest.tsv"
EXTRAS = HERE / "realcode" / "extras.tsv"
STUBS = HERE / "realcode" / "stubs"
# The test suite's stand-in for the Ascend adapter (records calls, delegates to npu_lossscale):
# on the npu-bridge target it is on the probes' path, so the vendor-target port is trained here.
BRIDGE_STUB = REPO / "tests" / "migrator" / "codemods" / "targets" / "stub"
BRIDGE_UNSUPPORTED = "target-npu-bridge-unsupported"
BRIDGE_NOTE = (
    " (ported with --target npu-bridge; npu_bridge is the test suite's stand-in from"
    " tests/migrator/codemods/targets/stub, which records calls and delegates to npu_lossscale;"
    " the PyTorch rows are left out: the target has no PyTorch counterpart)"
)

# The torch port's note on every ported file (device strings are torch-npu's job): it says
# nothing about whether the port is sound, so it excuses no import failure.
_STANDING_NOTES = {"torch-device"}


@dataclass
class Row:
    repo: str
    commit: str
    path: str
    kind: str
    expect: list[str]
    failures: list[str] = field(default_factory=list)
    imported: str = "-"
    trained: str = "-"
    stacks: dict[str, tuple[str, str]] = field(default_factory=dict)  # label: (import, train)
    compiled: dict[str, str] = field(default_factory=dict)  # label: compile result
    style: str = "-"  # tf1 / tf2 / torch, as the reference probe saw the ported file
    skipped: int = 0  # expectations not checked on this target
    note: str = ""

    @property
    def folder(self) -> str:
        return self.repo.replace("/", "+")

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(e.partition(":")[2] for e in self.expect if e.startswith("option:"))


def read_manifest(path: Path) -> list[Row]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("repository\t"):
            continue
        repo, commit, file, kind, expect = line.split("\t")
        rows.append(Row(repo, commit, file, kind, [e.strip() for e in expect.split(";") if e]))
    return rows


def git_dir_of(mirrors: Path, folder: str) -> Path:
    """The mirror's git directory: a bare `repo`, or the `.git` of a `repo` work tree (the fetch
    tool leaves either)."""
    repo = mirrors / folder / "repo"
    return repo / ".git" if (repo / ".git").is_dir() else repo


def materialize(rows: list[Row], snapshot: Path, mirrors: Path) -> None:
    missing = set()
    for row in rows:
        git_dir = git_dir_of(mirrors, row.folder)
        if not git_dir.exists():
            missing.add(row.repo)
            continue
        data = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{row.commit}:{row.path}"],
            capture_output=True,
            check=True,
        ).stdout
        target = snapshot / row.folder / row.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for repo in sorted(missing):
        print(f"missing mirror for {repo}: fetch it first", file=sys.stderr)


@dataclass
class Project:
    """A project root in a repository (a row of extras.tsv): its sibling modules are materialized
    beside the manifest's files, and a row under it is imported from it as its scripts run."""

    repo: str
    commit: str
    root: str
    paths: list[str]
    package: str

    @property
    def folder(self) -> str:
        return self.repo.replace("/", "+")

    def covers(self, row: Row) -> bool:
        return row.repo == self.repo and (self.root == "." or row.path.startswith(self.root + "/"))


def read_extras(path: Path) -> list[Project]:
    projects = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        repo, commit, root, paths, package = line.split("\t")
        projects.append(
            Project(repo, commit, root, paths.split(","), "" if package == "-" else package)
        )
    return projects


def project_of(row: Row, projects: list[Project]) -> Project | None:
    """The innermost project root holding the row's file, if extras.tsv names one."""
    covering = [p for p in projects if p.covers(row)]
    return max(covering, key=lambda p: len(p.root), default=None)


def materialize_extras(projects: list[Project], snapshot: Path, mirrors: Path) -> None:
    """Write each project's sibling files under SNAPSHOT/.extras/owner+name/, outside what is
    ported, so the port's input (and so every expectation) stays the manifest's files alone."""
    for project in projects:
        git = ["git", f"--git-dir={git_dir_of(mirrors, project.folder)}"]
        wanted = [posixpath.normpath(posixpath.join(project.root, p)) for p in project.paths]
        listed = subprocess.run(
            [*git, "ls-tree", "-r", "--name-only", project.commit, "--", *wanted],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for name in listed:
            if not name.endswith(".py") and name not in wanted:
                continue
            data = subprocess.run(
                [*git, "show", f"{project.commit}:{name}"], capture_output=True, check=True
            ).stdout
            target = snapshot / ".extras" / project.folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def overlay(source: Path, target: Path) -> None:
    """Copy a tree's files into another, never over a file already there (a ported row)."""
    for path in source.rglob("*") if source.exists() else ():
        destination = target / path.relative_to(source)
        if path.is_file() and not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def port(snapshot: Path, work: Path, folder: str, options: tuple[str, ...] = ()) -> dict:
    """Port one repository's files (with extra CLI flags); returns the JSON report."""
    tag = folder + "".join(o.replace("=", "-") for o in options)
    out = work / "out" / tag
    report = work / f"{tag}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "migrator",
            str(snapshot / folder),
            "--output-dir",
            str(out),
            "--copy-unchanged",
            "--no-color",
            "--report",
            str(report),
            *options,
        ],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    return json.loads(report.read_text(encoding="utf-8"))


def _code_without_comments(text: str) -> str:
    """The text with every comment blanked out, so a moved-and-commented original line does not
    count as code."""
    import io
    import tokenize

    lines = text.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, start = token.start
                line = lines[row - 1]
                lines[row - 1] = line[:start] + line[token.end[1] :]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text
    return "".join(lines)


def _default_spelling(name: str, arg: str) -> bool:
    """Whether an expectation checks the default target's spelling of the port: npu_lossscale's
    import, or our Keras class's call (the npu-bridge target writes the adapter's
    npu.train.optimizer.NpuLossScaleOptimizer, with only the arguments that class takes)."""
    keras_call = "LossScaleOptimizer(" in arg and "NPULossScaleOptimizer" not in arg
    return (name in ("has", "not") and "npu_lossscale" in arg) or (name == "has" and keras_call)


def check(
    row: Row, original: bytes, ported: bytes, warnings: set[str], target: str = "npulossscale"
) -> None:
    """Check the row's expectations against the ported file and the report's warnings. On the
    npu-bridge target an expectation that names npu_lossscale (the default target's import) is
    not checked (counted in row.skipped); instead a changed file must name npu_lossscale nowhere,
    and a file the target leaves as it was, with its warning, is checked for nothing more."""
    text = ported.decode("utf-8", "replace")
    code = _code_without_comments(text)
    bridge = target == "npu-bridge"
    if bridge and BRIDGE_UNSUPPORTED in warnings:
        row.skipped = len([e for e in row.expect if not e.startswith("option:")])
        row.note = f"left as it was ({BRIDGE_UNSUPPORTED})"
        return
    for item in row.expect:
        name, _, arg = item.partition(":")
        if bridge and _default_spelling(name, arg):
            row.skipped += 1
            continue
        if name == "changed":
            ok = ported != original
        elif name == "unchanged":
            ok = ported == original
        elif name == "no-contrib":
            ok = "contrib.mixed_precision" not in code
        elif name in ("warn", "no-warn"):
            ok = (arg in warnings) == (name == "warn")
        elif name in ("has", "not"):
            ok = (arg in code) == (name == "has")
        elif name == "option":
            continue
        else:
            row.failures.append(f"unknown expectation {item!r}")
            continue
        if not ok:
            row.failures.append(f"expected {item}")
    if bridge and ported != original and "npu_lossscale" in code:
        row.failures.append("names npu_lossscale under --target npu-bridge")


def _probe_one(
    path: Path,
    project: Project | None,
    tree: Path,
    torch: bool,
    import_only: bool,
    python: str = sys.executable,
    style: str | None = None,
    bridge: bool = False,
) -> dict[str, str]:
    """Run one probe process on one file of a tree (ported or original) with one interpreter and
    return its result. This repository goes first on PYTHONPATH, so the probe imports this tree's
    npu_lossscale, not whatever an interpreter has installed (the probe reports the folder it
    imported, and probe() fails a row where that is not this tree's)."""
    source = path.read_text(encoding="utf-8", errors="replace")
    stubs = [str(STUBS) + "/"] + ([str(BRIDGE_STUB) + "/"] if bridge else [])
    config = {"path": str(path), "root": None, "module": None, "stubs": stubs}
    config.update(style=style, scaled="NPULossScaleOptimizer" in source, bridge=bridge)
    config.update(import_only=import_only, tree=str(tree))
    if project is not None:
        root = tree / project.root
        parts = list(path.relative_to(root).with_suffix("").parts)
        if project.package:  # the root is itself a package, imported by that name
            alias = tree.parent / (tree.name + ".alias")
            alias.mkdir(exist_ok=True)
            if not (alias / project.package).exists():
                (alias / project.package).symlink_to(root.resolve(), target_is_directory=True)
            root, parts = alias, [project.package, *parts]
        config.update(root=str(root), module=".".join(parts))
    env = dict(os.environ)
    env.pop("TF2_BEHAVIOR", None)  # set by any TF 2 import; TF 1.15 would obey it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            [python, "-c", TORCH_PROBE if torch else PROBE, json.dumps(config)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=config["root"] or path.parent,
            env=env,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as error:
        result = {"import": f"FAIL probe: {type(error).__name__}", "train": "-"}
    return {
        k: v.replace(str(tree), "<tree>") if isinstance(v, str) else v for k, v in result.items()
    }


def _probe_compared(
    row: Row,
    trees: tuple[Path, Path],
    project: Project | None,
    torch: bool,
    python: str,
    style: str | None = None,
    bridge: bool = False,
) -> dict[str, str]:
    """Probe the ported file with one interpreter; where it fails to import, probe the original
    in the same place: where the original fails the same way, the port is not the cause (the
    file needs an API that stack lacks), n/a."""
    ported_tree, original_tree = trees
    result = _probe_one(
        ported_tree / row.path, project, ported_tree, torch, False, python, style, bridge
    )
    if result["import"].startswith("FAIL npu_lossscale"):  # the library, not the file: no n/a
        return result
    if result["import"].startswith("FAIL"):
        before = _probe_one(
            original_tree / row.path, project, original_tree, torch, True, python, style, bridge
        )
        at = f" at {result['where']}" if result.get("where") else ""
        if before["import"] == result["import"]:
            result["import"] = f"n/a (fails unported too: {result['import'][5:]}{at})"
        elif before["import"].startswith("ok"):
            result["import"] += f"{at} (unported imports)"
        else:
            result["import"] += f"{at} (unported: {before['import']})"
    return result


def probe(
    row: Row,
    trees: tuple[Path, Path],
    warnings: set[str],
    project: Project | None,
    stacks: list[Stack],
    bridge: bool = False,
) -> None:
    """Import the ported file in a fresh process (from its project root where extras.tsv names
    one, so its real siblings import) and train its create_optimizer where it has one, under this
    interpreter's TF 2 (or torch); the reference run says whether the file is TF 1 or TF 2 code,
    and it is then imported and trained again on every stack that runs that kind (TF 1 files on
    TF 1.15 as written, with reference variables; Keras 2 files on TF 2.6.5)."""
    source = (trees[0] / row.path).read_text(encoding="utf-8", errors="replace")
    torch = "npu_lossscale.torch" in source
    result = _probe_compared(row, trees, project, torch, sys.executable, None, bridge)
    row.imported, row.trained = result["import"], result["train"]
    row.style = "torch" if torch else result.get("style") or "-"
    checked = [("import", row.imported, result), ("train", row.trained, result)]
    for stack in stacks if not torch else ():
        if not stack.runs(result.get("style")):
            continue
        other = _probe_compared(row, trees, project, False, stack.python, result["style"], bridge)
        row.stacks[stack.label] = (other["import"], other["train"])
        checked += [
            (f"import on {stack.label}", other["import"], other),
            (f"train on {stack.label}", other["train"], other),
        ]
    for what, value, where in checked:
        library = where.get("library")
        if library and Path(library).resolve() != (REPO / "npu_lossscale").resolve():
            row.failures.append(f"{what} imported npu_lossscale from {library}, not this tree")
        if value.startswith("FAIL") and not warnings - _STANDING_NOTES:
            row.failures.append(f"{what} failed with no warning: {value}")
        elif value.startswith("FAIL"):  # the report warned: the table says which warning it was
            excused = ", ".join(sorted(warnings - _STANDING_NOTES))
            row.note = "; ".join(filter(None, [row.note, f"{what} failed, warned: {excused}"]))


def run(
    snapshot: Path,
    rows: list[Row],
    projects: list[Project],
    report: bool = True,
    stacks: list[Stack] | None = None,
    compilers: dict[str, str] | None = None,
    target: str = "npulossscale",
) -> int:
    stacks, compilers = stacks or [], compilers or {}
    bridge = target == "npu-bridge"
    flags = ("--target=npu-bridge",) if bridge else ()
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp)
        reports = {}
        for folder, options in sorted({(r.folder, r.options) for r in rows}):
            reports[folder, options] = port(snapshot, work, folder, options + flags)
            tag = folder + "".join(o.replace("=", "-") for o in options + flags)
            # The siblings are ported too, in a run of their own (so the rows' port and its report
            # stay the manifest's alone), and sit under the ported rows as a user's port has them.
            if (snapshot / ".extras" / folder).exists():
                port(snapshot / ".extras", work / "siblings", folder, options + flags)
                overlay(work / "siblings" / "out" / tag, work / "out" / tag)
        for folder in sorted({r.folder for r in rows}):  # the originals, beside the same siblings
            shutil.copytree(snapshot / folder, work / "original" / folder)
            overlay(snapshot / ".extras" / folder, work / "original" / folder)
        changed = []
        for row in rows:
            original = (snapshot / row.folder / row.path).read_bytes()
            tag = row.folder + "".join(o.replace("=", "-") for o in row.options + flags)
            ported_path = work / "out" / tag / row.path
            ported = ported_path.read_bytes() if ported_path.exists() else original
            findings = [
                f
                for f in reports[row.folder, row.options].get("findings", [])
                if Path(f["path"]).resolve() == (snapshot / row.folder / row.path).resolve()
            ]
            warnings = {f["rule"] for f in findings if f["kind"] == "warning"}
            check(row, original, ported, warnings, target)
            if ported != original and row.path.endswith(".py"):
                trees = (work / "out" / tag, work / "original" / row.folder)
                changed.append((row, ported_path, trees[1] / row.path))
                probe(row, trees, warnings, project_of(row, projects), stacks, bridge)
        for label, python in compilers.items():
            compile_with(python, changed, label)
    table = render(rows, [s.label for s in stacks], list(compilers), target, BRIDGE_NOTE)
    print(table)
    if report:
        (snapshot / "REPORT.md").write_text(table + "\n", encoding="utf-8")
    return 1 if any(r.failures for r in rows) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path, help="where the files are (or are written)")
    parser.add_argument("--materialize", action="store_true", help="write them from mirrors")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--extras", type=Path, default=EXTRAS)
    parser.add_argument("--only", help="run only the rows whose repository or path has this text")
    stacks = "LABEL=PYTHON"
    parser.add_argument(
        "--tf1-stack",
        action="append",
        default=[],
        metavar=stacks,
        help="also import and train every changed TF 1 file with this interpreter (e.g. "
        "tf1.15=/work/main/.venv-tf115/bin/python: TF 1.15, reference variables); repeatable",
    )
    parser.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar=stacks,
        help="the same, and on a TF 2 interpreter the TF 2 / Keras 2 files too (e.g. "
        "tf2.6.5=/work/main/.venv-tf265/bin/python: Keras 2); repeatable",
    )
    parser.add_argument(
        "--compile",
        action="append",
        default=[],
        metavar=stacks,
        help="compile every changed file with this interpreter too (e.g. "
        "py3.7=/work/main/.venv-tf115/bin/python: the port must write valid Python 3.7)",
    )
    parser.add_argument(
        "--target",
        choices=("npulossscale", "npu-bridge"),
        default="npulossscale",
        help="port with this npu-migrate target; npu-bridge puts the test suite's stand-in "
        "npu_bridge on the probes' path and leaves the PyTorch rows out",
    )
    args = parser.parse_args()
    stacks = [Stack(*s.split("=", 1), tf1_only=True) for s in args.tf1_stack]
    stacks += [Stack(*s.split("=", 1), tf1_only=False) for s in args.stack]
    for stack in stacks:
        stack.tf_version = stack_version(stack.python)
    rows = read_manifest(args.manifest)
    projects = read_extras(args.extras)
    if args.materialize:
        if args.snapshot.exists():
            shutil.rmtree(args.snapshot)
        materialize(rows, args.snapshot, args.mirrors)
        materialize_extras(projects, args.snapshot, args.mirrors)
    if args.only:  # a partial run prints its table but leaves REPORT.md as the full run wrote it
        rows = [r for r in rows if args.only in r.repo or args.only in r.path]
    if args.target == "npu-bridge":
        rows = [r for r in rows if not r.kind.startswith("torch")]
    compilers = dict(c.split("=", 1) for c in args.compile)
    missing = [r for r in rows if not (args.snapshot / r.folder / r.path).is_file()]
    if missing:  # a snapshot older than the manifest: say so rather than fail halfway through
        listed = "\n  ".join(f"{r.folder}/{r.path}" for r in missing[:10])
        more = f"\n  ... and {len(missing) - 10} more" if len(missing) > 10 else ""
        sys.exit(
            f"{args.snapshot} lacks {len(missing)} of the manifest's files:\n  {listed}{more}\n"
            "write the snapshot again with --materialize"
        )
    return run(args.snapshot, rows, projects, not args.only, stacks, compilers, args.target)


if __name__ == "__main__":
    sys.exit(main())
