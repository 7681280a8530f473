"""LossScaleLoggingHook in a real MonitoredTrainingSession: log lines and TensorBoard scalars."""

from __future__ import annotations

import glob
import logging

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl
from npu_lossscale.tf.hooks import SCALE_TAG, SKIPPED_TAG


def train_with_hook(tmp_path, make_hook, ks):
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [3], initializer=tf.compat.v1.ones_initializer())
        k = tf.compat.v1.placeholder_with_default(1.0, [])
        step = tf.compat.v1.train.get_or_create_global_step()
        manager = nl.ExponentialUpdateLossScaleManager(
            1024.0, 1000, decr_every_n_nan_or_inf=1, decr_ratio=0.5, overflow_mode="inf_nan"
        )
        opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
        train = opt.minimize(k * tf.reduce_sum(w), global_step=step)
        hook = make_hook(opt)
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[hook], save_checkpoint_secs=None, save_summaries_steps=None
        ) as sess:
            for value in ks:
                sess.run(train, {k: value})
    return hook


def test_logs_every_n_steps_and_at_the_end(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="npu_lossscale")
    # Steps: clean, inf (skip, scale 1024 -> 512), clean, clean, nan (skip, -> 256).
    ks = [1.0, np.inf, 1.0, 1.0, np.nan]
    train_with_hook(tmp_path, lambda opt: nl.LossScaleLoggingHook(opt, every_n_steps=2), ks)
    lines = [r.getMessage() for r in caplog.records if r.name == "npu_lossscale"]
    reports = [line for line in lines if line.startswith("loss scale")]
    assert reports == [
        "loss scale 512, skipped steps 1, global step 1",  # after run 2
        "loss scale 512, skipped steps 1, global step 3",  # after run 4
        "loss scale 256, skipped steps 2, global step 3",  # end of training (run 5)
    ]


def test_writes_tensorboard_scalars(tmp_path):
    summary_dir = str(tmp_path / "events")
    ks = [1.0, np.inf, 1.0]
    train_with_hook(
        tmp_path,
        lambda opt: nl.LossScaleLoggingHook(
            opt.loss_scale_manager, every_n_steps=1, summary_dir=summary_dir
        ),
        ks,
    )
    scalars = []
    for path in glob.glob(f"{summary_dir}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.append((event.step, value.tag, value.simple_value))
    assert sorted(scalars) == sorted(
        [
            (1, SCALE_TAG, 1024.0),
            (1, SKIPPED_TAG, 0.0),
            (1, SCALE_TAG, 512.0),  # run 2 skipped: global step stays 1
            (1, SKIPPED_TAG, 1.0),
            (2, SCALE_TAG, 512.0),
            (2, SKIPPED_TAG, 1.0),
        ]
    )


def test_bad_arguments(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        manager = nl.FixedLossScaleManager(8.0)
        with pytest.raises(ValueError, match="optimizer_or_manager"):
            nl.LossScaleLoggingHook("loss_scale:0")
        with pytest.raises(ValueError, match="every_n_steps"):
            nl.LossScaleLoggingHook(manager, every_n_steps=0)
        with pytest.raises(ValueError, match="not both"):
            nl.LossScaleLoggingHook(
                manager,
                summary_dir=str(tmp_path),
                summary_writer=tf.compat.v1.summary.FileWriter(str(tmp_path)),
            )
