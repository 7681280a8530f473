"""Which name each ported reference gets, and where the npu_lossscale.torch import goes.

A reference keeps its shape: a dotted one (`torch.cuda.amp.GradScaler`, `amp.GradScaler`)
becomes `npu_lossscale.torch.GradScaler` with `import npu_lossscale.torch`; a bare name bound by
`from ... import GradScaler [as Scaler]` keeps its name, imported from npu_lossscale.torch, when
the port drops the torch import that bound it (otherwise it becomes `NPUGradScaler`). The import
goes right after the statement that imported the torch name the reference started from, in the
same block, so a function-local import stays local, and it takes that statement's place when the
port removes the statement whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment, Scope

from migrator.codemods.torch import names

if TYPE_CHECKING:
    from migrator.codemods.torch.analysis import TorchPlan

Parent = Callable[[cst.CSTNode], "cst.CSTNode | None"]


@dataclasses.dataclass(frozen=True)
class ImportSite:
    """A rewritten reference, the import binding its root name, and the scope it is read in."""

    node: cst.Name | cst.Attribute
    call: cst.Call | None
    provider: Assignment | None
    scope: Scope | None


class Conflict(Exception):
    """The port cannot name the class or place its import safely; `node` is where."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def plan_imports(
    sites: Sequence[ImportSite],
    plan: TorchPlan,
    removed: set[tuple[int, str]],
    parent: Parent,
) -> list[cst.SimpleStatementLine]:
    """Fill `plan.refs` and `plan.after`; returns the statements imports were placed after.

    `removed` holds (id of import statement, local name) for the bindings the port drops.
    Raises Conflict when a needed name is taken or the import has no block to go in.
    """
    placed: dict[tuple[int, str], tuple[cst.BaseSuite | cst.Module, cst.SimpleStatementLine]] = {}
    for site in sites:
        target, line = _naming(site, removed)
        plan.refs[site.node] = target
        if line is None:
            continue
        statement, block = _home(site, parent)
        key = (id(block), line)
        if key not in placed or _index(block, statement) < _index(block, placed[key][1]):
            placed[key] = (block, statement)
    anchors: dict[cst.SimpleStatementLine, list[str]] = {}
    for (_, line), (_, statement) in placed.items():
        anchors.setdefault(statement, []).append(line)
    for statement, lines in anchors.items():
        plan.after[statement] = sorted(lines)
    return list(anchors)


def _naming(site: ImportSite, removed: set[tuple[int, str]]) -> tuple[str, str | None]:
    """The dotted name the reference becomes, and the import line it needs (None: present)."""
    if isinstance(site.node, cst.Attribute):
        top = names.LIBRARY.split(".")[0]
        bound = _bound(site.scope, top)
        if not bound:
            return names.PORTED, f"import {names.LIBRARY}"
        if all(_imports_library(a) for a in bound):
            return names.PORTED, None
        raise Conflict(site.node, f"the file binds `{top}` to something else")
    local = site.node.value
    provider = site.provider
    if provider is not None and (id(provider.node), local) in removed:
        alias = "" if local == names.CLASS else f" as {local}"
        return local, f"from {names.LIBRARY} import {names.CLASS}{alias}"
    if _bound(site.scope, names.FALLBACK):
        raise Conflict(
            site.node,
            f"`{local}` must stay torch's here and the file binds `{names.FALLBACK}` already",
        )
    return names.FALLBACK, f"from {names.LIBRARY} import {names.CLASS} as {names.FALLBACK}"


def _bound(scope: Scope | None, name: str) -> list[object]:
    if scope is None or name not in scope:
        return []
    return list(scope[name])


def _imports_library(assignment: object) -> bool:
    """`import npu_lossscale.torch`, which makes `npu_lossscale.torch.GradScaler` resolve."""
    node = getattr(assignment, "node", None)
    return isinstance(node, cst.Import) and any(
        cst.Module([]).code_for_node(a.name) == names.LIBRARY and a.asname is None
        for a in node.names
    )


def _home(
    site: ImportSite, parent: Parent
) -> tuple[cst.SimpleStatementLine, cst.BaseSuite | cst.Module]:
    """The statement importing the reference's root name, and the block holding it."""
    provider = site.provider
    node = getattr(provider, "node", None)
    if not isinstance(node, (cst.Import, cst.ImportFrom)):
        raise Conflict(site.node, "the import binding this name cannot be found")
    statement = parent(node)
    block = parent(statement) if statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
        block, (cst.Module, cst.IndentedBlock)
    ):
        raise Conflict(site.node, "its import is not on a line of its own block")
    return statement, block


def _index(block: cst.BaseSuite | cst.Module, statement: cst.CSTNode) -> int:
    body = getattr(block, "body", ())
    return next(i for i, s in enumerate(body) if s is statement)
