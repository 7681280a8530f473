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
TensorFlow 2.21 (TF1-style files, those that name a symbol only TF 1's API has or never mention
tf.compat.v1, through tf.compat.v1, as they run there). Where benchmarks/realcode/extras.tsv names
the project root a file sits in, `--materialize` also writes that project's sibling modules (same
commit) under SNAPSHOT_DIR/.extras/, outside what the rows' port reads; they are ported in a run
of their own and put beside the ported rows, the root goes first on sys.path and the file is
imported by its module name, as the project's scripts run it. Third-party packages this machine
cannot install have single-worker stand-ins in benchmarks/realcode/stubs (horovod, dllogger),
last on sys.path, and every result that loaded one names it ("ok (stub: horovod)"): no such
result is evidence about a multi-worker run. A file whose import needs a package still missing is
"n/a (needs NAME)"; a ported file that fails is probed again as the original in the same tree,
and where the original fails the same way the cause is not the port: "n/a (fails unported too)".
A file that defines `create_optimizer` is then trained on a toy variable for three steps (clean,
overflow, clean); where it scales the loss the overflowed step must leave the weights and
global_step exactly as they were; one that takes `hvd` is trained with hvd=None and again with
the horovod stub where the file loaded it. A file the PyTorch port changed (it imports
npu_lossscale.torch) is checked under torch instead, without TensorFlow: it must compile,
npu_lossscale.torch must import, every call of the ported GradScaler must bind to its signature,
and then the file is imported as above. An import or build failure counts against the port only
when the report has no warning for that file (the torch port's standing note about device
strings does not count as one). `--only TEXT` runs the rows whose repository or path has TEXT
and leaves REPORT.md alone.

`--tf1-stack LABEL=PYTHON` (repeatable) imports and trains every changed TF 1 file once more with
another interpreter, e.g. `tf1.15=/work/main/.venv-tf115/bin/python`: on TF 1.x the file runs as
written (no tf.compat.v1 alias, reference variables, tf.contrib present); the table gets an import
and a train column per stack. Where npu_lossscale itself does not import there, the row says so
("FAIL npu_lossscale.tf does not import here: ...") and it counts as a failure. Every probe puts
this repository first on PYTHONPATH, so it tests this tree's library whatever is installed.

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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MANIFEST = HERE / "realcode" / "manifest.tsv"
EXTRAS = HERE / "realcode" / "extras.tsv"
STUBS = HERE / "realcode" / "stubs"

# Shared by both probes: import the ported file as its project runs it. With a project root (a
# row of extras.tsv) the root goes first on sys.path and the file is imported by its module name,
# so its real sibling modules and relative imports resolve; alone, its own folder goes first. The
# harness's single-worker stubs come last on sys.path, so a real install would win, and
# stubs_used() names every stub the import loaded.
_LOAD = r"""
import importlib, importlib.util, json, os, sys, traceback
sys.argv = [config["path"]]
sys.path.insert(0, config["root"] or os.path.dirname(config["path"]))
sys.path.append(config["stubs"])

def load():
    if config["module"]:
        module = importlib.import_module(config["module"])
        if os.path.realpath(module.__file__) != os.path.realpath(config["path"]):
            raise ImportError(f"{config['module']} resolved to {module.__file__}")
        return module
    spec = importlib.util.spec_from_file_location("ported_module", config["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def where(error):  # the innermost frame of the failure in the project's files, not TF's
    root = config["root"] or os.path.dirname(config["path"])
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith((sys.prefix, sys.base_prefix, "<"))]
    return f"{os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno}" if frames else ""

def stubs_used():
    names = sorted({name.split(".")[0] for name, m in list(sys.modules.items())
                    if (getattr(m, "__file__", None) or "").startswith(config["stubs"])})
    return f" (stub: {', '.join(names)})" if names else ""
"""

# Runs in a fresh process: import the ported file the way a TF 1 script runs on TF 2.21, then
# train its create_optimizer on a toy variable if it has one.
_PROBE = (
    r"""
import importlib.util, inspect, json, math, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
config = json.loads(sys.argv[1])
path, tf1, scaled_source = config["path"], config["tf1"], config["scaled"]
import ast
import tensorflow
# On TF 1.x (TF 1.15, reference variables by default) a TF 1 file runs as written: no alias
# (tf.contrib is not under tf.compat.v1), no disable_v2_behavior: the variables are TF 1's kind.
native = tensorflow.__version__.startswith("1.")
try:
    import npu_lossscale.tf  # the library's own TF 2 imports, before the TF 1 alias below
except Exception as error:  # the library itself does not import on this stack
    first = (str(error).splitlines() or [""])[0][:160]
    print(json.dumps({"import": f"FAIL npu_lossscale.tf does not import here: "
                      f"{type(error).__name__}: {first}", "train": "-", "tf1": True}))
    sys.exit(0)
# A file that names a symbol only TF 1's API has (tf.flags, tf.get_variable, tf.Session...) is TF 1
# code even where it also spells some calls tf.compat.v1.*, as TF 1.15 scripts often do.
tree = ast.parse(open(path, "rb").read())
names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
         for a in n.names if a.name == "tensorflow"}
used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name) and n.value.id in names}
tf1 = tf1 or any(hasattr(tensorflow.compat.v1, a) and not hasattr(tensorflow, a) for a in used)
# A file that imports tensorflow.compat.v1 itself needs no alias but is TF 1 code all the same:
# its create_optimizer is trained too.
v1_import = any(a.name == "tensorflow.compat.v1" for n in ast.walk(tree)
                if isinstance(n, ast.Import) for a in n.names) or any(
    n.module == "tensorflow.compat" and any(a.name == "v1" for a in n.names)
    for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
if tf1 and not native:
    v1 = tensorflow.compat.v1
    v1.disable_v2_behavior()
    sys.modules["tensorflow"] = v1
"""
    + _LOAD
    + r"""
result = {"import": "ok", "train": "n/a", "tf1": bool(tf1 or v1_import)}
try:
    module = load()
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing in ("tensorflow", "npu_lossscale"):
        result["import"] = f"FAIL ModuleNotFoundError: {error}" + stubs_used()
        result["where"] = where(error)
    else:
        result["import"] = f"n/a (needs {error.name})" + stubs_used()
    print(json.dumps(result)); sys.exit(0)
except Exception as error:
    result["import"] = f"FAIL {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    result["import"] += stubs_used()
    result["where"] = where(error)
    print(json.dumps(result)); sys.exit(0)
result["import"] = "ok" + stubs_used()
factory = getattr(module, "create_optimizer", None)

def train(hvd):
    tf = tensorflow.compat.v1
    values = {"init_lr": 0.01, "learning_rate": 0.01, "num_train_steps": 100,
              "num_warmup_steps": 1, "warmup_steps": 1, "use_tpu": False, "hvd": hvd,
              "use_fp16": True, "manual_fp16": False}
    graph = tf.Graph()
    with graph.as_default():
        w = tf.get_variable("w", initializer=tf.constant([1.0, 2.0, 3.0]))
        k = tf.placeholder(tf.float32, [])
        loss = k * tf.reduce_sum(w * w)
        params = inspect.signature(factory).parameters
        scaled = "use_fp16" in params or scaled_source
        kwargs = {n: values[n] for n in params if n in values and n != "loss"}
        train_op = factory(loss, **kwargs)
        if isinstance(train_op, tuple):
            train_op = train_op[0]
        step = tf.train.get_global_step()
        with tf.Session(graph=graph) as sess:
            sess.run(tf.global_variables_initializer())
            states = []
            for value in (1.0, math.inf if scaled else 1.0, 1.0):
                sess.run(train_op, {k: value})
                states.append((sess.run(w).tolist(), int(sess.run(step))))
    if scaled:
        ok = states[1] == states[0] and states[2][1] == states[0][1] + 1
        what = "overflow skipped, step advanced on clean steps only"
    else:
        ok = states[2][1] == states[0][1] + 2
        what = "three clean steps"
    return ("ok (" + what + ")") if ok else f"FAIL {states}"

# A factory that takes horovod as an argument is trained without it (hvd=None, as the harness
# always did) and, where the file loaded the single-worker stub, once more with it, so the
# port's code on the horovod branch is built and run too (as one worker: no evidence beyond).
if (tf1 or v1_import) and callable(factory) and not config["import_only"]:
    variants = [None]
    stub = sys.modules.get("horovod.tensorflow")
    if "hvd" in inspect.signature(factory).parameters and stub is not None and (
            getattr(stub, "__file__", "") or "").startswith(config["stubs"]):
        variants.append(stub)
    outcomes = []
    for hvd in variants:
        try:
            outcome = train(hvd)
        except Exception as error:
            outcome = f"FAIL {type(error).__name__}: {str(error).splitlines()[0][:160]}"
        outcomes.append(outcome + (" (hvd=stub)" if hvd and outcome.startswith("FAIL") else ""))
    failed = [o for o in outcomes if o.startswith("FAIL")]
    result["train"] = failed[0] if failed else outcomes[0]
    if len(variants) > 1 and not failed:
        result["train"] += " (also with hvd=stub)"
print(json.dumps(result))
"""
)


# The PyTorch path: compile, import the library, bind every ported GradScaler call to the
# library's signature (placeholder values), then import the file itself.
_TORCH_PROBE = (
    r"""
import ast, inspect, json, sys
config = json.loads(sys.argv[1])
path = config["path"]
result = {"import": "ok", "train": "n/a"}
source = open(path, "rb").read()
try:
    tree = ast.parse(source)
    compile(tree, path, "exec")
except SyntaxError as error:
    result["import"] = f"FAIL SyntaxError: {error}"
    print(json.dumps(result)); sys.exit(0)
import torch
import npu_lossscale.torch
ported = npu_lossscale.torch.GradScaler
assert issubclass(ported, torch.amp.GradScaler)
local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
         and n.module == "npu_lossscale.torch" for a in n.names if a.name == "GradScaler"}
def name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return name(node.value) + "." + node.attr
    return ""
calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
         and (name(n.func) == "npu_lossscale.torch.GradScaler" or name(n.func) in local)]
signature = inspect.signature(ported)
for call in calls:
    try:
        signature.bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})
    except TypeError as error:
        result["import"] = f"FAIL GradScaler call at line {call.lineno} does not bind: {error}"
        print(json.dumps(result)); sys.exit(0)
bound = f"{len(calls)} GradScaler call(s) bind"
"""
    + _LOAD
    + r"""
try:
    load()
    result["import"] = f"ok{stubs_used()}; {bound}"
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing in ("torch", "npu_lossscale"):
        result["import"] = f"FAIL ModuleNotFoundError: {error}{stubs_used()}"
        result["where"] = where(error)
    else:
        result["import"] = f"n/a (needs {error.name}){stubs_used()}; {bound}"
except ImportError as error:
    if "no known parent package" in str(error):  # `from . import x`: the file came alone
        result["import"] = f"n/a (needs its package); {bound}"
    else:
        first = str(error).splitlines()[0][:160]
        result["import"] = f"FAIL ImportError: {first}{stubs_used()}"
        result["where"] = where(error)
except Exception as error:
    first = str(error).splitlines()[0][:160]
    result["import"] = f"FAIL {type(error).__name__}: {first}{stubs_used()}"
    result["where"] = where(error)
print(json.dumps(result))
"""
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


def check(row: Row, original: bytes, ported: bytes, warnings: set[str]) -> None:
    text = ported.decode("utf-8", "replace")
    code = _code_without_comments(text)
    for item in row.expect:
        name, _, arg = item.partition(":")
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


def _probe_one(
    path: Path,
    project: Project | None,
    tree: Path,
    torch: bool,
    import_only: bool,
    python: str = sys.executable,
) -> dict[str, str]:
    """Run one probe process on one file of a tree (ported or original) with one interpreter and
    return its result. This repository goes first on PYTHONPATH, so the probe imports this tree's
    npu_lossscale, not whatever an interpreter has installed."""
    source = path.read_text(encoding="utf-8", errors="replace")
    tf1 = "compat.v1" not in source and "import tensorflow" in source
    if "import tensorflow" not in source and "from tensorflow" not in source:
        tf1 = False
    config = {"path": str(path), "root": None, "module": None, "stubs": str(STUBS) + "/"}
    config.update(tf1=tf1, scaled="NPULossScaleOptimizer" in source, import_only=import_only)
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
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE if torch else _PROBE, json.dumps(config)],
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
    row: Row, trees: tuple[Path, Path], project: Project | None, torch: bool, python: str
) -> dict[str, str]:
    """Probe the ported file with one interpreter; where it fails to import, probe the original
    in the same place: where the original fails the same way, the port is not the cause (the
    file needs an API that stack lacks), n/a."""
    ported_tree, original_tree = trees
    result = _probe_one(ported_tree / row.path, project, ported_tree, torch, False, python)
    if result["import"].startswith("FAIL npu_lossscale"):  # the library, not the file: no n/a
        return result
    if result["import"].startswith("FAIL"):
        before = _probe_one(original_tree / row.path, project, original_tree, torch, True, python)
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
    tf1_stacks: dict[str, str],
) -> None:
    """Import the ported file in a fresh process (from its project root where extras.tsv names
    one, so its real siblings import) and train its create_optimizer where it has one, under TF
    2.21 (or torch); a TF 1 file is then imported and trained again on every stack of tf1_stacks
    (label: interpreter), e.g. TF 1.15 with reference variables, as it runs there."""
    source = (trees[0] / row.path).read_text(encoding="utf-8", errors="replace")
    torch = "npu_lossscale.torch" in source
    result = _probe_compared(row, trees, project, torch, sys.executable)
    row.imported, row.trained = result["import"], result["train"]
    checked = [("import", row.imported), ("train", row.trained)]
    for label, python in tf1_stacks.items() if result.get("tf1") and not torch else ():
        other = _probe_compared(row, trees, project, False, python)
        row.stacks[label] = (other["import"], other["train"])
        checked += [(f"import on {label}", other["import"]), (f"train on {label}", other["train"])]
    for what, value in checked:
        if value.startswith("FAIL") and not warnings - _STANDING_NOTES:
            row.failures.append(f"{what} failed with no warning: {value}")


def run(
    snapshot: Path,
    rows: list[Row],
    projects: list[Project],
    report: bool = True,
    tf1_stacks: dict[str, str] | None = None,
) -> int:
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp)
        reports = {}
        for folder, options in sorted({(r.folder, r.options) for r in rows}):
            reports[folder, options] = port(snapshot, work, folder, options)
            tag = folder + "".join(o.replace("=", "-") for o in options)
            # The siblings are ported too, in a run of their own (so the rows' port and its report
            # stay the manifest's alone), and sit under the ported rows as a user's port has them.
            if (snapshot / ".extras" / folder).exists():
                port(snapshot / ".extras", work / "siblings", folder, options)
                overlay(work / "siblings" / "out" / tag, work / "out" / tag)
        for folder in sorted({r.folder for r in rows}):  # the originals, beside the same siblings
            shutil.copytree(snapshot / folder, work / "original" / folder)
            overlay(snapshot / ".extras" / folder, work / "original" / folder)
        for row in rows:
            original = (snapshot / row.folder / row.path).read_bytes()
            tag = row.folder + "".join(o.replace("=", "-") for o in row.options)
            ported_path = work / "out" / tag / row.path
            ported = ported_path.read_bytes() if ported_path.exists() else original
            findings = [
                f
                for f in reports[row.folder, row.options].get("findings", [])
                if Path(f["path"]).resolve() == (snapshot / row.folder / row.path).resolve()
            ]
            warnings = {f["rule"] for f in findings if f["kind"] == "warning"}
            check(row, original, ported, warnings)
            if ported != original and row.path.endswith(".py"):
                trees = (work / "out" / tag, work / "original" / row.folder)
                probe(row, trees, warnings, project_of(row, projects), tf1_stacks or {})
    table = render(rows, list(tf1_stacks or {}))
    print(table)
    if report:
        (snapshot / "REPORT.md").write_text(table + "\n", encoding="utf-8")
    return 1 if any(r.failures for r in rows) else 0


def render(rows: list[Row], stacks: list[str] | None = None) -> str:
    stacks = stacks or []
    extra = "".join(f" import on {s} | train on {s} |" for s in stacks)
    lines = [
        f"| repository | file | kind | expectations | import | train |{extra} why it fails |",
        "|---|---|---|---|---|---|" + "---|" * (2 * len(stacks)) + "---|",
    ]
    for row in rows:
        passed = len(row.expect) - sum(f.startswith("expected") for f in row.failures)
        cells = "".join(" {} | {} |".format(*row.stacks.get(s, ("-", "-"))) for s in stacks)
        lines.append(
            f"| {row.repo} | {row.path} | {row.kind} | {passed}/{len(row.expect)} | "
            f"{row.imported} | {row.trained} |{cells} {'; '.join(row.failures) or ''} |"
        )
    bad = sum(1 for r in rows if r.failures)
    repos = len({r.repo for r in rows})
    lines.append("")
    lines.append(f"{len(rows)} files from {repos} repositories: {len(rows) - bad} pass, {bad} fail")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path, help="where the files are (or are written)")
    parser.add_argument("--materialize", action="store_true", help="write them from mirrors")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--extras", type=Path, default=EXTRAS)
    parser.add_argument("--only", help="run only the rows whose repository or path has this text")
    parser.add_argument(
        "--tf1-stack",
        action="append",
        default=[],
        metavar="LABEL=PYTHON",
        help="also import and train every changed TF 1 file with this interpreter (e.g. "
        "tf1.15=/work/main/.venv-tf115/bin/python: TF 1.15, reference variables); repeatable",
    )
    args = parser.parse_args()
    tf1_stacks = dict(s.split("=", 1) for s in args.tf1_stack)
    rows = read_manifest(args.manifest)
    projects = read_extras(args.extras)
    if args.materialize:
        if args.snapshot.exists():
            shutil.rmtree(args.snapshot)
        materialize(rows, args.snapshot, args.mirrors)
        materialize_extras(projects, args.snapshot, args.mirrors)
    if args.only:  # a partial run prints its table but leaves REPORT.md as the full run wrote it
        rows = [r for r in rows if args.only in r.repo or args.only in r.path]
    return run(args.snapshot, rows, projects, report=not args.only, tf1_stacks=tf1_stacks)


if __name__ == "__main__":
    sys.exit(main())
