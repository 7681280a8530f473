"""Another library's LossScaleOptimizer (an embedding toolkit's, as SparseOperationKit's
`sok.tf.keras.mixed_precision.LossScaleOptimizer`) is left as it is, and the report says so once
per file: before, such a file passed with no word, because naming any LossScaleOptimizer also
silenced the mixed_float16-policy warning. The claim the warning makes (a class built on Keras's
own check applies a saturated step) is then checked on Keras itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli
from script_runs import run_json

FIXTURES = MIGRATOR_FIXTURES / "keras_foreign"
RULE = "keras-foreign-loss-scale"


def test_a_foreign_loss_scale_optimizer_is_left_and_warned_once_per_file(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    out = tmp_path / "out"
    proc = run_cli(
        FIXTURES, "--output-dir", out, "--copy-unchanged", "--report", report, "--no-color"
    )
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    found = {(Path(f["path"]).name, f["line"]): f for f in findings if f["rule"] == RULE}
    # once per file, where the toolkit's class is first used (from_import.py uses it twice)
    assert set(found) == {("embedding_kit_loop.py", 9), ("from_import.py", 7)}
    assert all(f["kind"] == "warning" for f in found.values())
    message = found["from_import.py", 7]["message"]
    assert "embedkit.keras.mixed_precision.LossScaleOptimizer" in message
    assert "saturation mode an overflowed step is applied" in message
    # the mixed_float16 policy of embedding_kit_loop.py is not warned as Keras's implicit
    # wrapping: the file wraps its optimizer itself, in the toolkit's class
    assert not any(f["rule"] == "keras-implicit-loss-scale" for f in findings)
    for name in ("embedding_kit_loop.py", "from_import.py", "ported_already.py"):
        assert (out / name).read_bytes() == (FIXTURES / name).read_bytes(), name
    # Keras's own class is ported, not warned; its isinstance check still holds after the port
    ported = (out / "keras_own.py").read_text(encoding="utf-8")
    assert "from npu_lossscale.keras import LossScaleOptimizer" in ported
    assert "opt = LossScaleOptimizer(tf.keras.optimizers.SGD(rate))" in ported
    # a second run over the output: the toolkit's files are still warned, this library's own
    # class (keras_own.py ported, ported_already.py) is nothing foreign
    again = tmp_path / "again.json"
    assert run_cli(out, "--report", again, "--no-color").returncode == 0
    findings = json.loads(again.read_text(encoding="utf-8"))["findings"]
    warned = {Path(f["path"]).name for f in findings if f["rule"] == RULE}
    assert warned == {"embedding_kit_loop.py", "from_import.py"}


# A toolkit class built on Keras's (as SparseOperationKit's was), stepped with a saturated float16
# gradient (65504: finite, so an inf/NaN check sees nothing), beside ours in saturation mode.
_SATURATED_STEP = """
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras, numpy as np
from npu_lossscale.keras import LossScaleOptimizer

class ToolkitScaler(keras.mixed_precision.LossScaleOptimizer):
    pass

def step(cls, **kw):
    v = keras.Variable(np.ones(2, "float32"))
    opt = cls(keras.optimizers.SGD(0.5), **kw)
    opt.build([v])
    grad = keras.ops.convert_to_tensor(np.full(2, 65504.0, "float32"))
    opt.apply_gradients([(grad, v)])
    return [float(x) for x in keras.ops.convert_to_numpy(v)]

print(json.dumps({"toolkit": step(ToolkitScaler),
                  "ours": step(LossScaleOptimizer, overflow_mode="saturation")}))
"""


def test_what_the_warning_claims_a_class_on_keras_own_check_applies_a_saturated_step() -> None:
    result = run_json(sys.executable, REPO_ROOT, "-c", _SATURATED_STEP)
    assert result["toolkit"] != [1.0, 1.0]  # applied: the saturated step moved the weights
    assert result["ours"] == [1.0, 1.0]  # skipped: saturation mode sees the 65504
