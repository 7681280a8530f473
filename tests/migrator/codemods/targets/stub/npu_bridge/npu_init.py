"""The names of the adapter's `npu_bridge.npu_init` a loss-scale port uses (see __init__)."""

import npu_lossscale as _impl

CALLS = []

__all__ = [
    "CALLS",
    "ExponentialUpdateLossScaleManager",
    "FixedLossScaleManager",
    "NPULossScaleOptimizer",
    "npu_distributed_optimizer_wrapper",
]


class FixedLossScaleManager(_impl.FixedLossScaleManager):
    def __init__(self, loss_scale, enable_overflow_check=True):
        CALLS.append(("FixedLossScaleManager", loss_scale, enable_overflow_check))
        super().__init__(loss_scale, enable_overflow_check)


class ExponentialUpdateLossScaleManager(_impl.ExponentialUpdateLossScaleManager):
    def __init__(self, init_loss_scale, incr_every_n_steps, decr_every_n_nan_or_inf=2,
                 incr_ratio=2, decr_ratio=0.8):
        CALLS.append(("ExponentialUpdateLossScaleManager", init_loss_scale, incr_every_n_steps,
                      decr_every_n_nan_or_inf, incr_ratio, decr_ratio))
        super().__init__(init_loss_scale, incr_every_n_steps, decr_every_n_nan_or_inf,
                         incr_ratio, decr_ratio)


class NPULossScaleOptimizer(_impl.NPULossScaleOptimizer):
    def __init__(self, opt, loss_scale_manager, is_distributed=False):
        CALLS.append(("NPULossScaleOptimizer", type(opt).__name__, is_distributed))
        super().__init__(opt, loss_scale_manager, is_distributed)


def npu_distributed_optimizer_wrapper(optimizer):
    CALLS.append(("npu_distributed_optimizer_wrapper", type(optimizer).__name__))
    return optimizer
