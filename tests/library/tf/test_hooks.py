"""LossScaleLoggingHook in a real MonitoredTrainingSession: log lines and TensorBoard scalars."""

from __future__ import annotations

import glob
import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import npu_lossscale as nl
from npu_lossscale.tf.hooks import SCALE_TAG, SKIPPED_TAG

pytestmark = pytest.mark.stacks


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


_HOOK_SCRIPT = """
import logging, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
import npu_lossscale as nl
if "tf" in sys.argv:
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
if "basic" in sys.argv:
    logging.basicConfig(level=logging.INFO)
graph = tf.Graph()
with graph.as_default():
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer())
    step = tf.compat.v1.train.get_or_create_global_step()
    manager = nl.FixedLossScaleManager(128, overflow_mode="inf_nan")
    opt = nl.NPULossScaleOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), manager)
    train = opt.minimize(tf.reduce_sum(w), global_step=step)
    hook = nl.LossScaleLoggingHook(opt, every_n_steps=2)
    with tf.compat.v1.train.MonitoredTrainingSession(
        hooks=[hook], save_checkpoint_secs=None, save_summaries_steps=None
    ) as sess:
        for _ in range(2):
            sess.run(train)
"""


@pytest.mark.parametrize("setup", [["tf"], ["basic"], ["tf", "basic"]])
def test_speaks_under_tensorflow_verbosity_and_basic_config_once(setup):
    """A TF user's set_verbosity(INFO) and a Python user's basicConfig(INFO) both show the line,
    and with both it is printed once, not twice."""
    done = subprocess.run(
        [sys.executable, "-c", _HOOK_SCRIPT, *setup],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    output = done.stdout + done.stderr
    assert output.count("loss scale 128, skipped steps 0, global step 2") == 1, output


def test_stays_silent_without_logging_configured():
    done = subprocess.run(
        [sys.executable, "-c", _HOOK_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "loss scale" not in done.stdout + done.stderr
