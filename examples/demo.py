"""`make demo`: the library on its own, the whole port of a GPU-style script, then PyTorch.

1. TensorFlow: a small fp16 model on a simulated saturating chip, trained with the matching overflow
   mode and with the wrong one, and on an IEEE device (library_demo.py; writes a PNG).
2. Copy examples/train_fp16.py (a TF1 script written for tf.contrib.mixed_precision) to a build
   directory, show what `npu-migrate` would change and its report, apply the port, and train the
   ported script for a few hundred CPU steps with the loss-scale trace.
3. PyTorch: the same lesson with npu_lossscale.torch.GradScaler, a small float16 model on a
   simulated saturating chip trained in the matching mode and the wrong one, and on an IEEE device
   (demo_torch.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent


def banner(text: str) -> None:
    print(f"\n{'=' * 78}\n{text}\n{'=' * 78}", flush=True)


# TensorFlow's C++ start-up lines (CPU features, oneDNN notices, one of them at E level) read like
# failures to a newcomer and say nothing about loss scaling. The oneDNN notice comes before the log
# level applies, so oneDNN itself is turned off (the demo's models are tiny).
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def run(*args: str, check: bool = True) -> int:
    print(f"$ {' '.join(args)}", flush=True)
    return subprocess.run(args, cwd=ROOT, check=check, env=QUIET).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build" / "demo")
    args = parser.parse_args()
    python = sys.executable

    banner("1/3  npu_lossscale (TensorFlow): the overflow mode must match the device")
    plot = args.build_dir / "loss_scale.png"
    run(python, str(EXAMPLES / "library_demo.py"), "--steps", str(args.steps), "--plot", str(plot))

    banner("2/3  npu-migrate: port examples/train_fp16.py, then train the ported script")
    build = args.build_dir / "port"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    script = build / "train_fp16.py"
    shutil.copy2(EXAMPLES / "train_fp16.py", script)
    rel = str(script.relative_to(ROOT))
    print("Review first: the diff npu-migrate proposes (nothing is written yet).", flush=True)
    run(python, "-m", "migrator", "--no-color", rel)
    report = build / "report.md"
    run(
        python,
        "-m",
        "migrator",
        "--write",
        "--report",
        str(report.relative_to(ROOT)),
        "--report",
        str((build / "report.json").relative_to(ROOT)),
        rel,
    )
    print(f"The Markdown report, {report.relative_to(ROOT)}:\n", flush=True)
    print(report.read_text(encoding="utf-8"), flush=True)
    print("A second run finds nothing left to port:", flush=True)
    run(python, "-m", "migrator", "--check", rel)
    run(python, rel, "--steps", str(args.steps))

    banner("3/3  npu_lossscale.torch (PyTorch): the overflow mode must match the device")
    run(python, str(EXAMPLES / "demo_torch.py"), "--steps", str(args.steps))


if __name__ == "__main__":
    main()
