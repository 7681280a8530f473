"""The overflow rule itself: exact per mode, whichever of the fast or exact path decides."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from chip import saturate

from npu_lossscale.modes import OverflowMode
from npu_lossscale.tf import overflow

INF_NAN = OverflowMode.INF_NAN
SAT = OverflowMode.SATURATION


def status(values, mode, scale=1.0) -> float:
    grads = [None if v is None else tf.constant(np.asarray(v, np.float32)) for v in values]
    return float(overflow.overflow_status(grads, mode, tf.constant(scale, tf.float32)))


@pytest.mark.parametrize("mode", [INF_NAN, SAT])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_inf_and_nan_overflow_in_both_modes(mode, bad):
    assert status([np.ones(5), [0.5, bad, 1.0]], mode) == 1.0


@pytest.mark.parametrize("mode", [INF_NAN, SAT])
def test_small_clean_values_do_not_overflow(mode):
    assert status([np.full((3, 4), 1e-3), [0.25], None], mode, scale=1024.0) == 0.0


def test_only_none_gradients_never_overflow():
    assert status([None, None], SAT) == 0.0


def test_chip_saturated_values_are_finite_yet_overflow_only_in_saturation_mode():
    scale = 1024.0
    true_grads = np.array([1.0, 200.0, -5000.0], np.float32)  # 200 * 1024 > 65504
    unscaled = saturate(true_grads * scale) / scale
    assert np.all(np.isfinite(unscaled))
    assert status([unscaled], INF_NAN, scale) == 0.0
    assert status([unscaled], SAT, scale) == 1.0


def test_saturation_threshold_is_exact_at_the_boundary():
    scale = 1024.0
    at = np.float32(65504.0 / 1024.0)  # exactly representable: |g| * scale == 65504
    below = np.nextafter(at, np.float32(0))
    assert status([[at]], SAT, scale) == 1.0
    assert status([[-at]], SAT, scale) == 1.0
    assert status([[below]], SAT, scale) == 0.0
    assert status([[-below]], SAT, scale) == 0.0


def test_many_elements_below_threshold_are_clean_even_when_sum_of_squares_is_large():
    # Each |g| * scale = 65000 < 65504, but the sum of squares far exceeds 65504**2, so the fast
    # test cannot decide and the exact path must answer "clean".
    values = np.full(1000, 65000.0 / 4.0, np.float32)
    assert status([values], SAT, 4.0) == 0.0


def test_huge_finite_values_are_clean_in_inf_nan_mode():
    # The sum of squares overflows float32 to inf; the exact path must see every element finite.
    assert status([np.full(8, 3e38, np.float32)], INF_NAN) == 0.0


def test_saturation_with_huge_scale_uses_exact_path_correctly():
    scale = 2.0**100  # 65504 / scale is below the fast test's safe range
    assert status([[1e-30]], SAT, scale) == 0.0  # 1e-30 * 2**100 ~ 1.3 < 65504
    assert status([[1e-20]], SAT, scale) == 1.0  # 1e-20 * 2**100 ~ 1.3e10


@pytest.mark.parametrize("mode", [INF_NAN, SAT])
def test_indexed_slices_values_are_checked(mode):
    values = tf.constant([[1.0, 2.0], [np.inf, 0.0]])
    grad = tf.IndexedSlices(values, tf.constant([0, 3]), tf.constant([5, 2]))
    assert float(overflow.overflow_status([grad], mode, 1.0)) == 1.0
    clean = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 3]), tf.constant([5, 2]))
    assert float(overflow.overflow_status([clean], mode, 1.0)) == 0.0


def test_auto_mode_is_rejected():
    with pytest.raises(ValueError, match="resolved"):
        overflow.overflow_status([tf.ones([2])], OverflowMode.AUTO, 1.0)


def test_status_is_one_scalar_and_exact_in_a_graph_on_both_paths():
    g = tf.Graph()
    with g.as_default():
        feed = tf.compat.v1.placeholder(tf.float32, [None])
        scale = tf.compat.v1.placeholder(tf.float32, [])
        sat = overflow.overflow_status([feed, tf.ones([3])], SAT, scale)
        inf_nan = overflow.overflow_status([feed], INF_NAN, scale)
        assert sat.shape == [] and sat.dtype == tf.float32
        with tf.compat.v1.Session(graph=g) as sess:

            def run(values, s):
                return sess.run([sat, inf_nan], {feed: np.asarray(values, np.float32), scale: s})

            assert run([1.0, -2.0], 8.0) == [0.0, 0.0]  # fast path
            assert run([8188.0], 8.0) == [1.0, 0.0]  # 8188 * 8 = 65504
            assert run([8187.0] * 50, 8.0) == [0.0, 0.0]  # exact path, clean
            assert run([np.nan], 8.0) == [1.0, 1.0]
            assert run([3e38, 3e38], 1.0) == [1.0, 0.0]  # finite, but saturated when scaled


def test_unscale_divides_and_keeps_structure():
    dense = tf.constant([2.0, -4.0])
    sparse = tf.IndexedSlices(tf.constant([[8.0]]), tf.constant([1]), tf.constant([3, 1]))
    out = overflow.unscale([dense, None, sparse], tf.constant(2.0))
    np.testing.assert_array_equal(out[0].numpy(), [1.0, -2.0])
    assert out[1] is None
    assert isinstance(out[2], tf.IndexedSlices)
    np.testing.assert_array_equal(out[2].values.numpy(), [[4.0]])
    np.testing.assert_array_equal(out[2].indices.numpy(), [1])


def test_unscale_half_precision_does_not_flush_to_zero_at_large_scales():
    scale = 2.0**26  # 1/scale is below fp16's smallest subnormal (2**-24), so zero in fp16
    grad = tf.constant([2.0**15], tf.float16)  # a scaled fp16 gradient
    (out,) = overflow.unscale([grad], tf.constant(scale))
    assert out.dtype == tf.float16
    assert float(out[0]) == 2.0**-11


def test_stash_finds_returned_derived_and_foreign_gradients_in_a_graph():
    g = tf.Graph()
    with g.as_default():
        a, b, other = tf.ones([2]), tf.ones([3]), tf.ones([4])
        flag = tf.constant(1.0, name="backward_status")
        stash = overflow.StatusStash()
        stash.put([a, None, b], flag)

        direct = stash.find([a, None, b])
        assert [t.name for t in direct.statuses] == [flag.name]
        assert direct.derived == [] and direct.foreign == []

        clipped, _ = tf.clip_by_global_norm([a, b], 1.0)
        derived = stash.find(clipped)
        assert [t.name for t in derived.statuses] == [flag.name]
        assert derived.derived == clipped and derived.foreign == []

        foreign = stash.find([other])
        assert foreign.statuses == [] and foreign.foreign == [other]


def test_stash_eagerly_answers_for_every_pass_since_the_last_find():
    stash = overflow.StatusStash()
    first, second, other = [tf.ones([2])], [tf.ones([2])], [tf.ones([2])]
    stash.put(first, tf.constant(1.0))
    stash.put(second, tf.constant(0.0))
    # The second pass's own tensors still answer for the first, overflowed pass.
    found = stash.find(second)
    assert [float(s) for s in found.statuses] == [1.0] and found.foreign == []
    # That find took both passes: nothing is pending any more.
    assert stash.find(second) == overflow.StashLookup([], [], second)
    stash.put(first, tf.constant(0.0))
    # Tensors that are not the ones returned: the pending status, and checked again as made
    # from those passes (for inf/NaN), not as gradients of unknown origin.
    found = stash.find(other)
    assert [float(s) for s in found.statuses] == [0.0]
    assert found.derived == other and found.foreign == []
    # Only the latest pass's tensors are held: an earlier pass's count as not returned.
    stash.put(first, tf.constant(0.0))
    stash.put(second, tf.constant(0.0))
    assert stash.find(first).derived == first
