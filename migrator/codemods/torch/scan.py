"""Facts about a module and the places in it the torch analysis asks about: which names the
file's torch imports bind, whether a `try:` swallows an ImportError, whether the port rewrote every
read of a name, and where a node sits (a dict key, a class's base, under TYPE_CHECKING).

The module-wide questions walk without `CSTNode.children`, which rebuilds a node's children to
list them: the import survey reads statements only, and the search for reads is one read-only
walk (they were half of the torch port's CPU on the dense tree: 67 files, 1.9-2.3 s -> 1.0 s)."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import BaseAssignment

from migrator.codemods.shared import nodes
from migrator.codemods.shared.nodes import Parent
from migrator.codemods.shared.qualified import alias_names
from migrator.codemods.shared.visiting import visit
from migrator.codemods.torch import names


def torch_roots(module: cst.Module) -> tuple[set[str], bool]:
    """Names bound by imports of torch or torch-npu anywhere in the module, and whether one of
    them is a star import (which binds names nobody can list)."""
    roots: set[str] = set()
    star = False
    for node in nodes.small_statements(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                if names.is_torch_module(nodes.dotted(alias.name)):
                    bound = alias.asname.name if alias.asname else alias.name
                    roots.add(nodes.dotted(bound).split(".")[0])
        elif isinstance(node, cst.ImportFrom):
            module_name = nodes.dotted(node.module) if node.module is not None else ""
            if node.relative or not names.is_torch_module(module_name):
                continue
            if isinstance(node.names, cst.ImportStar):
                star = True
                continue
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                roots.add(nodes.dotted(bound))
    return roots | alias_names(module, roots), star


def catches_import_error(statement: cst.Try) -> bool:
    caught = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    for handler in statement.handlers:
        if handler.type is None:
            return True
        types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
        for item in types:
            value = item.value if isinstance(item, cst.Element) else item
            if nodes.dotted(value).rpartition(".")[2] in caught:
                return True
    return False


def only_reads_of(module: cst.Module, name: str, rewritten: set[int]) -> bool:
    """Whether every read of `name` in the module (outside import statements and strings) is
    one the port rewrote (`rewritten`: ids of root Name nodes), so its import is unused after."""
    reads = _OtherReads(name, rewritten)
    visit(module, reads)
    return not reads.found


class _OtherReads(cst.CSTVisitor):
    """Finds a Name `name` outside imports whose id is not in `rewritten`."""

    def __init__(self, name: str, rewritten: set[int]) -> None:
        super().__init__()
        self.name = name
        self.rewritten = rewritten
        self.found = False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name and id(node) not in self.rewritten:
            self.found = True


def used_as_key(node: cst.CSTNode, parent: Parent) -> bool:
    """`{Class: ...}` or `table[Class]`: the class as a lookup key, not as a factory."""
    up = parent(node)
    if isinstance(up, cst.DictElement):
        return up.key is node
    return isinstance(up, cst.Index) and isinstance(parent(parent(up)), cst.Subscript)


def subclass(node: cst.CSTNode, parent: Parent) -> cst.ClassDef | None:
    """The class statement that lists `node` among its bases, if any."""
    arg = parent(node)
    cls = parent(arg) if isinstance(arg, cst.Arg) else None
    return cls if isinstance(cls, cst.ClassDef) and arg in cls.bases else None


def type_checking_only(assignment: BaseAssignment, parent: Parent) -> bool:
    """An import under `if TYPE_CHECKING:`, which never runs."""
    current = parent(getattr(assignment, "node", None))
    while current is not None:
        if isinstance(current, cst.If):
            test = current.test
            name = test.attr.value if isinstance(test, cst.Attribute) else None
            if isinstance(test, cst.Name):
                name = test.value
            return name == "TYPE_CHECKING"
        current = parent(current)
    return False


def inside(node: cst.CSTNode, statements: set[cst.CSTNode], parent: Parent) -> bool:
    """Whether one of `statements` holds `node`."""
    current = parent(node)
    while current is not None and current not in statements:
        current = parent(current)
    return current is not None


def swallowed(statement: cst.CSTNode, parent: Parent) -> bool:
    """Whether `statement` sits in the body of a try whose except catches ImportError."""
    current: cst.CSTNode | None = statement
    while current is not None and not isinstance(current, cst.Module):
        up = parent(current)
        if isinstance(up, cst.Try) and current is up.body and catches_import_error(up):
            return True
        current = up
    return False
