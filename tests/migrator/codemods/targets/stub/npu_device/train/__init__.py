"""`npu_device.train` of the stand-in (see npu_device/__init__.py)."""

from npu_device.train import optimizer  # noqa: F401
