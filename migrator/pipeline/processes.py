"""How an npu-migrate process runs: the command line's own and each of its workers.

The settings here are process-wide (the garbage collector's schedule, warning filters, a thread
watching the parent), so they are made only in processes that are npu-migrate's own: the command
line sets them, and each pool's initializer, never a library caller's process.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import warnings
from collections.abc import Iterator

_collect_between_files = False
YOUNG_COLLECTION_THRESHOLD = 100_000


def collect_between_files() -> None:
    """From now on, run the cyclic garbage collector between files, never during one.

    A port builds millions of objects that live until its file is done (the `ast` and libcst
    trees) and makes little cyclic garbage (libcst's scope graph, freed by one young collection
    when the file is done). At the default threshold (700 allocations) the collector rescanned
    the live trees a third of the time of a 20,000-line file; a hundred times less often, it
    still made the parse that checks the ported file 2.5 times slower than the first parse of
    the same size (1.2 s against 0.47 s); paused, the two cost the same. Between files it runs
    a hundred times less often than by default. Set by the command line and its workers, where
    the process is npu-migrate's own."""
    global _collect_between_files
    _collect_between_files = True
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def configure_process() -> None:
    """npu-migrate's settings for a process of its own: the command line's and each worker's.

    Workers started by fork inherit them; started by forkserver or spawn (forkserver is Python
    3.14's default on Linux) they do not, and under either a `-j 2` run printed four lines of
    noise per file, so each pool's initializer calls this too.
    """
    collect_between_files()
    # The user's code is parsed and its string literals evaluated (ast, libcst), and from Python
    # 3.12 the compiler prints a SyntaxWarning for each invalid escape in them (`"\\d"`), named
    # after no file: noise about code npu-migrate does not change.
    warnings.filterwarnings("ignore", category=SyntaxWarning)


@contextlib.contextmanager
def one_file() -> Iterator[None]:
    """The work on one file, with the collector paused when `collect_between_files` was called."""
    if not _collect_between_files or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        # Collected before it is enabled again: enabled with the count past its threshold,
        # the collector would start a young collection of its own at the next allocation.
        gc.collect(0)
        gc.enable()


PARENT_POLL_SECONDS = 0.5


def watch_parent() -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """End this worker once the process that started it is gone.

    A killed npu-migrate (SIGKILL, an OOM kill) cannot tell its pool to stop, and a worker waiting
    for work or porting a large file went on for a minute, holding memory; when the parent dies the
    worker is re-parented, which this notices within PARENT_POLL_SECONDS."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)
