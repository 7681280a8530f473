"""libcst's `parse_module` without validating every node the parser builds.

Each libcst node validates itself when constructed (`CSTNode.__post_init__` calls `_validate`),
which catches hand-built nodes that could not be printed back as Python. The parser only builds
nodes from code it has just parsed, and those checks were 12-20% of a parse, the largest single
cost of a file that reaches libcst (measured over the 341 such files of a dense real tree: 10.4 s
against 8.9 s). libcst's own comment on `__post_init__` suggests the same. Validation is switched
off only while the parser runs, and only while libcst's method reads exactly as below (libcst is
pinned): any other version parses as libcst does.

The switch is process-wide while it lasts: a thread building nodes by hand at that moment would
skip their checks too; npu-migrate builds nodes in the thread that parses.
"""

from __future__ import annotations

import inspect
import textwrap

import libcst as cst
from libcst._nodes.base import CSTNode

_POST_INIT = """def __post_init__(self) -> None:
    # PERF: It might make more sense to move validation work into the visitor, which
    # would allow us to avoid validating the tree when parsing a file.
    self._validate()
"""
_VALIDATING = CSTNode.__post_init__
_KNOWN = textwrap.dedent(inspect.getsource(_VALIDATING)) == _POST_INIT


def _skip(self: CSTNode) -> None:
    return None


def parse_module(source: bytes) -> cst.Module:
    """`cst.parse_module(source)`, raising as it does, with node validation off meanwhile."""
    if not _KNOWN:
        return cst.parse_module(source)
    CSTNode.__post_init__ = _skip  # type: ignore[method-assign]
    try:
        return cst.parse_module(source)
    finally:
        CSTNode.__post_init__ = _VALIDATING  # type: ignore[method-assign]
