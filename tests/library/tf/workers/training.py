"""The tiny training step every distributed worker script runs, so all jobs share one model.

Each replica's loss is 0.5 * sum(w**2) * poison, so its gradient is w * poison: poison 1.0 is a
clean step, and the per-mode poison makes only that replica's backward pass overflow. Expected
values live in the tests, derived by hand; this module only builds and runs the step.
"""

from __future__ import annotations

import tensorflow as tf

from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer

INITIAL_WEIGHTS = [1.0, -2.0]
LEARNING_RATE = 0.25

# Which replica/worker overflows at each step (None: nobody). Step 1 poisons the *second* replica
# and step 4 the *first*, so "let replica 0 decide" and "let replica 1 decide" both show up.
SCHEDULES = {
    "mixed": [None, 1, None, None, 0, None],
    "clean": [None, None, None, None],
}

# inf for INF/NAN mode. Saturation mode must also catch a *finite* gradient whose scaled value
# reaches the fp16 maximum (an inf/NaN check would apply it): 1e4 * |w| * 256 is far above 65504.
POISON = {"inf_nan": float("inf"), "saturation": 1e4}


def make_manager(mode: str) -> ExponentialUpdateLossScaleManager:
    return ExponentialUpdateLossScaleManager(
        init_loss_scale=256,
        incr_every_n_steps=2,
        decr_every_n_nan_or_inf=1,
        decr_ratio=0.5,
        overflow_mode=mode,
    )


def make_optimizer(manager: ExponentialUpdateLossScaleManager, reducer: object = None):
    inner = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE)
    return NPULossScaleOptimizer(inner, manager, is_distributed=True, reducer=reducer)


def poison_for(schedule_entry: int | None, replica: int, mode: str) -> float:
    return POISON[mode] if schedule_entry == replica else 1.0


def replica_step(optimizer, weights: tf.Variable, poison: tf.Tensor, global_step: tf.Variable):
    """One replica's forward, backward and (distributed) apply; poison is indexed per replica."""
    replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
    loss = 0.5 * tf.reduce_sum(weights * weights) * poison[replica_id]
    return optimizer.minimize(loss, global_step=global_step, var_list=[weights])
