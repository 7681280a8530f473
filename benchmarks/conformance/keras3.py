"""Keras 3's own LossScaleOptimizer tests, run against npu_lossscale's Keras 3 class and stock's.

    python benchmarks/conformance/keras3.py SNAPSHOT_DIR --materialize  # write the test file
    python benchmarks/conformance/keras3.py SNAPSHOT_DIR                # keras3: ours P/N, ...

The file is keras-team/keras v3.15.1's ``keras/src/optimizers/loss_scale_optimizer_test.py``
(the Keras of the main environment); it imports the class as a module global
``LossScaleOptimizer``, which is bound to ours.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import _keras_suite

PIN = (
    "keras-team/keras",
    "250b42181ce9f37df68319d8f4753ec89a349a43",  # v3.15.1
    "keras/src/optimizers/loss_scale_optimizer_test.py",
)


def _bind(module: types.ModuleType) -> None:
    from npu_lossscale.keras.optimizer import LossScaleOptimizer

    module.LossScaleOptimizer = LossScaleOptimizer


def _path(snapshot: Path) -> Path:
    repository, _, path = PIN
    return snapshot / repository.replace("/", "+") / path


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--materialize" in argv:
        mirrors = Path(argv[argv.index("--mirrors") + 1]) if "--mirrors" in argv else None
        _keras_suite.materialize(Path(argv[0]), mirrors or Path("/work/.mirror"), *PIN)
        raise SystemExit(0)
    side = _keras_suite.side_requested(argv)
    if side:
        _keras_suite.worker(side, _bind, _path(Path(argv[0])), False)
    else:
        _keras_suite.main("keras3", _path, argv)
