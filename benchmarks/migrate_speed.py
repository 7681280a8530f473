"""How fast is `npu-migrate --check` on a large tree, next to TensorFlow's own `tf_upgrade_v2`?

Generates a seeded tree of realistic TF1 training code (mostly models, input pipelines and
utilities with no loss-scale code at all; a few per cent using tf.contrib.mixed_precision, some of
them with a BERT-style `create_optimizer`), then times both tools on it as subprocesses, by wall
clock and CPU time (worker processes included), interleaved when repeated, and prints the medians
and the ratios ours / tf_upgrade_v2 (CPU time is the one to trust on a shared machine).
The target is a ratio of at most 0.1. Also prints how long `npu-migrate --help` takes.

`--tree DIR` times a real tree instead, less the files tf_upgrade_v2 aborts a whole run on
(`refused_by_tf_upgrade_v2`; both tools are timed on the same files). Every run also prints how
many files reach libcst (the byte pre-filter and the ast triage clear the rest) and the median
and 95th percentile of the CPU seconds each of those costs, measured one file at a time in this
process.

`--long N` times one generated module of N lines with a single loss-scale call among N statements
that reassign one name (the shape of generated code that made libcst's scope analysis quadratic);
there the target is under 2 s at 20,000 lines.

    .venv/bin/python benchmarks/migrate_speed.py [--files 2000] [--repeats 1] [--jobs N]
    .venv/bin/python benchmarks/migrate_speed.py --tree /path/to/real/tree --repeats 3
    .venv/bin/python benchmarks/migrate_speed.py --long 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent

HEADER = '''# Copyright {year} The {org} Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
"""{doc}"""

from __future__ import absolute_import, division, print_function

import collections
import os

import numpy as np
import tensorflow as tf
'''

MODEL_BLOCK = '''

def {name}_block(inputs, filters, is_training, scope="{name}"):
    """Conv, batch norm and ReLU, the way TF1 ResNets were written."""
    with tf.variable_scope(scope, reuse=tf.AUTO_REUSE):
        kernel = tf.get_variable(
            "kernel", [3, 3, inputs.shape[-1], filters],
            initializer=tf.contrib.layers.xavier_initializer())
        net = tf.nn.conv2d(inputs, kernel, strides=[1, 1, 1, 1], padding="SAME")
        net = tf.layers.batch_normalization(net, training=is_training, momentum={momentum})
        net = tf.nn.relu(net)
        net = tf.layers.dropout(net, rate={rate}, training=is_training)
        tf.summary.histogram("{name}_activations", net)
        return net


def {name}_head(features, num_classes={classes}):
    net = tf.reduce_mean(features, axis=[1, 2], keep_dims=True)
    net = tf.squeeze(net, axis=[1, 2])
    logits = tf.layers.dense(net, num_classes, name="{name}_logits")
    probabilities = tf.nn.softmax(logits, dim=-1)
    return logits, probabilities
'''

DATA_BLOCK = """

def {name}_parse(serialized):
    features = tf.parse_single_example(serialized, {{
        "image/encoded": tf.FixedLenFeature([], tf.string),
        "image/class/label": tf.FixedLenFeature([], tf.int64, default_value=-1),
        "image/height": tf.FixedLenFeature([], tf.int64),
    }})
    image = tf.image.decode_jpeg(features["image/encoded"], channels=3)
    image = tf.image.resize_images(image, [{size}, {size}])
    image = tf.to_float(image) / 255.0
    label = tf.cast(features["image/class/label"], tf.int32)
    return image, label


def {name}_input_fn(file_pattern, batch_size={batch}, is_training=True):
    files = tf.gfile.Glob(file_pattern)
    dataset = tf.data.TFRecordDataset(files, num_parallel_reads=8)
    if is_training:
        dataset = dataset.shuffle(buffer_size={buffer}).repeat()
    dataset = dataset.map({name}_parse, num_parallel_calls=4)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    iterator = dataset.make_one_shot_iterator()
    return iterator.get_next()
"""

UTIL_BLOCK = '''

class {cls}(object):
    """Keeps running statistics of {name} for logging."""

    def __init__(self, window={window}):
        self.window = window
        self.values = collections.deque(maxlen=window)

    def update(self, value):
        self.values.append(float(value))
        return self.mean()

    def mean(self):
        if not self.values:
            return 0.0
        return sum(self.values) / len(self.values)


def {name}_log(step, values, log_dir="/tmp/{name}"):
    if not os.path.isdir(log_dir):
        os.makedirs(log_dir)
    line = " ".join("%s=%.4f" % (k, v) for k, v in sorted(values.items()))
    tf.logging.info("step %d: %s", step, line)
    return np.asarray(list(values.values()), dtype=np.float32)
'''

TRAIN_BLOCK = """

def {name}_train(loss, learning_rate={lr}):
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.train.MomentumOptimizer(learning_rate, momentum=0.9)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_op = optimizer.minimize(loss, global_step=global_step)
    saver = tf.train.Saver(max_to_keep=5)
    return train_op, saver
"""

MIXED_PRECISION_BLOCK = """

def build_mixed_precision_optimizer(learning_rate, dynamic={dynamic}):
    opt = tf.train.AdamOptimizer(learning_rate)
    if dynamic:
        manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(
            init_loss_scale=2 ** 32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,
            decr_ratio=0.5)
    else:
        manager = tf.contrib.mixed_precision.FixedLossScaleManager({scale})
    return tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)
"""

BERT_BLOCK = '''

def create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps, use_fp16=True):
    """Creates an optimizer training op (BERT style)."""
    global_step = tf.train.get_or_create_global_step()
    learning_rate = tf.constant(value=init_lr, shape=[], dtype=tf.float32)
    learning_rate = tf.train.polynomial_decay(
        learning_rate, global_step, num_train_steps, end_learning_rate=0.0, power=1.0)
    optimizer = tf.train.AdamOptimizer(learning_rate=learning_rate, epsilon=1e-6)
    if use_fp16:
        loss_scale_manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(
            init_loss_scale=2 ** 32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,
            decr_ratio=0.5)
        optimizer = tf.contrib.mixed_precision.LossScaleOptimizer(optimizer, loss_scale_manager)
    tvars = tf.trainable_variables()
    grads_and_vars = optimizer.compute_gradients(loss, tvars)
    grads = [g for g, _ in grads_and_vars]
    (grads, _) = tf.clip_by_global_norm(grads, clip_norm=1.0)
    train_op = optimizer.apply_gradients(list(zip(grads, tvars)), global_step=global_step)
    new_global_step = global_step + 1
    train_op = tf.group(train_op, [global_step.assign(new_global_step)])
    return train_op
'''

WORDS = [
    "resnet",
    "bottleneck",
    "encoder",
    "decoder",
    "attention",
    "embed",
    "stem",
    "pool",
    "vision",
    "speech",
    "ranker",
    "tower",
    "mixer",
    "cifar",
    "imagenet",
    "squad",
]


def generate_file(rng: random.Random, index: int) -> str:
    kind = rng.random()
    text = HEADER.format(
        year=rng.randint(2016, 2020),
        org=rng.choice(["TensorFlow", "Acme"]),
        doc=f"Module {index}: generated training code.",
    )
    blocks = rng.randint(8, 14)
    for b in range(blocks):
        name = f"{rng.choice(WORDS)}_{index}_{b}"
        block = rng.choice([MODEL_BLOCK, MODEL_BLOCK, DATA_BLOCK, UTIL_BLOCK, TRAIN_BLOCK])
        text += block.format(
            name=name,
            cls=name.title().replace("_", ""),
            momentum=rng.choice([0.9, 0.997]),
            rate=rng.choice([0.1, 0.2, 0.5]),
            classes=rng.choice([10, 100, 1000]),
            size=rng.choice([224, 299, 32]),
            batch=rng.choice([32, 64, 256]),
            buffer=rng.choice([1000, 10000]),
            window=rng.choice([10, 100]),
            lr=rng.choice([0.1, 0.01]),
        )
    if kind < 0.03:
        text += MIXED_PRECISION_BLOCK.format(
            dynamic=rng.choice([True, False]), scale=rng.choice([128, 512, 1024])
        )
    elif kind < 0.05:
        text += BERT_BLOCK
    return text


def generate_tree(root: Path, files: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    lines = 0
    for i in range(files):
        package = root / f"pkg{i % 23:02d}" / f"sub{i % 7}"
        package.mkdir(parents=True, exist_ok=True)
        text = generate_file(rng, i)
        lines += text.count("\n")
        (package / f"module_{i:05d}.py").write_text(text)
    return files, lines


def generate_long(root: Path, lines: int) -> tuple[int, int]:
    root.mkdir(parents=True)
    head = [
        "import tensorflow as tf",
        "",
        "def build(opt, steps):",
        "    manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**32, steps)",
        "    return tf.contrib.mixed_precision.LossScaleOptimizer(opt, manager)",
        "",
        "table = tf.constant(0)",
    ]
    body = [f"table = tf.add(table, {i}) if {i} % 3 else tf.identity(table)" for i in range(lines)]
    text = "\n".join(head + body) + "\n"
    (root / "generated_table.py").write_text(text)
    return 1, text.count("\n")


def count_candidates(tree: Path) -> tuple[int, list, set[str]]:
    """Files passing the byte pre-filter, of those the files the CLI parses with libcst (what
    the ast triage keeps), and the paths among these it reads for their plan facts alone; the rest
    cost it only a read and a byte scan."""
    sys.path.insert(0, str(REPO))
    from migrator.pipeline.runner import _triage
    from migrator.selection.prefilter import might_need_migration
    from migrator.sources.files import SourceFile

    sources = [(SourceFile(p, str(p)), p.read_bytes()) for p in sorted(tree.rglob("*.py"))]
    admitted = [(s, d) for s, d in sources if might_need_migration(d)]
    parsed, for_plan, _ = _triage(admitted, add_loss_scale=False)
    return len(admitted), parsed, for_plan


def libcst_cpu_seconds(parsed: list, for_plan: set[str]) -> list[float]:
    """CPU seconds of the libcst work on each file the triage keeps, in this process, one file at
    a time, through the command line's own per-file steps: `prepare_one` (parse, metadata,
    codemods) then `finish_one` (its part of the project plan, and for a ported file the
    realignment of its continuation lines and the check that it parses). A file that fails costs
    what it cost until it failed. The garbage collector runs as `npu-migrate` runs it (paused
    during each step, a young collection after it, which is counted): under Python's default
    thresholds it would walk every file's trees many times over, which the tool never does."""
    from migrator.findings import SourceError
    from migrator.pipeline.processes import collect_between_files
    from migrator.pipeline.runner import finish_one, prepare_one
    from migrator.pipeline.transform import MigrateOptions, plan_from_facts, scan_source

    options = MigrateOptions()
    facts = []
    for source, data in parsed:
        try:
            facts.append(scan_source(data, path=source.display))
        except SourceError:
            continue
    plan = plan_from_facts(facts)
    collect_between_files()
    seconds = []
    for source, data in parsed:
        start = time.process_time()
        only = source.display in for_plan
        prepared, _, _ = prepare_one(source.display, data, options, facts_only=only)
        if prepared is not None:
            finish_one(prepared, plan, options)
        seconds.append(time.process_time() - start)
    return seconds


def refused_by_tf_upgrade_v2(tree: Path) -> list[Path]:
    """The files `tf_upgrade_v2 --intree` aborts the whole run on, found one at a time in this
    process with its own upgrader: it reports a file Python cannot parse and goes on, but an
    error of its source-annotating parser (pasta: `f"{x=}"`, some slices) or an undecodable file
    ends the run. Real trees hold such files; the issue's own measurement left them out too."""
    from tensorflow.tools.compatibility import ast_edits, tf_upgrade_v2

    upgrader = ast_edits.ASTCodeUpgrader(tf_upgrade_v2.TFAPIChangeSpec())
    refused = []
    with contextlib.redirect_stdout(io.StringIO()):  # its per-file notes
        for path in sorted(tree.rglob("*.py")):
            try:
                with open(path) as handle:  # as tf_upgrade_v2 opens it: the locale's encoding
                    upgrader.update_string_pasta(handle.read(), str(path))
            except Exception:  # noqa: BLE001 - whatever stops tf_upgrade_v2 stops it here
                refused.append(path)
    return refused


def linked_copy(tree: Path, dest: Path, left_out: list[Path]) -> Path:
    """`tree`'s Python files without `left_out`, hard-linked (a copy where links fail)."""
    skip = set(left_out)
    for path in tree.rglob("*.py"):
        if path in skip or not path.is_file():
            continue
        target = dest / path.relative_to(tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    return dest


def ours_command(tree: Path, jobs: int | None) -> list[str]:
    script = BIN / "npu-migrate"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "migrator"]
    extra = ["--jobs", str(jobs)] if jobs else []
    return [*base, "--check", "--quiet", *extra, str(tree)]


def timed(cmd: list[str], ok_codes: tuple[int, ...], env: dict[str, str] | None = None) -> float:
    return timed_cpu(cmd, ok_codes, env)[0]


def compiled_env(cache: Path) -> dict[str, str]:
    """The environment with Python's bytecode cache on, kept under `cache`.

    pip compiles a package's modules when it installs them, so tf_upgrade_v2 (and libcst) start
    from bytecode; this checkout is installed editable, and where PYTHONDONTWRITEBYTECODE is set
    (these machines set it) every run of npu-migrate compiled its own modules from source first,
    a cost no installed copy pays: a third of a second per run, 15% of the 20,000-line module's
    run. The cache is filled here, as pip would at install time."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    command = [sys.executable, "-m", "compileall", "-q", str(REPO / "migrator")]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return env


def timed_cpu(
    cmd: list[str], ok_codes: tuple[int, ...], env: dict[str, str] | None = None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; the CPU time (user + system, worker processes
    included) is what to compare on a machine other work shares, where wall time is noise."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=env)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok_codes:
        raise SystemExit(f"{cmd[0]} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="files in the generated tree")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of each tool")
    parser.add_argument(
        "--jobs", type=int, default=None, help="npu-migrate --jobs (default: its own)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="a real tree of Python files to time instead of the generated one",
    )
    parser.add_argument(
        "--long",
        type=int,
        default=None,
        metavar="LINES",
        help="time one generated module of this many lines instead of a tree",
    )
    args = parser.parse_args()
    if args.files < 1 or args.repeats < 1:
        parser.error("--files and --repeats must be at least 1")

    upgrade = BIN / "tf_upgrade_v2"
    if not upgrade.exists():
        raise SystemExit(f"tf_upgrade_v2 not found next to {sys.executable}")
    env_note = f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    with tempfile.TemporaryDirectory(prefix="npu-migrate-bench-") as tmp:
        if args.tree is not None:
            tree = args.tree.resolve()
            refused = refused_by_tf_upgrade_v2(tree)
            if refused:
                tree = linked_copy(tree, Path(tmp) / "accepted", refused)
                print(
                    f"tf_upgrade_v2 aborts a whole run on {len(refused)} of the tree's files "
                    f"(first: {refused[0]}): both tools are timed on the others"
                )
            sources = list(tree.rglob("*.py"))
            files = len(sources)
            lines = sum(p.read_bytes().count(b"\n") for p in sources)
        elif args.long is not None:
            tree = Path(tmp) / "long"
            files, lines = generate_long(tree, args.long)
        else:
            tree = Path(tmp) / "tree"
            files, lines = generate_tree(tree, args.files, args.seed)
        candidates, parsed, for_plan = count_candidates(tree)
        print(
            f"tree: {files} files, {lines} lines, {candidates} pass the byte pre-filter, "
            f"{len(parsed)} of them the ast triage and reach libcst ({len(for_plan)} of those for "
            f"their global-step plan facts only; {env_note}; load {os.getloadavg()[0]:.2f})"
        )
        if parsed:
            cpu = sorted(libcst_cpu_seconds(parsed, for_plan))
            p95 = cpu[min(len(cpu) - 1, round(0.95 * (len(cpu) - 1)))]
            print(
                f"CPU per libcst file: median {statistics.median(cpu):.3f} s, p95 {p95:.3f} s "
                f"(target: median <= 0.1 s)"
            )

        env = compiled_env(Path(tmp) / "pycache")
        help_command = [*ours_command(tree, None)[:-3], "--help"]  # the command alone
        help_times = [timed(help_command, (0,), env) for _ in range(5)]
        print(f"npu-migrate --help: median {statistics.median(help_times) * 1000:.0f} ms")

        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for i in range(args.repeats):
            ours.append(timed_cpu(ours_command(tree, args.jobs), (0, 1), env))
            out = Path(tmp) / f"upgraded{i}"
            theirs.append(
                timed_cpu(
                    [
                        str(upgrade),
                        "--intree",
                        str(tree),
                        "--outtree",
                        str(out),
                        "--reportfile",
                        str(Path(tmp) / f"report{i}.txt"),
                    ],
                    (0,),
                )
            )
            shutil.rmtree(out, ignore_errors=True)
            print(
                f"run {i + 1}: npu-migrate --check {ours[-1][0]:.2f} s (CPU {ours[-1][1]:.2f} s), "
                f"tf_upgrade_v2 {theirs[-1][0]:.2f} s (CPU {theirs[-1][1]:.2f} s)"
            )

    mine, base = statistics.median(w for w, _ in ours), statistics.median(w for w, _ in theirs)
    mine_cpu = statistics.median(c for _, c in ours)
    base_cpu = statistics.median(c for _, c in theirs)
    print(f"CPU: npu-migrate --check median {mine_cpu:.2f} s, tf_upgrade_v2 {base_cpu:.2f} s")
    print(f"CPU-time ratio, ours to tf_upgrade_v2: {mine_cpu / base_cpu:.3f}")
    print(f"npu-migrate --check: median {mine:.2f} s ({lines / mine:,.0f} lines/s)")
    print(f"tf_upgrade_v2:       median {base:.2f} s ({lines / base:,.0f} lines/s)")
    if args.long is not None:
        print(f"one {lines}-line module: npu-migrate --check {mine:.2f} s (target < 2 s at 20,000)")
    print(f"ratio ours / tf_upgrade_v2: {mine / base:.3f} (target <= 0.1)")


if __name__ == "__main__":
    main()
