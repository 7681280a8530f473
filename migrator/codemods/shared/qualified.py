"""Qualified names of single nodes, computed on demand from the scope analysis.

libcst's QualifiedNameProvider walks every node of a file to attach a lazy value that asks the
node's scope; the codemods only ever ask about a few hundred nodes, so asking the scope directly
gives the same names without that extra walk (about a quarter of the metadata time per file).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import libcst as cst
from libcst import MetadataDependent
from libcst.metadata import (
    Assignment,
    QualifiedName,
    QualifiedNameSource,
    Scope,
    ScopeProvider,
)

from migrator.codemods.shared.nodes import dotted, is_dotted_name, small_statements


def qualified_names(visitor: MetadataDependent, node: cst.CSTNode) -> Collection[QualifiedName]:
    """What QualifiedNameProvider gives for `node`; `visitor` must depend on ScopeProvider."""
    scope = visitor.get_metadata(ScopeProvider, node, None)
    if scope is None:
        return set()
    return scope.get_qualified_names_for(node)


def without_compat_rebinding(
    names: Collection[QualifiedName],
    node: cst.CSTNode,
    scope: Scope | None,
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> Collection[QualifiedName]:
    """`names` without the local ones where the root name is imported and otherwise only rebound
    to its own `compat.v1` (`import tensorflow as tf`, then `tf = tf.compat.v1`, or `tf =
    tf.compat.v1 if tf.__version__[0] == "2" else tf`, as TF 1 scripts made to run on TF 2 do):
    every binding then spells one API, compat.v1 dropped, so the imports alone say what the name
    is."""
    local = [q for q in names if q.source is not QualifiedNameSource.IMPORT]
    if not local or len(local) == len(names):
        return names
    root = node
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name) or scope is None or root.value not in scope:
        return names
    bindings = [a for a in scope[root.value] if isinstance(a, Assignment)]
    plain = [a for a in bindings if not isinstance(a.node, (cst.Import, cst.ImportFrom))]
    if len(bindings) != len(scope[root.value]) or not plain:
        return names
    for assignment in plain:
        statement = assign_statement(assignment, parent)
        if not (
            statement is not None
            and len(statement.targets) == 1
            and _same_module(statement.value, root.value)
        ):
            return names
    return [q for q in names if q.source is QualifiedNameSource.IMPORT]


def _same_module(value: cst.BaseExpression, root: str) -> bool:
    """`root.compat.v1`, or a choice between it and `root` (`tf.compat.v1 if ... else tf`)."""
    if isinstance(value, cst.IfExp):
        return all(_same_module(v, root) or dotted(v) == root for v in (value.body, value.orelse))
    return is_dotted_name(value) and dotted(value) == f"{root}.compat.v1"


def module_alias(
    node: cst.CSTNode,
    scope: Scope | None,
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> tuple[cst.BaseExpression, list[str]] | None:
    """For `a.b.c` whose root `a` has one assignment in `scope`, a plain `a = x.y` of a dotted
    name: (`x.y`, ["b", "c"]). libcst qualifies names through imports only, so a module alias
    (`keras = tf.keras`, `amp = torch.cuda.amp`) left its uses unported without a word; the
    caller resolves `x.y` as it resolves any name."""
    parts: list[str] = []
    root = node
    while isinstance(root, cst.Attribute):
        parts.append(root.attr.value)
        root = root.value
    if not isinstance(root, cst.Name) or scope is None or root.value not in scope:
        return None
    assignments = [a for a in scope[root.value] if isinstance(a, Assignment)]
    if len(assignments) != 1 or len(scope[root.value]) != 1 or assignments[0].node is root:
        return None  # (the last: the alias's own name where it is bound, not a use of it)
    statement = assign_statement(assignments[0], parent)
    if statement is None or len(statement.targets) != 1 or not is_dotted_name(statement.value):
        return None
    return statement.value, parts[::-1]


def assign_statement(
    assignment: Assignment, parent: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> cst.Assign | None:
    """The plain `name = value` statement that makes `assignment`, or None (an import, a loop
    target, an augmented or annotated assignment...)."""
    target = parent(assignment.node)
    statement = parent(target) if target is not None else None
    if isinstance(target, cst.AssignTarget) and isinstance(statement, cst.Assign):
        return statement
    return None


def through_alias(
    visitor: MetadataDependent,
    node: cst.CSTNode,
    scope: Scope | None,
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> list[str]:
    """The imported qualified name `node` means through a module alias (`amp.GradScaler` where
    `amp = torch.cuda.amp`), as a list of one; empty where it has no such meaning."""
    alias = module_alias(node, scope, parent)
    if alias is None:
        return []
    value, parts = alias
    bases = list(qualified_names(visitor, value))
    if len(bases) != 1 or bases[0].source is not QualifiedNameSource.IMPORT:
        return []
    return [".".join([bases[0].name, *parts])]


def alias_names(module: cst.Module, roots: set[str]) -> set[str]:
    """The names `module_alias` can follow to one of `roots`: assigned a dotted name rooted at
    one (`amp = torch.cuda.amp`, `keras = tf.keras`), or at such an alias."""
    assigned = [
        (node.targets[0].target.value, dotted(node.value).split(".")[0])
        for node in small_statements(module)
        if isinstance(node, cst.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and is_dotted_name(node.value)
    ]
    found: set[str] = set()
    grown = True
    while grown:
        grown = False
        for name, root in assigned:
            if (root in roots or root in found) and name not in roots | found:
                found.add(name)
                grown = True
    return found
