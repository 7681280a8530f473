"""A small mixed-precision model really learns under dynamic loss scaling from 2**32.

The dense layers compute in float16 with float32 master weights, as a ported GPU script does.
At a scale of 2**32 the backward pass overflows fp16, so the first steps must be skipped while the
scale comes down; after that the loss must fall clearly -- in both overflow modes.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl

pytestmark = pytest.mark.stacks

STEPS = 150


def fp16_dense(x: tf.Tensor, units: int, name: str) -> tf.Tensor:
    kernel = tf.compat.v1.get_variable(
        name, [int(x.shape[-1]), units], initializer=tf.compat.v1.glorot_uniform_initializer()
    )
    return tf.matmul(x, tf.cast(kernel, tf.float16))


@pytest.mark.parametrize("mode", ["inf_nan", "saturation"])
def test_model_learns_after_the_scale_comes_down(mode):
    rng = np.random.default_rng(0)
    features = rng.standard_normal((64, 8)).astype(np.float32)
    targets = (features @ rng.standard_normal((8, 1))).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        hidden = tf.nn.relu(fp16_dense(tf.cast(tf.constant(features), tf.float16), 32, "w1"))
        prediction = tf.cast(fp16_dense(hidden, 1, "w2"), tf.float32)
        loss = tf.reduce_mean(tf.square(prediction - targets))
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.ExponentialUpdateLossScaleManager(
            2**32,
            incr_every_n_steps=1000,
            decr_every_n_nan_or_inf=1,
            decr_ratio=0.5,
            overflow_mode=mode,
        )
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(0.01), manager)
        train = opt.minimize(loss, global_step=step)
        scale = opt.loss_scale
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first_loss = sess.run(loss)
            for _ in range(STEPS):
                sess.run(train)
            last_loss, skipped, applied, final_scale = sess.run(
                [loss, opt.skipped_steps, step, scale]
            )
    assert skipped >= 5, "2**32 must overflow fp16 at first"
    assert skipped + applied == STEPS
    assert final_scale < 2**20
    assert last_loss < 0.1 * first_loss, (first_loss, last_loss)
