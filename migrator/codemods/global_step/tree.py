"""Walking the parts of a tree the global-step analysis asks about, and reading assignments.

One walk indexes the module (`Index`); `collect` then answers "the nodes of these types below this
root" by slicing it, which the analysis asks for many roots. The assignment readers say what a
function binds to a name, or that it cannot tell.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar

import libcst as cst

from migrator.codemods.global_step.exprs import name_of
from migrator.codemods.shared.trivia import TRIVIA
from migrator.codemods.shared.visiting import preorder, visit


class Collector(cst.CSTVisitor):
    """Collects nodes of some types below a root without entering nested scopes (unless asked)."""

    def __init__(self, root: cst.CSTNode, types: tuple[type, ...], *, enter_defs: bool) -> None:
        self.root = root
        self.types = types
        self.enter_defs = enter_defs
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if _is_a(type(node), self.types):
            self.found.append(node)
        if node is not self.root and _is_a(type(node), _DEFS):
            return self.enter_defs
        return True


class Index:
    """Every node of a tree in visiting order with the end of its subtree, from one walk.

    The analysis asks for the nodes of some types below many roots; slicing this list gives the
    same nodes in the same order as a walk below each root would, without walking again. The
    index also lists every function with the names of its enclosing defs, in source order.

    Trivia (migrator.codemods.shared.trivia) is left out of the walk, and so of the index: asked
    for types a trivia node could be, or below a trivia root, `collect` says it cannot tell.
    """

    def __init__(self, root: cst.CSTNode) -> None:
        self.nodes, self.ends = preorder(root)
        self.start = {id(node): i for i, node in enumerate(self.nodes)}
        self.functions: list[tuple[cst.FunctionDef, tuple[str, ...]]] = []
        enclosing: list[tuple[int, tuple[str, ...]]] = []  # (end of a def, its path)
        for i, node in enumerate(self.nodes):
            if i == 0 or not _is_a(type(node), _DEFS):
                continue
            while enclosing and enclosing[-1][0] <= i:
                enclosing.pop()
            path = (*(enclosing[-1][1] if enclosing else ()), node.name.value)
            enclosing.append((self.ends[i], path))
            if isinstance(node, cst.FunctionDef):
                self.functions.append((node, path))

    def collect(
        self, root: cst.CSTNode, types: tuple[type, ...], enter_defs: bool
    ) -> list[cst.CSTNode] | None:
        """What `Collector` finds below `root`, or None when `root` is not in this index."""
        first = self.start.get(id(root))
        if first is None or self.nodes[first] is not root or _may_be_trivia(types):
            return None
        found: list[cst.CSTNode] = []
        nodes, ends = self.nodes, self.ends
        i, stop = first, ends[first]
        while i < stop:
            node = nodes[i]
            if _is_a(type(node), types):
                found.append(node)
            if i != first and not enter_defs and _is_a(type(node), _DEFS):
                i = ends[i]
            else:
                i += 1
        return found


_DEFS = (cst.FunctionDef, cst.ClassDef)


@functools.cache
def _may_be_trivia(types: tuple[type, ...]) -> bool:
    return any(issubclass(one, types) for one in TRIVIA)


# (node type, types) -> whether the one is a subclass of the others: libcst's node classes are
# ABCs, whose isinstance costs a call into the abc machinery on every node of every walk here.
_SUBCLASS: dict[tuple[type, tuple[type, ...]], bool] = {}


def _is_a(node_type: type, types: tuple[type, ...]) -> bool:
    found = _SUBCLASS.get((node_type, types))
    if found is None:
        found = _SUBCLASS[(node_type, types)] = issubclass(node_type, types)
    return found


# The index of the module being analysed; set only while `Analyzer.visit_Module` runs.
INDEX: ContextVar[Index | None] = ContextVar("global_step_index", default=None)


def collect(root: cst.CSTNode, *types: type, enter_defs: bool = False) -> list:
    index = INDEX.get()
    found = index.collect(root, types, enter_defs) if index is not None else None
    if found is not None:
        return found
    collector = Collector(root, types, enter_defs=enter_defs)
    visit(root, collector)
    return collector.found


def names_in(node: cst.CSTNode, name: str) -> int:
    return sum(1 for n in collect(node, cst.Name, enter_defs=True) if n.value == name)


def assignments(fn: cst.FunctionDef) -> dict[str, list[cst.BaseExpression | None]]:
    """name -> values assigned in the function's own scope; None where the value is unknown."""
    out: dict[str, list[cst.BaseExpression | None]] = {}
    for param in collect(fn.params, cst.Param):
        if isinstance(param.default, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # `optimizer="adamw"` (ALBERT) names what to build; it is not a value here
        out.setdefault(param.name.value, []).append(None)
    for node in collect(fn.body, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.AsName):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    out.setdefault(target.target.value, []).append(node.value)
                else:
                    for name in collect(target.target, cst.Name):
                        out.setdefault(name.value, []).append(None)
        elif isinstance(node, cst.AnnAssign) and isinstance(node.target, cst.Name):
            out.setdefault(node.target.value, []).append(node.value)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            out.setdefault(node.target.value, []).append(None)
        elif isinstance(node, (cst.For, cst.AsName)):
            for name in collect(node.target if isinstance(node, cst.For) else node.name, cst.Name):
                out.setdefault(name.value, []).append(None)
    return out


def assigned_value(stmt: cst.BaseStatement, name: str) -> cst.BaseExpression | None:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    assign = stmt.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        if name_of(assign.targets[0].target) == name:
            return assign.value
    return None


def branch_values(stmt: cst.BaseStatement, name: str) -> list[cst.BaseExpression] | None:
    """`if ...: name = a  elif ...: name = b  else: name = c` -> [a, b, c]; else None."""
    if not isinstance(stmt, cst.If):
        return None
    values: list[cst.BaseExpression] = []
    branch: cst.If | cst.Else | None = stmt
    while branch is not None:
        body = branch.body.body if isinstance(branch.body, cst.IndentedBlock) else ()
        found = [assigned_value(s, name) for s in body]
        if not found or any(v is None for v in found):
            return None
        values.extend(v for v in found if v is not None)
        if isinstance(branch, cst.Else):
            return values
        branch = branch.orelse
    return None


def indented_blocks(fn: cst.FunctionDef) -> list[cst.IndentedBlock]:
    return collect(fn.body, cst.IndentedBlock)


def statement_owners(fn: cst.FunctionDef) -> dict[int, cst.SimpleStatementLine]:
    """id(call) -> the simple statement line containing it (own scope only)."""
    owners: dict[int, cst.SimpleStatementLine] = {}
    for line in collect(fn.body, cst.SimpleStatementLine):
        for call in collect(line, cst.Call):
            owners[id(call)] = line
    return owners
