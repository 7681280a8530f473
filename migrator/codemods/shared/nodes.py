"""Small questions about libcst nodes that every codemod asks: a dotted name's text, a node's
code, its root name, the statement of a block holding it, every node under it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from migrator.codemods.shared.visiting import every_node

Parent = Callable[[cst.CSTNode], "cst.CSTNode | None"]


def dotted(node: cst.BaseExpression | None) -> str:
    """`a.b.c` for a Name or an Attribute chain of Names; "" for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    return ""


def is_dotted_name(node: cst.BaseExpression) -> bool:
    """`a.b.c`, as opposed to an attribute of a call or subscript such as `a.b(...).c`."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def root(node: cst.BaseExpression) -> cst.Name | None:
    """The Name a dotted expression starts from (`a` of `a.b.c`), None if it starts elsewhere."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def last_name(node: cst.BaseExpression) -> str | None:
    """The name a reader calls the value by: `b` of `a.b`, `x` of `x`; None for anything else."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Name):
        return node.value
    return None


def code(node: cst.CSTNode) -> str:
    """The source text of a node, without the file's context."""
    return cst.Module([]).code_for_node(node)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and every node under it, parents first, in libcst's visiting order.

    From one read-only walk (shared.visiting): `CSTNode.children` rebuilds each node's children
    to list them, which made this the largest cost of the import survey on long files.
    """
    return iter(every_node(node))


def small_statements(
    root: cst.CSTNode, skip: tuple[type[cst.CSTNode], ...] = ()
) -> Iterator[cst.BaseSmallStatement]:
    """Every simple statement under `root`, a module or a block (`import x`, `a = b`), in
    function and class bodies and every branch too, except inside statements of the `skip`
    types, without entering a single expression: a survey of imports is then a walk over lines,
    not over every name and call of a long file."""
    stack: list[object] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield from node.body
            continue
        if skip and isinstance(node, skip):
            continue
        for field in _BLOCK_FIELDS:
            value = getattr(node, field, None)
            if isinstance(value, (list, tuple)):
                stack.extend(reversed(value))
            elif value is not None:
                stack.append(value)


# The fields of a compound statement (and of a block, an `else`, a handler, a `finally`, a match
# case) that hold statements; none of them holds an expression on those nodes.
_BLOCK_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")


def child_of(node: cst.CSTNode, block: cst.CSTNode, parent: Parent) -> cst.CSTNode | None:
    """The statement of `block` (a Module or IndentedBlock) that contains `node`."""
    current: cst.CSTNode | None = node
    while current is not None:
        up = parent(current)
        if up is block:
            return current
        current = up
    return None
