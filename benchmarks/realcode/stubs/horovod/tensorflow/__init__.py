"""Single-worker stand-in for horovod.tensorflow (see the horovod package's docstring)."""

import tensorflow as tf

from horovod import (  # noqa: F401  re-exported as horovod.tensorflow does
    Adasum,
    Average,
    Sum,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
)
from horovod.tensorflow.compression import Compression  # noqa: F401

_SessionRunHook = tf.compat.v1.train.SessionRunHook


def allreduce(tensor, *args, **kwargs):
    """The mean (or sum) over one worker is the tensor itself."""
    return tensor


def allgather(tensor, *args, **kwargs):
    return tensor


def broadcast(tensor, root_rank=0, *args, **kwargs):
    return tensor


def broadcast_variables(variables, root_rank=0, *args, **kwargs):
    """Nothing to copy from rank 0 to itself; a no-op op in graph mode, None eagerly."""
    return tf.group(*[])


def broadcast_global_variables(root_rank=0):
    return tf.group(*[])


class BroadcastGlobalVariablesHook(_SessionRunHook):
    """A session hook that does nothing: one worker's variables are already its own."""

    def __init__(self, root_rank=0, device=""):
        self.root_rank = root_rank
        self.device = device


def DistributedOptimizer(optimizer, *args, **kwargs):  # horovod's own name
    """One worker averages nothing: the optimizer itself."""
    return optimizer


def DistributedGradientTape(gradtape, *args, **kwargs):  # horovod's own name
    return gradtape
