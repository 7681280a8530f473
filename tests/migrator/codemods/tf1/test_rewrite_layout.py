"""A ported graph rewrite keeps the layout of the call it replaces: the manager the port adds goes
after the optimizer on its line, and the closing bracket stays where it was (before, the bracket's
line break went after the new comma, leaving `opt, ` with a trailing space and the manager out
at the bracket's indentation)."""

from __future__ import annotations

import pytest

from migrator.pipeline.transform import migrate_source

MANAGER = (
    "ExponentialUpdateLossScaleManager(init_loss_scale=2 ** 15, incr_every_n_steps=2000, "
    "decr_every_n_nan_or_inf=1, incr_ratio=2, decr_ratio=0.5)"
)
REWRITE = "tf.train.experimental.enable_mixed_precision_graph_rewrite"


@pytest.mark.parametrize(
    ("call", "ported"),
    [
        (
            f"{REWRITE}(\n        opt\n    )",
            f"NPULossScaleOptimizer(\n        opt, {MANAGER}\n    )",
        ),
        (
            f"{REWRITE}(\n        opt,\n    )",
            f"NPULossScaleOptimizer(\n        opt, {MANAGER},\n    )",
        ),
        (f"{REWRITE}(opt)", f"NPULossScaleOptimizer(opt, {MANAGER})"),
    ],
)
def test_the_added_manager_keeps_the_calls_layout(call: str, ported: str) -> None:
    body = "    opt = tf.train.AdamOptimizer(lr)\n    return {}\n"
    source = "import tensorflow.compat.v1 as tf\n\n\ndef build(lr):\n" + body.format(call)
    result = migrate_source(source.encode(), path="train.py").new_source.decode()
    assert body.format(ported) in result
    assert not any(line.endswith(" ") for line in result.splitlines())
    compile(result, "train.py", "exec")
