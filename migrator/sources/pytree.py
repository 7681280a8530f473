"""The standard library's tree of a file, parsed once for the triage and the long-file view.

On a long file `ast.parse` is the largest single cost left to those two passes, and when the run
ports one file in-process they read the same bytes one after the other. Only the latest trees
are kept: a tree costs far more memory than its source, and `forget` drops them when a run ends.
"""

from __future__ import annotations

import ast
import functools


@functools.lru_cache(maxsize=2)
def parse(source: bytes) -> ast.Module:
    """`ast.parse(source)`; raises as it does (failures are not cached)."""
    return ast.parse(source)


def forget() -> None:
    """Drop the kept trees. Left in the cache, a 20,000-line module's tree made the interpreter's
    exit take a second longer than the whole port (freed object by object at shutdown)."""
    parse.cache_clear()
