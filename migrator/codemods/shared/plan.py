"""The plan the TF1 and Keras ports fill in and `tf1/rewrite.py` applies.

Both analyses decide on the original tree and write their decisions here; the rewriter, the
import placement (`imports.py`) and the analyses all import these types from this module, so none
of them needs another's code to know what a plan is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import libcst as cst
from libcst.metadata import Assignment

# Builds the new argument list from the *transformed* call's arguments and the local names the
# npu_lossscale classes are imported under.
Builder = Callable[[Sequence[cst.Arg], Mapping[str, str]], list[cst.Arg]]


@dataclasses.dataclass
class CallEdit:
    """Replace a call's callee by an npu_lossscale class; `build` rewrites its arguments."""

    target: str
    build: Builder | None = None


@dataclasses.dataclass
class Edits:
    """Everything the rewriter changes, keyed by nodes of the original (metadata-carrying) tree."""

    calls: dict[cst.Call, CallEdit] = dataclasses.field(default_factory=dict)
    refs: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)
    # original With -> the simple statement inside it that moves to just before it
    hoists: dict[cst.With, cst.SimpleStatementLine] = dataclasses.field(default_factory=dict)
    # original import small-statement -> indexes of its aliases to delete
    removals: dict[cst.CSTNode, set[int]] = dataclasses.field(default_factory=dict)
    # a removed module-level import whose names other files import from this one -> the
    # (npu_lossscale class, name) pairs that keep those names bound
    rebinds: dict[cst.CSTNode, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        # a rebind alone is a change too: a pure re-export module's import, rebound
        return bool(self.calls or self.refs or self.hoists or self.rebinds)


@dataclasses.dataclass
class Site:
    """One rewritten place: where it is, which class it needs, and which import makes it work."""

    node: cst.CSTNode
    targets: tuple[str, ...]
    provider: Assignment | None
