"""A stand-in for the Ascend adapter's TF 2.x package `npu_device`, for tests only (no CANN here).

It is not the adapter. `npu_device.train.optimizer.NpuLossScaleOptimizer` takes exactly the
parameters the vendor documents for TF 2.6.5, `(inner_optimizer, dynamic=True, initial_scale=None,
dynamic_growth_steps=None)` (any other argument fails as it would on an Ascend host), records each
call in `npu_device.train.optimizer.CALLS`, and builds npu_lossscale's Keras 2 class, so a Keras
script ported with `--target npu-bridge` is still trained end to end here.
"""

from npu_device import train  # noqa: F401  (`npu.train.optimizer...`, as the adapter is used)
