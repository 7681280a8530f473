"""Module aliases made by assignment (`keras = tf.keras`, `mp = keras.mixed_precision`,
`amp = torch.cuda.amp`): libcst qualifies names through imports only, and such a script passed
with nothing ported and nothing said. The aliases are followed where the name has that one
assignment; through the real CLI, the ported Keras script then trained by TensorFlow 2.21."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_runner import REPO_ROOT, run_cli

from migrator.selection.triage import verdict

KERAS = """import json

import numpy as np
import tensorflow as tf

keras = tf.keras


def build():
    mp = keras.mixed_precision
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    opt = mp.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=opt, loss="mse")
    return model


if __name__ == "__main__":
    model = build()
    model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1, verbose=0)
    print(json.dumps([type(model.optimizer).__module__, int(model.optimizer.iterations)]))
"""


def _port(tmp_path: Path, files: dict[str, str]) -> tuple[dict, list[dict]]:
    src = tmp_path / "src"
    src.mkdir()
    for name, text in files.items():
        (src / name).write_text(text, encoding="utf-8")
    report = tmp_path / "report.json"
    proc = run_cli("--write", "--report", report, "-j", "1", src)
    assert proc.returncode == 0, proc.stderr
    texts = {name: (src / name).read_text(encoding="utf-8") for name in files}
    return texts, json.loads(report.read_text(encoding="utf-8"))["findings"]


def test_a_keras_alias_and_an_alias_of_it_are_followed_and_the_port_trains(tmp_path) -> None:
    assert verdict(KERAS.encode()) == "full"  # the triage reads the alias too
    texts, findings = _port(tmp_path, {"train.py": KERAS})
    ported = texts["train.py"]
    assert "from npu_lossscale.keras import LossScaleOptimizer\n" in ported
    assert "    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01))\n" in ported
    assert "mp.LossScaleOptimizer" not in ported
    assert [f["rule"] for f in findings if f["kind"] == "warning"] == []
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("INF_NAN_MODE_ENABLE", None)
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path / "src",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    module, steps = json.loads(done.stdout.strip().splitlines()[-1])
    assert module.startswith("npu_lossscale.keras") and steps == 1


def test_a_name_assigned_twice_is_not_followed(tmp_path) -> None:
    twice = KERAS.replace("keras = tf.keras\n", "keras = tf.keras\nkeras = None\n")
    texts, findings = _port(tmp_path, {"train.py": twice})
    assert texts["train.py"] == twice
    assert findings == []


def test_a_torch_alias_is_named_for_a_hand_port(tmp_path) -> None:
    # The torch port places its import beside the import binding the root name; an assignment
    # binds it here, so the scaler is reported, not rewritten.
    source = "import torch\n\namp = torch.cuda.amp\nscaler = amp.GradScaler(init_scale=2.0**16)\n"
    texts, findings = _port(tmp_path, {"loop.py": source})
    assert texts["loop.py"] == source
    (found,) = findings
    assert (found["line"], found["rule"]) == (4, "torch-grad-scaler")
    assert "reached through a module alias (`amp = ...`)" in found["message"]


def test_a_contrib_alias_is_still_a_module_object_to_port_by_hand(tmp_path) -> None:
    # TF 2 has no tf.contrib: `mp = tf.contrib.mixed_precision` would stay and fail there.
    source = (
        "import tensorflow as tf\n\nmp = tf.contrib.mixed_precision\n"
        "opt = mp.LossScaleOptimizer(tf.train.AdamOptimizer(), mp.FixedLossScaleManager(8))\n"
    )
    texts, findings = _port(tmp_path, {"train.py": source})
    assert texts["train.py"] == source
    assert [(f["line"], f["rule"]) for f in findings] == [(3, "unresolved-access")]
