"""Codemods that port torch.amp scripts (being written)."""
