"""Parent links for every node, from one walk.

libcst's ParentNodeProvider asks each node it leaves for its `children`, and libcst computes
`children` by visiting them again, so the provider costs about two walks of the file. A stack kept
during one walk sees exactly the same child -> parent pairs (the children a node's visit enters
are the ones `children` lists).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import BatchableMetadataProvider


class ParentProvider(BatchableMetadataProvider[cst.CSTNode]):
    """Drop-in for ParentNodeProvider: the same mapping, the module itself has no parent."""

    def visit_Module(self, node: cst.Module) -> None:
        node.visit(_ParentVisitor(self))


class _ParentVisitor(cst.CSTVisitor):
    def __init__(self, provider: ParentProvider) -> None:
        super().__init__()
        self.provider = provider
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.provider.set_metadata(node, self.stack[-1])
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()
