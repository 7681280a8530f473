"""Facts about a whole module the torch analysis needs: which names the file's torch imports
bind, whether a `try:` swallows an ImportError, whether the port rewrote every read of a name."""

from __future__ import annotations

import libcst as cst

from migrator.codemods.shared import nodes
from migrator.codemods.torch import names


def torch_roots(module: cst.Module) -> tuple[set[str], bool]:
    """Names bound by imports of torch or torch-npu anywhere in the module, and whether one of
    them is a star import (which binds names nobody can list)."""
    roots: set[str] = set()
    star = False
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
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
        elif isinstance(node, cst.SimpleStatementLine):
            stack.extend(node.body)
        elif not isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)):
            stack.extend(node.children)  # statements, blocks, handlers: not expressions
    return roots, star


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
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            continue
        if isinstance(node, cst.Name) and node.value == name and id(node) not in rewritten:
            return False
        stack.extend(node.children)
    return True
