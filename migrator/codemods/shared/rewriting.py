"""The rewriting both ports share: enter only what the plan touches, drop import aliases.

libcst's commands schedule their import edits through one shared visitor; ours share this base
transformer. A rewrite walks only the planned nodes and their ancestors (found through the parent
links the analysis resolved): a handful of paths instead of every node of the file, and whatever
it does not enter comes back exactly as libcst parsed it. An import alias the plan removes goes
with its comma; an import left with no alias is the subclass's to drop with its line, whose
comments `comments_of` keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import libcst as cst

_ImportT = TypeVar("_ImportT", cst.Import, cst.ImportFrom)


class PlannedRewriter(cst.CSTTransformer):
    """`planned`: the original nodes the rewrite changes or places statements around;
    `removals`: import statement -> indexes of the aliases to delete."""

    def __init__(
        self,
        planned: Iterable[cst.CSTNode],
        parents: Mapping[cst.CSTNode, cst.CSTNode],
        removals: Mapping[cst.CSTNode, set[int]],
    ) -> None:
        super().__init__()
        self._enter = with_ancestors(planned, parents)
        self._removals = removals

    def on_visit(self, node: cst.CSTNode) -> bool:
        # A subtree with no planned node comes back unchanged: no need to walk it.
        return node in self._enter and super().on_visit(node)

    def leave_Import(self, original: cst.Import, updated: cst.Import) -> cst.Import:
        return self.drop_aliases(original, updated)

    def drop_aliases(self, original: cst.CSTNode, updated: _ImportT) -> _ImportT:
        """The import without the aliases the plan removes (unchanged when it removes them all:
        the whole statement goes, which the subclass decides with its line)."""
        gone = self._removals.get(original)
        if not gone or isinstance(updated.names, cst.ImportStar):
            return updated
        kept = [a for i, a in enumerate(updated.names) if i not in gone]
        if not kept:
            return updated
        parenthesized = isinstance(updated, cst.ImportFrom) and updated.lpar is not None
        if not parenthesized or max(gone) == len(updated.names) - 1:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)

    def emptied(self, small: cst.BaseSmallStatement) -> bool:
        """Whether the plan removes every alias of this import statement."""
        gone = self._removals.get(small)
        aliases = getattr(small, "names", None)
        return bool(gone) and isinstance(aliases, Sequence) and len(gone) == len(aliases)


def with_ancestors(
    nodes: Iterable[cst.CSTNode], parents: Mapping[cst.CSTNode, cst.CSTNode]
) -> set[cst.CSTNode]:
    """The nodes and every node above them."""
    found: set[cst.CSTNode] = set()
    for node in nodes:
        current: cst.CSTNode | None = node
        while current is not None and current not in found:
            found.add(current)
            current = parents.get(current)
    return found


def comments_of(line: cst.SimpleStatementLine) -> list[cst.EmptyLine]:
    """The comments a dropped line carried, so they can stay in the file."""
    kept = [e for e in line.leading_lines if e.comment is not None]
    trailing = line.trailing_whitespace.comment
    if trailing is not None:
        kept.append(cst.EmptyLine(comment=trailing))
    return kept
