"""The adapter's Keras loss-scale optimizer, stood in for (see npu_device/__init__.py)."""

CALLS = []


def NpuLossScaleOptimizer(inner_optimizer, dynamic=True, initial_scale=None,  # noqa: N802
                          dynamic_growth_steps=None):
    from npu_lossscale.keras.keras2 import LossScaleOptimizer

    CALLS.append(("NpuLossScaleOptimizer", type(inner_optimizer).__name__, dynamic,
                  initial_scale, dynamic_growth_steps))
    return LossScaleOptimizer(inner_optimizer, dynamic, initial_scale, dynamic_growth_steps)
