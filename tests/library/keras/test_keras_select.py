"""Which Keras class npu_lossscale.keras.LossScaleOptimizer is, per stack (runs on all three)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.stacks
tf = pytest.importorskip("tensorflow")

from npu_lossscale.keras import select  # noqa: E402

TF_VERSION = tuple(int(n) for n in tf.__version__.split(".")[:2])


@pytest.mark.skipif(TF_VERSION >= (2, 0), reason="the TF 1.x refusal needs TensorFlow 1.x")
def test_tf1_gets_one_error_naming_the_tf1_front_end() -> None:
    import npu_lossscale.keras

    with pytest.raises(select.KerasVersionError) as raised:
        npu_lossscale.keras.LossScaleOptimizer  # noqa: B018
    message = str(raised.value)
    assert "TensorFlow 1.15" in message and "NPULossScaleOptimizer" in message
    assert "tensorflow-cpu==2.6.5" in message


@pytest.mark.skipif(TF_VERSION < (2, 0), reason="TensorFlow 1.x has no Keras front-end")
def test_generation_follows_tf_version_and_legacy_switch(monkeypatch) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    assert select.keras_generation() == (2 if TF_VERSION < (2, 16) else 3)
    for value in ("1", "true", "True"):
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
        assert select.keras_generation() == 2
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    assert select.keras_generation() == (2 if TF_VERSION < (2, 16) else 3)
