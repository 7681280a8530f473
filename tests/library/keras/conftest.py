"""The Keras 3 test files run only where the process runs Keras 3 (TF 2.16+ without
TF_USE_LEGACY_KERAS); test_keras2.py and test_keras_select.py run on every stack and skip
with their reason where they do not apply."""

from __future__ import annotations

KERAS3_ONLY = [
    "test_keras.py",
    "test_keras_distributed.py",
    "test_keras_edges.py",
    "test_keras_fused.py",
    "test_keras_managers.py",
    "test_keras_restore.py",
]


def _runs_keras3() -> bool:
    try:
        from npu_lossscale.keras.select import keras_generation

        return keras_generation() == 3
    except Exception:  # no TensorFlow, or TF 1.x: no Keras 3 either
        return False


collect_ignore = [] if _runs_keras3() else KERAS3_ONLY
