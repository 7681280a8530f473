"""Single-worker stand-in for horovod, used only by benchmarks/realcode.py's import probe.

It lets a ported training file that imports horovod be imported and its graph built on a machine
without MPI; it never communicates. Every function answers as one worker of one would (size 1,
rank 0) and every collective returns its input, so a probe result that ran on it is labelled
"stub: horovod" and is no evidence about multi-worker behaviour.
"""

__version__ = "0.0.0+single-worker-stub"

# Reduction ops, as the frameworks' modules re-export them.
Average = "average"
Sum = "sum"
Adasum = "adasum"

_initialized = False


def init(*args: object, **kwargs: object) -> None:
    """Starts nothing: there is no other worker to reach."""
    global _initialized
    _initialized = True


def shutdown() -> None:
    global _initialized
    _initialized = False


def is_initialized() -> bool:
    return _initialized


def size() -> int:
    return 1


def local_size() -> int:
    return 1


def rank() -> int:
    return 0


def local_rank() -> int:
    return 0


def nccl_built() -> bool:
    """No collective library is linked in, which is what a CPU build of horovod reports."""
    return False


def mpi_threads_supported() -> bool:
    return False
