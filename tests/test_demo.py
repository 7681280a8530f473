"""The TensorFlow and PyTorch parts of `make demo` show what the overflow modes are for, quietly."""

from __future__ import annotations

import re
import subprocess
import sys

from cli_runner import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


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


def test_torch_demo_shows_the_wrong_mode_missing_every_overflow():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo_torch.py"), "--steps", "60"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stderr == ""  # no warnings, no log lines: the tables only
    output = done.stdout
    # The summary table: true overflows and those the scaler caught (skipped), per run.
    rows = {
        title: (int(overflows), int(caught))
        for title, overflows, caught in re.findall(
            r"^(\S.*?)\s+(\d+)\s+(\d+)\s+\S+\s+\S+$", output, re.M
        )
        if title.startswith(("saturating chip", "IEEE device"))
    }
    right = rows["saturating chip, overflow_mode='saturation'"]
    wrong = rows["saturating chip, overflow_mode='inf_nan' (wrong)"]
    ieee = rows["IEEE device, overflow_mode='inf_nan'"]
    assert right[1] == right[0] > 0
    assert wrong[1] == 0 and wrong[0] >= right[0]
    assert ieee[1] == ieee[0] > 0
    caught = re.search(
        r"matching mode caught (\d+) of (\d+) overflows; the wrong mode caught (\d+) of (\d+)",
        output,
    )
    assert caught and tuple(map(int, caught.groups())) == (*right[::-1], *wrong[::-1]), output
    # Scales one way throughout, as in the TensorFlow part: 2^32, never 4.29497e+09.
    assert "2^32" in output and "e+" not in output


def test_library_demo_without_matplotlib_skips_the_plot_with_one_line(tmp_path):
    # matplotlib made unimportable the way Python documents (a None entry in sys.modules), so the
    # run is the one a machine without it gets.
    plot = tmp_path / "scale.png"
    blocked = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['library_demo.py', '--steps', '20', '--plot', {str(plot)!r}]; "
        f"runpy.run_path({str(EXAMPLES / 'library_demo.py')!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "No plot: matplotlib is not installed" in done.stdout
    assert "Traceback" not in done.stderr and not plot.exists()
    assert "matching mode caught" in done.stdout  # the demo itself ran to its end
