"""The long-file view (migrator.pipeline.slicing) must port exactly as the whole file does.

Every fixture is ported twice in-process, once whole and once through its view with the length
threshold lowered to nothing, and the bytes and findings must agree; then a generated 20,000-line
module, the shape that made libcst's scope analysis quadratic, goes through the real CLI.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.pipeline import slicing, transform

FIXTURES = sorted(p for p in (MIGRATOR_FIXTURES).rglob("*.py") if "expected" not in p.parts)


def _port(source: bytes, path: str) -> tuple[bytes, list[dict]]:
    try:
        result = transform.migrate_source(source, path=path)
    except transform.SourceError as error:
        return b"", [{"error": str(error)}]
    return result.new_source, [dataclasses.asdict(f) for f in result.findings]


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_view_ports_every_fixture_as_the_whole_file(
    fixture: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = fixture.read_bytes()
    whole = _port(source, fixture.name)
    monkeypatch.setattr(slicing, "MIN_LINES", 0)
    assert _port(source, fixture.name) == whole


def test_the_view_leaves_out_what_cannot_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slicing, "MIN_LINES", 0)
    source = _generated(50)
    view = slicing.view_of(source)
    assert view is not None
    text = view.source.decode()
    assert "ExponentialUpdateLossScaleManager" in text and "import tensorflow" in text
    assert "x = tf.constant(7)" not in text  # left out, as one placeholder run
    assert text.count("left-out run") == 1
    # `used` is read by the kept function, so its binding is kept with it.
    assert "used = 3" in text


def test_an_entry_block_is_seen_by_the_view_as_by_the_whole_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NVIDIA's DLRM deploy_dense.py: a policy set in a function, an entry block calling a name the
    # module never binds; the whole file is an evaluation program, which gets no policy warning.
    source = (
        b"import tensorflow as tf\n"
        b"\n"
        b"def deploy(precision):\n"
        b"    if precision == 'fp16':\n"
        b"        tf.keras.mixed_precision.set_global_policy('mixed_float16')\n"
        b"\n"
        b"if __name__ == '__main__':\n"
        b"    main()\n"
    )
    whole = _port(source, "deploy.py")
    assert whole == (source, [])
    monkeypatch.setattr(slicing, "MIN_LINES", 0)
    assert _port(source, "deploy.py") == whole


def _generated(lines: int) -> bytes:
    head = [
        "import tensorflow as tf",
        "",
        "used = 3",
        "",
        "def build(opt):",
        "    scale = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**32, used)",
        "    return tf.contrib.mixed_precision.LossScaleOptimizer(opt, scale)",
        "",
    ]
    body = [f"x = tf.constant({i}) + x if {i} else tf.constant(0)" for i in range(lines)]
    return ("\n".join(head + body) + "\n").encode()


def test_a_20000_line_file_ports_with_a_diff_of_the_lines_that_changed(tmp_path: Path) -> None:
    script = tmp_path / "generated.py"
    script.write_bytes(_generated(20_000))
    done = subprocess.run(
        [sys.executable, "-m", "migrator", str(script), "--no-color"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    changed = [
        line
        for line in done.stdout.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "+from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer",
        "-    scale = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**32, used)",
        "-    return tf.contrib.mixed_precision.LossScaleOptimizer(opt, scale)",
        "+    scale = ExponentialUpdateLossScaleManager(2**32, used)",
        "+    return NPULossScaleOptimizer(opt, scale)",
    ]


def test_a_line_named_in_a_message_is_the_files_line_not_the_views() -> None:
    """A long file on torch-npu's scaler: the warning on the torch call names the line of the
    torch-npu scaler, which the view numbers differently (2,000 helpers sit above it)."""
    helpers = "".join(f"def helper_{i}():\n    return {i}\n\n\n" for i in range(600))
    source = (
        "import torch\n\n\n"
        + helpers
        + "npu_scaler = torch.npu.amp.GradScaler()\n"
        + "cuda_scaler = torch.cuda.amp.GradScaler()\n"
    ).encode()
    assert slicing.view_of(source) is not None  # long enough to be ported through its view
    lines = source.decode().splitlines()
    npu_line = lines.index("npu_scaler = torch.npu.amp.GradScaler()") + 1
    result = transform.migrate_source(source, path="long.py")
    (left,) = [f for f in result.findings if f.rule == "torch-grad-scaler"]
    assert left.line == npu_line + 1
    assert f"(line {npu_line})" in left.message
