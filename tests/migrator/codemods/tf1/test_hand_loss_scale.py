"""TF code that scales its loss by hand (tensorflow/benchmarks' tf_cnn_benchmarks shape) is left as
it is with one warning at its inf/NaN-only overflow check; a file that only checks a loss's
finiteness for logging gets none. Both run through the real CLI and stay byte-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, port_fixture_tree

FIXTURE = MIGRATOR_FIXTURES / "hand_loss_scale"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("hand_loss_scale"), FIXTURE)


def _findings(ported: dict, name: str) -> list[dict]:
    return [f for f in ported["findings"] if Path(f["path"]).name == name]


def test_hand_scaling_is_warned_once_at_the_overflow_check(ported) -> None:
    source = (FIXTURE / "hand_scaled.py").read_text(encoding="utf-8").splitlines()
    check = next(n for n, text in enumerate(source, 1) if "tf.is_finite(g)" in text)
    (found,) = _findings(ported, "hand_scaled.py")
    assert (found["rule"], found["kind"], found["line"]) == ("tf-hand-loss-scale", "warning", check)
    message = found["message"]
    assert "scales its loss by hand (`loss * loss_scale`" in message
    assert "finds inf/NaN only" in message and "65504" in message
    assert "NPULossScaleOptimizer" in message and "INF/NAN mode" in message


def test_scaling_through_a_pair_of_helpers_is_warned_at_the_check(ported) -> None:
    """StyleGAN's tflib (and its forks): `apply_loss_scaling(loss)`, `undo_loss_scaling(...)`."""
    source = (FIXTURE / "scaling_helpers.py").read_text(encoding="utf-8").splitlines()
    check = next(n for n, text in enumerate(source, 1) if "tf.is_finite(g)" in text)
    (found,) = _findings(ported, "scaling_helpers.py")
    assert (found["rule"], found["line"]) == ("tf-hand-loss-scale", check)
    assert "(`self.apply_loss_scaling(tf.cast(loss, tf.float32))`" in found["message"]
    assert "finds inf/NaN only" in found["message"]


def test_two_scalers_in_one_file_are_warned_each_in_its_own_words(ported) -> None:
    """The static one checks nothing (no overflow mode helps), the dynamic one checks inf/NaN."""
    source = (FIXTURE / "two_scalers.py").read_text(encoding="utf-8").splitlines()
    static = next(n for n, text in enumerate(source, 1) if "loss * self._scale" in text)
    check = next(n for n, text in enumerate(source, 1) if "tf.is_finite(grad_norm)" in text)
    found = {f["line"]: f["message"] for f in _findings(ported, "two_scalers.py")}
    assert sorted(found) == [static, check]
    assert "checks no gradient for overflow itself" in found[static]
    assert "INF/NAN mode" not in found[static]
    assert "`tf.is_finite(grad_norm)`" in found[check] and "INF/NAN mode" in found[check]


def test_without_a_check_in_the_file_it_is_warned_at_the_loss_multiplication(ported) -> None:
    source = (FIXTURE / "scaled_elsewhere.py").read_text(encoding="utf-8").splitlines()
    product = next(n for n, text in enumerate(source, 1) if "total_loss * self.loss_scale" in text)
    (found,) = _findings(ported, "scaled_elsewhere.py")
    assert (found["rule"], found["line"]) == ("tf-hand-loss-scale", product)
    wording = "an overflow check on the gradients' values (tf.is_finite) finds inf/NaN only"
    assert wording in found["message"]


def test_without_a_check_in_the_file_no_mode_is_offered_as_a_remedy(ported) -> None:
    # No check here (none anywhere, in TF's official ResNet run loop): an overflowed step is
    # applied in INF/NAN mode as well, so only the port is a remedy.
    source = (FIXTURE / "fixed_scale_unchecked.py").read_text(encoding="utf-8").splitlines()
    product = next(n for n, text in enumerate(source, 1) if "loss * loss_scale" in text)
    (found,) = _findings(ported, "fixed_scale_unchecked.py")
    assert (found["rule"], found["line"]) == ("tf-hand-loss-scale", product)
    message = found["message"]
    assert "checks no gradient for overflow itself" in message
    assert "applied in either overflow mode" in message
    assert "NPULossScaleOptimizer" in message and "INF/NAN mode" not in message


@pytest.mark.parametrize("name", ["finite_loss_logging.py", "split_scopes.py"])
def test_no_hand_scaled_step_no_warning(ported, name: str) -> None:
    assert _findings(ported, name) == []


@pytest.mark.parametrize("name", [p.name for p in sorted(FIXTURE.glob("*.py"))])
def test_both_files_are_left_byte_identical(ported, name: str) -> None:
    assert (ported["out"] / name).read_bytes() == (FIXTURE / name).read_bytes()
    assert ported["again"].returncode == 0


_SPELLED = """import tensorflow as tf


def train_op(loss, loss_scale, optimizer, variables):
    scaled = {loss} * loss_scale
    grads = tf.gradients(scaled, variables)
    for i in range(len(grads)):
        {unscale}
    finite = tf.reduce_all([tf.reduce_all(tf.is_finite(g)) for g in grads])
    return tf.cond(finite, lambda: optimizer.apply_gradients(zip(grads, variables)), tf.no_op)
"""


@pytest.mark.parametrize(
    ("loss", "unscale"),
    [
        ("tf.cast(loss, tf.float32)", "grads[i] = grads[i] / loss_scale"),  # cast to fp32 first
        ("tf.to_float(loss)", "grads[i] = grads[i] / loss_scale"),
        ("loss", "grads[i] /= loss_scale"),  # divided in place by the operator
        ("loss", "grads[i] *= 1.0 / loss_scale"),
    ],
)
def test_each_spelling_of_the_scaling_is_warned_at_the_check(loss: str, unscale: str) -> None:
    from migrator.selection import hand_loss_scale

    source = _SPELLED.format(loss=loss, unscale=unscale).encode()
    assert hand_loss_scale.sites(source) == [(9, f"{loss} * loss_scale", "tf.is_finite(g)")]


def test_a_loss_scaled_in_place_is_warned_at_the_check() -> None:
    from migrator.selection import hand_loss_scale

    source = _SPELLED.replace("scaled = {loss} * loss_scale", "loss *= loss_scale")
    source = source.replace("tf.gradients(scaled,", "tf.gradients(loss,")
    source = source.format(unscale="grads[i] = grads[i] / loss_scale").encode()
    assert hand_loss_scale.sites(source) == [(9, "loss *= loss_scale", "tf.is_finite(g)")]


@pytest.mark.parametrize(
    "product",
    [
        "tf.multiply(loss, loss_scale)",
        # MLPerf v0.5's TF GNMT (nmt_gpu/estimator.py), over lines and with a name
        'tf.multiply(\n        loss, tf.convert_to_tensor(loss_scale), name="scaling_loss")',
        "tf.math.multiply(loss_scale, loss)",
    ],
)
def test_a_loss_scaled_by_a_multiply_call_is_warned_at_the_check(product: str) -> None:
    from migrator.selection import hand_loss_scale

    source = _SPELLED.replace("{loss} * loss_scale", product)
    source = source.format(unscale="grads[i] = grads[i] / loss_scale").encode()
    (found,) = hand_loss_scale.sites(source)
    assert found[1].startswith(product.split("(")[0] + "(") and found[2] == "tf.is_finite(g)"


def test_tf_scalar_mul_both_ways_is_warned_at_the_check() -> None:
    """NVIDIA's TF ConvNets' FixedLossScalerOptimizer: `tf.scalar_mul(scale, loss)`, then
    `tf.scalar_mul(1. / scale, g)` for each gradient."""
    from migrator.selection import hand_loss_scale

    source = _SPELLED.replace("{loss} * loss_scale", "tf.scalar_mul(loss_scale, loss)")
    source = source.format(unscale="grads[i] = tf.scalar_mul(1. / loss_scale, grads[i])")
    assert hand_loss_scale.sites(source.encode()) == [
        (9, "tf.scalar_mul(loss_scale, loss)", "tf.is_finite(g)")
    ]


_MAPPED = "    grads = tf.nest.map_structure(lambda x: x / loss_scale, {values})\n"
_LOOP = "    for i in range(len(grads)):\n        {unscale}\n"


def test_gradients_scaled_back_by_a_mapped_function_are_warned_at_the_check() -> None:
    """danijar's director: `tf.nest.map_structure(lambda x: x / scale, grads)`; the same lambda
    over values that are not gradients scales nothing back."""
    from migrator.selection import hand_loss_scale

    mapped = _SPELLED.replace(_LOOP, _MAPPED).replace("{loss}", "loss")
    assert hand_loss_scale.sites(mapped.format(values="grads").encode()) == [
        (8, "loss * loss_scale", "tf.is_finite(g)")
    ]
    assert hand_loss_scale.sites(mapped.format(values="metrics").encode()) == []


def test_helpers_in_a_file_that_never_spells_scale_are_warned() -> None:
    """StyleGAN v1's tflib keeps its scale in `ls_var`: `apply_loss_scaling` and
    `undo_loss_scaling` are the only spellings, and the byte test had wanted "scale"."""
    from migrator.selection import hand_loss_scale

    source = (FIXTURE / "scaling_helpers.py").read_text(encoding="utf-8")
    source = source[source.index('"""', 3) + 3 :]  # its docstring says "scale"
    for old, new in (("log2_scale", "ls_var"), ("scale = ", "coef = "), ("g * scale", "g * coef")):
        source = source.replace(old, new)
    assert b"scale" not in source.encode().replace(b"scaling", b"")
    check = next(n for n, text in enumerate(source.splitlines(), 1) if "tf.is_finite(g)" in text)
    sites = hand_loss_scale.sites(source.encode())
    assert [(line, check_text) for line, _, check_text in sites] == [(check, "tf.is_finite(g)")]
