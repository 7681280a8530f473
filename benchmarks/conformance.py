"""Run the replaced classes' own upstream test suites against ours and against stock's: one table.

    python benchmarks/conformance.py SNAPSHOT_DIR --materialize [--mirrors DIR]  # fetch the texts
    python benchmarks/conformance.py SNAPSHOT_DIR                                # run them

Each suite is a script in benchmarks/conformance/ (files starting with "_" are its helpers). The
driver runs every one present with this Python as ``SCRIPT SNAPSHOT_DIR -v``; contrib.py starts TF
1.15's Python itself (.venv-tf115), and tf_keras.py runs a second time with TF 2.6.5's (.venv-tf265:
Keras 2.6's suite; with this Python it runs tf_keras's on TF 2.21). Each prints one line per suite
and mode, ``SUITE: ours P/N, stock C/N``, and on stderr one ``--- ours fails ...`` line per test
ours fails. The driver prints the table and exits 1 when a script fails to run or ours fails a test
that DELIBERATE below does not list (each entry a difference from stock chosen on purpose, with its
reason; the README's "differences from stock" table says the same).

The texts are upstream files at pinned commits, never copied into this repository.
``--materialize`` has each script write its own into SNAPSHOT_DIR/OWNER+NAME/PATH from a bare
clone at MIRRORS/OWNER+NAME/repo (default MIRRORS: /work/.mirror; elsewhere make one with
``git clone --bare https://github.com/OWNER/NAME MIRRORS/OWNER+NAME/repo``):

- torch.py: Ascend/pytorch (torch-npu, whose version.txt lists torch 2.13-2.15) at
  9e73e708ab9350d203475609f36f8a43f6a0c2ab: test/test_torch.py (its copy of PyTorch's) and
  test/npu/test_amp.py.
- keras3.py: keras-team/keras v3.15.1 at 250b42181ce9f37df68319d8f4753ec89a349a43:
  keras/src/optimizers/loss_scale_optimizer_test.py.
- tf_keras.py: keras-team/tf-keras v2.21.0 at 631ed411d9e55e40b1ecaae7b046bba14752f46e:
  tf_keras/mixed_precision/loss_scale_optimizer_test.py; keras-team/keras v2.6.0 at
  3a33d53ea4aca312c5ad650b4883d9bac608a32e: keras/mixed_precision/loss_scale_optimizer_test.py.
- contrib.py: tensorflow/tensorflow v1.15 at 0b024689 and c2c91d93 (contrib.py's PINNED):
  tensorflow/contrib/mixed_precision/python/loss_scale_manager_test.py and
  loss_scale_optimizer_test.py.

Needs, besides the main stack: ``expecttest`` (torch's test helpers import it; in the dev extra).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SUITES = Path(__file__).resolve().parent / "conformance"
LINE = re.compile(r"^(?P<suite>[^:\n]+): ours (?P<p>\d+)/(?P<n>\d+), stock (?P<c>\d+)/(?P<m>\d+)")
FAILS = "--- ours fails "

# What ours fails on purpose: a failure line's text after "--- ours fails " -> why. A user who
# needs stock's behaviour gets it through the option named.
DELIBERATE = {
    "torch[inf_nan] test_grad_scaling_multiple_cpu": (
        "one decision for the optimizers one backward pass wrote: with only optimizer1's "
        "gradients overflowed stock applies optimizer0 and skips optimizer1, a half-updated "
        "model; ours skips both (per_optimizer=True gives stock's decisions and passes)"
    ),
    "torch[saturation] test_grad_scaling_multiple_cpu": "as torch[inf_nan]",
    "torch-npu[per_optimizer] test_grad_scaling_multiple_2": (
        "per_optimizer=True asks for stock torch's per-optimizer decisions, which torch-npu's "
        "own test rejects: torch-npu skips every optimizer, as our default does"
    ),
    "upstream_loss_scale_optimizer_test.LossScaleOptimizerTest.test_init_dynamic_arg": (
        "Keras 3's class refuses `dynamic=`; ours takes dynamic=False for a fixed scale, as the "
        "Ascend adapter's FixedLossScaleManager gives (leave it out for stock's behaviour)"
    ),
    "upstream_loss_scale_optimizer_test.LossScaleOptimizerTest."
    "testConvertToLegacyOptimizer": (
        "tf_keras's convert_to_legacy_optimizer rebuilds its own class by name; ours is "
        "registered as npu_lossscale>LossScaleOptimizer, so the converter gives Keras's own class"
    ),
    "upstream_loss_scale_optimizer_test.LossScaleOptimizerTest."
    "testSerializationWithBuiltInOptimizerV1_test_mode_eager": (
        "Keras 2.6's deserialize rebuilds its own LossScaleOptimizer by name; ours is registered "
        "under its own name, so the round trip gives Keras's class"
    ),
    "upstream_loss_scale_optimizer_test.LossScaleOptimizerTest."
    "testSerializationWithBuiltInOptimizerV1_test_mode_graph": "as in eager mode",
}


@dataclass
class Result:
    script: str
    lines: list[re.Match] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    error: str = ""


# Suites that also run on an older stack's venv (built by `make test`): Keras 2.6's own tests on
# TF 2.6.5. A missing venv is a line in the table, not a silent pass.
OTHER_STACKS = {"tf_keras.py": [Path(__file__).resolve().parent.parent / ".venv-tf265/bin/python"]}


def run_script(script: Path, snapshot: Path, python: Path | str = sys.executable) -> Result:
    if not Path(python).exists():
        result = Result(script.name)
        result.error = f"no {python}: run `make stack-venvs`"
        return result
    done = subprocess.run(
        [str(python), str(script), str(snapshot), "-v"], capture_output=True, text=True
    )
    result = Result(script.name)
    result.lines = [m for m in map(LINE.match, done.stdout.splitlines()) if m]
    result.failures = [
        line[len(FAILS) :].strip() for line in done.stderr.splitlines() if line.startswith(FAILS)
    ]
    if done.returncode != 0 or not result.lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result.error = f"exit {done.returncode}: {tail}"
    return result


def _deliberate(failure: str) -> str | None:
    for key, reason in DELIBERATE.items():
        if failure == key or failure.startswith(key + " "):
            return reason
    return None


def report(results: list[Result]) -> int:
    width = max([len(m["suite"]) for r in results for m in r.lines] + [len("suite")])
    print(f"{'suite':<{width}}  {'ours':>7}  {'stock':>7}")
    for result in results:
        for m in result.lines:
            ours, stock = f"{m['p']}/{m['n']}", f"{m['c']}/{m['m']}"
            print(f"{m['suite']:<{width}}  {ours:>7}  {stock:>7}")
        if result.error:
            print(f"{result.script:<{width}}  did not run ({result.error})")
    unexpected = []
    deliberate = []
    for result in results:
        for failure in result.failures:
            reason = _deliberate(failure)
            (deliberate if reason else unexpected).append((failure, reason))
    if deliberate:
        print("\ndeliberate differences:")
        for failure, reason in deliberate:
            print(f"  {failure}: {reason}")
    if unexpected:
        print("\nours fails, not a deliberate difference:")
        for failure, _ in unexpected:
            print(f"  {failure}")
    return 1 if unexpected or any(r.error for r in results) else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="conformance.py", description=__doc__.split("\n")[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--materialize", action="store_true", help="write the texts and exit")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    args = parser.parse_args(argv)
    scripts = sorted(p for p in SUITES.glob("*.py") if not p.name.startswith("_"))
    if args.materialize:
        failed = []
        for script in scripts:
            command = [sys.executable, str(script), str(args.snapshot), "--materialize"]
            done = subprocess.run([*command, "--mirrors", str(args.mirrors)], check=False)
            if done.returncode != 0:
                failed.append(script.name)
        if failed:
            print(f"could not materialize: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    results = [run_script(script, args.snapshot) for script in scripts]
    for script in scripts:
        others = OTHER_STACKS.get(script.name, [])
        results += [run_script(script, args.snapshot, python) for python in others]
    return report(results)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
