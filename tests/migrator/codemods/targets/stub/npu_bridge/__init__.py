"""A stand-in for the Ascend TensorFlow adapter, for tests only: no machine here has CANN.

It is not the adapter. `npu_bridge.npu_init` offers the adapter's three loss-scale classes with
exactly the parameters the adapter's take (a call with any other argument fails as it would on
an Ascend host), records each construction in `npu_bridge.npu_init.CALLS`, and delegates the work
to npu_lossscale's classes, so a script ported with `--target npu-bridge` is still trained end
to end here.
"""
