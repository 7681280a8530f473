"""Single-worker stand-in for horovod.torch (see the horovod package's docstring)."""

from horovod import (  # noqa: F401  re-exported as horovod.torch does
    Adasum,
    Average,
    Sum,
    init,
    is_initialized,
    local_rank,
    local_size,
    nccl_built,
    rank,
    shutdown,
    size,
)
from horovod._compression import Compression  # noqa: F401


def allreduce(tensor, *args, **kwargs):
    return tensor


def allgather(tensor, *args, **kwargs):
    return tensor


def broadcast(tensor, root_rank=0, *args, **kwargs):
    return tensor


def broadcast_parameters(params, root_rank=0):
    """Rank 0 already holds its own parameters."""


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Rank 0 already holds its own optimizer state."""


def DistributedOptimizer(optimizer, *args, **kwargs):  # horovod's own name
    return optimizer
