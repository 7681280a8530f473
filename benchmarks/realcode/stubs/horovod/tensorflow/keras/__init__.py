"""Single-worker stand-in for horovod.tensorflow.keras (see the horovod package's docstring)."""

from horovod import (  # noqa: F401  re-exported as horovod.tensorflow.keras does
    Adasum,
    Average,
    Sum,
    init,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from horovod.tensorflow import (  # noqa: F401
    Compression,
    DistributedOptimizer,
    allreduce,
    broadcast_global_variables,
)
from horovod.tensorflow.keras import callbacks  # noqa: F401
