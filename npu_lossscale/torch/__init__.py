"""PyTorch front-end of npu_lossscale (being written)."""
