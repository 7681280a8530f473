"""Output targets: the finished port spelled for a runtime other than npu_lossscale."""
