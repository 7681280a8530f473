"""Keras 2's own LossScaleOptimizer tests, run against npu_lossscale's Keras 2 class and stock's.

    python benchmarks/conformance/tf_keras.py SNAPSHOT_DIR --materialize  # write the test files
    python benchmarks/conformance/tf_keras.py SNAPSHOT_DIR                # tf_keras: ours P/N, ...

Run it with the Python of the stack under test: on TF 2.16+ with tf_keras installed it runs
tf_keras's ``tf_keras/mixed_precision/loss_scale_optimizer_test.py`` (keras-team/tf-keras
v2.21.0); on TF 2.6.5 it runs Keras 2.6's ``keras/mixed_precision/loss_scale_optimizer_test.py``
(keras-team/keras v2.6.0). The file reaches the class through its module
``loss_scale_optimizer``; that name is bound to a copy of the stock module whose loss-scale
classes are ours (tf_keras: ``BaseLossScaleOptimizer`` -> ours, ``LossScaleOptimizer`` -> ours
over classic optimizers, ``LossScaleOptimizerV3`` -> ours over the newer ones).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import _keras_suite

PINS = {  # (repository, commit, path) per Keras 2 line
    "tf_keras": (
        "keras-team/tf-keras",
        "631ed411d9e55e40b1ecaae7b046bba14752f46e",  # v2.21.0
        "tf_keras/mixed_precision/loss_scale_optimizer_test.py",
    ),
    "keras2.6": (
        "keras-team/keras",
        "3a33d53ea4aca312c5ad650b4883d9bac608a32e",  # v2.6.0
        "keras/mixed_precision/loss_scale_optimizer_test.py",
    ),
}


def _line() -> str:
    import tensorflow as tf

    major, minor = (int(n) for n in tf.__version__.split(".")[:2])
    return "keras2.6" if (major, minor) < (2, 16) else "tf_keras"


def _bind(module: types.ModuleType) -> None:
    from npu_lossscale.keras import keras2

    stock = module.loss_scale_optimizer
    view = types.ModuleType(stock.__name__)
    view.__dict__.update(stock.__dict__)
    if hasattr(keras2, "LossScaleOptimizerV3"):
        view.BaseLossScaleOptimizer = keras2.LossScaleOptimizer
        view.LossScaleOptimizer = keras2.LossScaleOptimizerV2
        view.LossScaleOptimizerV3 = keras2.LossScaleOptimizerV3
    else:
        view.LossScaleOptimizer = keras2.LossScaleOptimizer
    module.loss_scale_optimizer = view


def _path(snapshot: Path, line: str) -> Path:
    repository, _, path = PINS[line]
    return snapshot / repository.replace("/", "+") / path


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--materialize" in argv:
        snapshot = Path(argv[0])
        mirrors = Path(argv[argv.index("--mirrors") + 1]) if "--mirrors" in argv else None
        for repository, commit, path in PINS.values():
            _keras_suite.materialize(
                snapshot, mirrors or Path("/work/.mirror"), repository, commit, path
            )
        raise SystemExit(0)
    line = _line()
    side = _keras_suite.side_requested(argv)
    if side:
        _keras_suite.worker(side, _bind, _path(Path(argv[0]), line), line == "tf_keras")
    else:
        _keras_suite.main(
            "tf_keras" if line == "tf_keras" else "tf_keras (Keras 2.6)",
            lambda s: _path(s, line),
            argv,
        )
