"""Single-worker stand-in for horovod.tensorflow.compression."""

from horovod._compression import Compression  # noqa: F401
