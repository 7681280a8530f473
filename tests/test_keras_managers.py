"""The TF managers as the Keras front-end and ported TF2 scripts use them: called like
TensorFlow's LossScale objects (`loss_scaler()`), eagerly and in a TF1 graph."""

from __future__ import annotations

import tensorflow as tf

from npu_lossscale.tf.managers import ExponentialUpdateLossScaleManager, FixedLossScaleManager


def test_calling_a_manager_gives_its_loss_scale_eagerly() -> None:
    dynamic = ExponentialUpdateLossScaleManager(2.0**10, 1, decr_every_n_nan_or_inf=1)
    fixed = FixedLossScaleManager(128)
    assert float(dynamic()) == float(dynamic.get_loss_scale()) == 1024.0
    assert float(fixed()) == 128.0
    dynamic.update_loss_scale(False)  # one overflow: times decr_ratio 0.8, in float32
    assert float(dynamic()) == float(dynamic.get_loss_scale()) == 819.2000122070312


def test_calling_a_manager_in_a_graph_fetches_the_same_tensor() -> None:
    with tf.Graph().as_default():
        manager = ExponentialUpdateLossScaleManager(2.0**5, 1)
        assert manager() is manager.get_loss_scale()  # the shared 'loss_scale:0' read
        update = manager.update_loss_scale(tf.constant(True))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(update)
            assert session.run(manager()) == 64.0
