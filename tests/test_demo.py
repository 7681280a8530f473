"""The TensorFlow part of `make demo` shows what the overflow modes are for, without log noise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_library_demo_shows_the_wrong_mode_missing_every_overflow(tmp_path):
    plot = tmp_path / "scale.png"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "library_demo.py"), "--steps", "60", "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    output = done.stdout + done.stderr
    caught = re.search(
        r"matching mode caught (\d+) of (\d+) overflows; the wrong mode caught (\d+) "
        r"of (\d+)",
        output,
    )
    assert caught, output
    right_caught, right_total, wrong_caught, wrong_total = map(int, caught.groups())
    assert right_caught == right_total > 0
    assert wrong_caught == 0 and wrong_total >= right_total
    # Scales one way throughout: powers of two as 2^k, never 4.29497e+09.
    assert "2^32" in output and "e+" not in output
    # None of TensorFlow's C++ start-up lines (I/W/E-level, oneDNN, CPU feature notices).
    assert not re.search(r"^[IWE]\d{4} |oneDNN|cpu_feature_guard|absl::InitializeLog", output, re.M)
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert str(plot) in output
