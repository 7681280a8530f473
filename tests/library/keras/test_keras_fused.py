"""The Keras optimizer's fused check-and-unscale agrees with its pure-TF path, bit for bit.

Where the TF1 front-end's fused CPU op is built, ``unscale_and_check`` runs it per dense float32
gradient before the skip-or-apply branch; elsewhere (``NPU_LOSSSCALE_FUSED=0``, XLA, sparse or
half-precision gradients) the pure path does the same job. Decisions are checked against the
rule written out by hand with numpy, values against ``g * float32(1 / scale)`` bitwise, at scales
that are not powers of two and with the boundary values planted; then whole model.fit runs with
an overflow in the middle must leave identical weights, slots, scale and skip counts either way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from npu_lossscale import _build_cache
from npu_lossscale.keras import LossScaleOptimizer
from npu_lossscale.keras.overflow import unscale_and_check
from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf import kernels

MODES = [OverflowMode.INF_NAN, OverflowMode.SATURATION]
F32 = np.float32
TOP = F32(65504.0)


@pytest.fixture(scope="module", autouse=True)
def fused_built() -> None:
    if kernels.fused_ops() is None:
        pytest.skip(f"fused op unavailable here: {kernels.unavailable_reason()}")


@pytest.fixture(params=["fused", "pure"])
def path(request, monkeypatch) -> str:
    if request.param == "pure":
        monkeypatch.setenv(_build_cache.DISABLE_ENV, "0")
    return request.param


def _cases() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(3)

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 100).astype(F32)

    def planted(value: float, at: int) -> list[np.ndarray]:
        big = noise(70_000)  # above the op's parallel threshold
        big[at] = value
        return [noise(3, 4), big, noise(5)]

    return {
        "clean": [noise(3, 4), noise(70_000), noise(5)],
        "inf": planted(np.inf, 69_999),
        "-inf": planted(-np.inf, 0),
        "nan": planted(np.nan, 1234),
        "at-threshold": planted(TOP, 12),
        "-at-threshold": planted(-TOP, 50_000),
        "just-below": planted(-np.nextafter(TOP, F32(0)), 7),
    }


def _by_hand(arrays: list[np.ndarray], mode: OverflowMode) -> bool:
    finite = all(np.all(np.isfinite(a)) for a in arrays)
    if mode is OverflowMode.SATURATION:
        finite = finite and all(np.all(np.abs(a) < TOP) for a in arrays)
    return bool(finite)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, F32).view(np.uint32)


def _graph_ops(fn: tf.types.experimental.PolymorphicFunction, *args: object) -> set[str]:
    graph = fn.get_concrete_function(*args).graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [3.0, 0.8 * 2.0**15, 2.0**15])
def test_decision_and_values_match_the_rule_on_either_path(path, mode, scale) -> None:
    check = tf.function(
        lambda grads: unscale_and_check(grads, [True] * len(grads), tf.constant(scale), mode)
    )
    reciprocal = F32(1.0) / F32(scale)
    for name, arrays in _cases().items():
        grads = [tf.constant(a) for a in arrays]
        unscaled, finite = check(grads)
        assert bool(finite) == _by_hand(arrays, mode), (path, name)
        for got, given in zip(unscaled, arrays):
            np.testing.assert_array_equal(_bits(got.numpy()), _bits(given * reciprocal))
    built = _graph_ops(check, [tf.constant(a) for a in _cases()["clean"]])
    assert ("NpuUnscaleAndCheck" in built) == (path == "fused")


def test_sparse_half_kept_and_none_gradients_take_the_pure_path_beside_the_op() -> None:
    scale = tf.constant(4.0)
    grads = [
        tf.constant([8.0, 65504.0]),
        tf.IndexedSlices(tf.constant([[12.0]]), tf.constant([1]), tf.constant([3, 1])),
        tf.constant([2.0], tf.float16),
        None,
        tf.constant([6.0]),  # a gradient the variable is overwritten with: not divided
    ]
    for mode, finite in ((OverflowMode.INF_NAN, True), (OverflowMode.SATURATION, False)):
        unscaled, got = unscale_and_check(grads, [True, True, True, True, False], scale, mode)
        assert bool(got) is finite
        assert unscaled[0].numpy().tolist() == [2.0, 16376.0]
        assert isinstance(unscaled[1], tf.IndexedSlices)
        assert unscaled[1].values.numpy().tolist() == [[3.0]]
        assert unscaled[2].dtype == tf.float16 and unscaled[2].numpy().tolist() == [0.5]
        assert unscaled[3] is None
        assert unscaled[4].numpy().tolist() == [6.0]
    # An overflow only a pure-path gradient shows still decides the step.
    sparse_inf = tf.IndexedSlices(tf.constant([[np.inf]]), tf.constant([0]), tf.constant([3, 1]))
    _, got = unscale_and_check([grads[0], sparse_inf], [True, True], scale, OverflowMode.INF_NAN)
    assert not bool(got)


def test_xla_compiled_steps_use_the_pure_path() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.01), 2.0**10, 1000)
    model.compile(optimizer=opt, loss="mse")
    x = tf.constant(np.ones((8, 4), F32))
    y = tf.constant(np.zeros((8, 1), F32))
    plain = tf.function(lambda a, b: model.train_step((a, b)))
    xla = tf.function(lambda a, b: model.train_step((a, b)), jit_compile=True)
    assert "NpuUnscaleAndCheck" in _graph_ops(plain, x, y)
    assert "NpuUnscaleAndCheck" not in _graph_ops(xla, x, y)
    xla(x, y)  # the XLA step compiles and runs
    assert int(opt.iterations) == 1


def _train(mode: str, **kwargs: object) -> tuple[list[np.ndarray], float, int]:
    """Seven fits of eight samples each, the fourth poisoned with an inf input."""
    rng = np.random.default_rng(7)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)]
    )
    opt = LossScaleOptimizer(keras.optimizers.Adam(1e-2), overflow_mode=mode, **kwargs)
    model.compile(optimizer=opt, loss="mse")
    for step in range(7):
        x = rng.standard_normal((8, 5)).astype(F32)
        if step == 3:
            x[2, 1] = np.inf
        model.fit(x, rng.standard_normal((8, 2)).astype(F32), batch_size=8, verbose=0)
    state = [v.numpy() for v in model.weights] + [v.numpy() for v in opt.variables]
    return state, float(opt.loss_scale), int(opt.skipped_steps)


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_scale": 3000.0, "dynamic": False},  # not a power of two: reciprocal vs divide
        {"initial_scale": 1000.0, "dynamic_growth_steps": 2, "decr_ratio": 0.8},
    ],
    ids=["fixed-3000", "dynamic-0.8"],
)
def test_model_fit_leaves_identical_state_either_way(monkeypatch, mode, kwargs) -> None:
    fused = _train(mode, **kwargs)
    monkeypatch.setenv(_build_cache.DISABLE_ENV, "0")
    pure = _train(mode, **kwargs)
    assert fused[2] == pure[2] == 1  # the poisoned step, skipped on both
    assert fused[1] == pure[1]
    assert len(fused[0]) == len(pure[0])
    for got, want in zip(fused[0], pure[0]):
        np.testing.assert_array_equal(got, want)


def test_empty_apply_is_a_no_op_and_a_short_variable_list_is_keras_error() -> None:
    a, b = keras.Variable(np.ones(2, "float32")), keras.Variable(np.ones(2, "float32"))
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), 4.0, 1000)
    opt.build([a, b])
    opt.apply([], [])
    assert int(opt.iterations) == 0 and a.numpy().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="gradients must match"):
        opt.apply([tf.ones(2)])  # one gradient for the optimizer's two variables


def test_float64_gradients_are_divided_at_their_own_precision() -> None:
    # 1000 is not a power of two: a float32 reciprocal would leave 1.0000000474974513.
    weight = keras.Variable(np.zeros(1, "float64"), dtype="float64")
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), 1000.0, dynamic=False)
    opt.build([weight])
    opt.apply([tf.constant([-1000.0], tf.float64)], [weight])
    assert weight.numpy().tolist() == [1.0]


KERAS_NO_COMPILER = """
import logging, numpy as np, keras
from npu_lossscale.keras import LossScaleOptimizer
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer=LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), verbose=0)
print("FITTED")
"""


def test_without_a_compiler_keras_says_so_at_info_level(tmp_path) -> None:
    # Keras's own check is the fallback here: nothing to warn a Keras user about.
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), TF_CPP_MIN_LOG_LEVEL="3")
    env["NPU_LOSSSCALE_CACHE"] = str(tmp_path / "cache")
    env.pop(_build_cache.DISABLE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", KERAS_NO_COMPILER],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "FITTED" in done.stdout, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "fused CPU ops" in line]
    assert len(lines) == 1 and lines[0].startswith("INFO"), done.stderr[-3000:]
    assert "no-such-compiler" in lines[0]
