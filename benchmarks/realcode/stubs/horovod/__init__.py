"""Single-worker stand-in for horovod, used only by benchmarks/realcode.py's import probe.

It lets a ported training file that imports horovod be imported and its graph built on a machine
without MPI; it never communicates. Every function answers as one worker of one would (size 1,
rank 0; before init() the world size and ranks raise, as Horovod's do) and every collective
returns its input, so a probe result that ran on it is labelled "stub: horovod" and is no
evidence about multi-worker behaviour.
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


def _initialised() -> None:
    """Real Horovod refuses these before init(); so does the stand-in, or a port that asks the
    world size of a Horovod nobody initialised would pass here and fail on the cluster."""
    if not _initialized:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def size() -> int:
    _initialised()
    return 1


def local_size() -> int:
    _initialised()
    return 1


def rank() -> int:
    _initialised()
    return 0


def local_rank() -> int:
    _initialised()
    return 0


def nccl_built() -> bool:
    """No collective library is linked in, which is what a CPU build of horovod reports."""
    return False


def mpi_threads_supported() -> bool:
    return False
