"""Which name each ported reference gets, and where the npu_lossscale.torch import goes.

A bare name bound by `from ... import GradScaler [as Scaler]` keeps its name: the import that
bound it becomes `from npu_lossscale.torch import GradScaler [as Scaler]` (the line itself when
the port empties it, else the line after). A dotted reference (`torch.cuda.amp.GradScaler`,
`amp.GradScaler`) becomes a bare `GradScaler` where a rebound module-level import of that name
reaches it, so a file ends up with one import of the ported class; otherwise it becomes
`npu_lossscale.torch.GradScaler`, with `import npu_lossscale.torch` after the file's last torch
import ahead of the first use, or after the function-local import it came from (a script that
keeps torch out of module import keeps the port out too). Where the file's own name must stay
torch's (a use the port leaves), the ported class is `NPUGradScaler`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import Assignment, GlobalScope, Scope

from migrator.codemods.shared.nodes import Parent, child_of, code
from migrator.codemods.torch import names
from migrator.codemods.torch.plan import TorchPlan

Block = cst.Module | cst.IndentedBlock


@dataclasses.dataclass(frozen=True)
class ImportSite:
    """A rewritten reference, the import binding its root name, and the scope it is read in."""

    node: cst.Name | cst.Attribute
    call: cst.Call | None
    provider: Assignment | None
    scope: Scope | None
    # the try/except or if/else choosing between torch's scalers that binds the name, if any
    home: cst.BaseStatement | None = None


class Conflict(Exception):
    """The port cannot name the class or place its import safely; `node` is where."""

    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


@dataclasses.dataclass
class _Group:
    """Sites needing one import line in one block: where it may go."""

    block: Block
    provider: int  # index in the block of the earliest providing statement
    first_use: int  # index in the block of the first statement holding a site (module only)


def plan_imports(
    sites: Sequence[ImportSite],
    plan: TorchPlan,
    removed: set[tuple[int, str]],
    parent: Parent,
) -> list[cst.BaseStatement]:
    """Fill `plan.refs` and `plan.after`; returns the statements imports were placed after.

    `removed` holds (id of import statement, local name) for the bindings the port drops.
    Raises Conflict when a needed name is taken or an import has no block to go in.
    """
    rebound = _rebound_names(sites, removed)
    groups: dict[tuple[int, str], _Group] = {}
    for site in sites:
        target, line = _naming(site, removed, rebound, parent)
        plan.refs[site.node] = target
        if line is None:
            continue
        statement, block = _home(site, parent)
        index = _index(block, statement)
        use = _index(block, child_of(site.node, block, parent)) if line.startswith("import") else 0
        group = groups.setdefault((id(block), line), _Group(block, index, use))
        group.provider = min(group.provider, index)
        group.first_use = min(group.first_use, use)
    anchors: dict[cst.BaseStatement, list[str]] = {}
    for (_, line), group in groups.items():
        anchors.setdefault(_anchor(group, line), []).append(line)
    for statement, lines in anchors.items():
        plan.after[statement] = sorted(lines)
    return list(anchors)


def _rebound_names(
    sites: Sequence[ImportSite], removed: set[tuple[int, str]]
) -> dict[str, Assignment]:
    """Module-level names the port binds to the ported class in place of torch's."""
    out: dict[str, Assignment] = {}
    for site in sites:
        provider = site.provider
        if (
            isinstance(site.node, cst.Name)
            and provider is not None
            and isinstance(provider.scope, GlobalScope)
            and (id(provider.node), site.node.value) in removed
        ):
            out.setdefault(site.node.value, provider)
    return out


def _naming(
    site: ImportSite,
    removed: set[tuple[int, str]],
    rebound: dict[str, Assignment],
    parent: Parent,
) -> tuple[str, str | None]:
    """The dotted name the reference becomes, and the import line it needs (None: present)."""
    if isinstance(site.node, cst.Attribute):
        assignment = rebound.get(names.CLASS)
        if assignment is not None and _reaches(site, names.CLASS, assignment, parent):
            return names.CLASS, None
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


def _reaches(site: ImportSite, local: str, assignment: Assignment, parent: Parent) -> bool:
    """Whether `local` means the rebound module-level import at the site, which runs after it."""
    if _bound(site.scope, local) != [assignment]:
        return False
    statement = parent(assignment.node)
    module = parent(statement) if statement is not None else None
    if not isinstance(module, cst.Module) or statement is None:
        return False
    return _index(module, child_of(site.node, module, parent)) > _index(module, statement)


def _bound(scope: Scope | None, name: str) -> list[object]:
    if scope is None or name not in scope:
        return []
    return list(scope[name])


def _imports_library(assignment: object) -> bool:
    """`import npu_lossscale.torch`, which makes `npu_lossscale.torch.GradScaler` resolve."""
    node = getattr(assignment, "node", None)
    return isinstance(node, cst.Import) and any(
        code(a.name) == names.LIBRARY and a.asname is None for a in node.names
    )


def _home(site: ImportSite, parent: Parent) -> tuple[cst.BaseStatement, Block]:
    """The statement importing the reference's root name, and the block holding it."""
    if site.home is not None:
        block = parent(site.home)
        if not isinstance(block, (cst.Module, cst.IndentedBlock)):
            raise Conflict(site.node, "its import is not on a line of its own block")
        return site.home, block
    node = getattr(site.provider, "node", None)
    if not isinstance(node, (cst.Import, cst.ImportFrom)):
        raise Conflict(site.node, "the import binding this name cannot be found")
    statement = parent(node)
    block = parent(statement) if statement is not None else None
    if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
        block, (cst.Module, cst.IndentedBlock)
    ):
        raise Conflict(site.node, "its import is not on a line of its own block")
    return statement, block


def _anchor(group: _Group, line: str) -> cst.BaseStatement:
    """After the providing import; `import npu_lossscale.torch` at module level goes after the
    last torch import before the first use instead, with the file's other torch imports."""
    body = group.block.body
    chosen = group.provider
    if line.startswith("import") and isinstance(group.block, cst.Module):
        for index in range(group.provider, max(group.first_use, group.provider + 1)):
            if _is_torch_import(body[index]):
                chosen = index
    return body[chosen]


def _is_torch_import(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    modules = []
    for small in statement.body:
        if isinstance(small, cst.Import):
            modules += [a.name for a in small.names]
        elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
            modules.append(small.module)
        else:
            return False
    return all(names.is_torch_module(code(m)) for m in modules)


def _index(block: Block, statement: cst.CSTNode | None) -> int:
    return next((i for i, s in enumerate(block.body) if s is statement), -1)
