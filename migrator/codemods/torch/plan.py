"""The plan the torch analysis fills in and `rewrite.py` applies.

Its own module so that the analysis, the import placement (`imports.py`) and the rewriter all
import it from here, and none of them imports another for the type.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from migrator.codemods.torch.arguments import Builder


@dataclasses.dataclass
class TorchPlan:
    """Everything the rewriter changes, keyed by nodes of the original tree."""

    calls: dict[cst.Call, Builder] = dataclasses.field(default_factory=dict)
    refs: dict[cst.CSTNode, str] = dataclasses.field(default_factory=dict)  # -> dotted name
    # import statement -> indexes of its aliases to delete
    removals: dict[cst.CSTNode, set[int]] = dataclasses.field(default_factory=dict)
    # statement -> import lines to add after it (in its place when all of it is removed)
    after: dict[cst.BaseStatement, list[str]] = dataclasses.field(default_factory=dict)
    # try/except or if/else statements (keys of `after`) that its import lines replace whole
    collapse: set[cst.BaseStatement] = dataclasses.field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.calls or self.refs)


@dataclasses.dataclass
class ImportBinding:
    """One alias of an import statement that the port may drop (into `TorchPlan.removals`)."""

    node: cst.Import | cst.ImportFrom
    index: int
    bound: str  # the local name
    qualified: str
