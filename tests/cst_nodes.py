"""Every node of a libcst tree in visiting order, by libcst's own walk: what the tests of the
migrator's walks and line numbers compare against."""

from __future__ import annotations

import libcst as cst


class _Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def all_nodes(root: cst.CSTNode) -> list[cst.CSTNode]:
    collect = _Collect()
    root.visit(collect)
    return collect.nodes
