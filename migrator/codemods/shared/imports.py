"""Where the `from npu_lossscale import ...` lines go.

They must bind the names before any rewritten line runs, and they should look like the file's own
imports: right after the top-level import block (merged into an existing import of the same
npu_lossscale module when there is one), or inside a function when TensorFlow itself is only
imported there (such scripts keep TensorFlow out of module import on purpose). The TF1 classes
come from `npu_lossscale`, the Keras one from `npu_lossscale.keras`: one line per module. A
target whose local name is dotted (`npu_lossscale.keras.LossScaleOptimizer`) is reached through
`import npu_lossscale.keras` instead, which is added unless the file has it already.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

import libcst as cst
from libcst.metadata import FunctionScope

from migrator.codemods.shared.api import LIBRARY, target_class, target_module
from migrator.codemods.shared.nodes import Parent, child_of, dotted
from migrator.codemods.shared.plan import Site


@dataclasses.dataclass
class ImportPlan:
    """Statements to add around original statements, and names to merge into existing imports."""

    after: dict[cst.CSTNode, list[cst.SimpleStatementLine]] = dataclasses.field(
        default_factory=dict
    )
    before: dict[cst.CSTNode, list[cst.SimpleStatementLine]] = dataclasses.field(
        default_factory=dict
    )
    merge: dict[cst.ImportFrom, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)


def imported_names(names: Sequence[tuple[str, str]]) -> str:
    """`A, B as C` for (class, local name) pairs, in the order given."""
    return ", ".join(n if n == local else f"{n} as {local}" for n, local in names)


def import_line(names: Sequence[tuple[str, str]], module: str = LIBRARY) -> cst.SimpleStatementLine:
    """`from npu_lossscale import A, B as C` for (class, local name) pairs, sorted by class."""
    listed = imported_names(sorted(set(names)))
    return cst.parse_statement(f"from {module} import {listed}\n")  # type: ignore[return-value]


def _needs(
    targets: Iterable[str], names: Mapping[str, str], imported: Collection[str]
) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """(class, local) pairs to import per npu_lossscale module, and the modules to import whole
    (dotted local names whose module the file does not import yet)."""
    pairs: dict[str, set[tuple[str, str]]] = {}
    modules: set[str] = set()
    for target in targets:
        local = names[target]
        if "." in local:
            owner = local.rpartition(".")[0]
            if owner not in imported:
                modules.add(owner)
            continue
        pairs.setdefault(target_module(target), set()).add((target_class(target), local))
    return {m: sorted(p) for m, p in sorted(pairs.items())}, sorted(modules)


def _lines(
    pairs: Mapping[str, Sequence[tuple[str, str]]], modules: Sequence[str]
) -> list[cst.SimpleStatementLine]:
    lines = [import_line(wanted, owner) for owner, wanted in pairs.items()]
    lines += [cst.parse_statement(f"import {m}\n") for m in modules]  # type: ignore[misc]
    return lines


def _index(block: cst.Module | cst.IndentedBlock, statement: cst.CSTNode | None) -> int:
    return next((i for i, s in enumerate(block.body) if s is statement), -1)


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
    )


def _is_preamble(statement: cst.CSTNode, index: int) -> bool:
    """The docstring and `from __future__` lines, which must stay first."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if (
        index == 0
        and isinstance(small, cst.Expr)
        and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
    ):
        return True
    return (
        isinstance(small, cst.ImportFrom)
        and isinstance(small.module, cst.Name)
        and small.module.value == "__future__"
    )


def plan_imports(
    module: cst.Module,
    sites: Sequence[Site],
    names: Mapping[str, str],
    existing: Sequence[cst.ImportFrom],
    parent: Parent,
    imported: Collection[str] = (),
) -> ImportPlan:
    """Place the imports once per needed scope (module, or functions holding the TF import).

    `existing` are the file's `from npu_lossscale[.keras] import ...` statements, `imported` the
    dotted names its top-level `import npu_lossscale...` statements bind.
    """
    plan = ImportPlan()
    # A file that imports npu_lossscale at the top already has its style: extend that import.
    if not existing and not imported and _function_placement(sites, names, parent, plan):
        return plan
    pairs, modules = _needs({n for site in sites for n in site.targets}, names, imported)
    tops = [_index(module, child_of(site.node, module, parent)) for site in sites]
    first = min(i for i in tops if i >= 0)
    new: dict[str, Sequence[tuple[str, str]]] = {}
    for owner, needed in pairs.items():
        found = _existing_before(module, existing, owner, first, parent)
        if found is None:
            new[owner] = needed
            continue
        have = {
            (a.name.value, a.asname.name.value if a.asname else a.name.value)
            for a in found.names  # type: ignore[union-attr]
            if isinstance(a.name, cst.Name)
        }
        missing = [pair for pair in needed if pair not in have]
        if missing:
            plan.merge[found] = missing
    lines = _lines(new, modules)
    if not lines:
        return plan
    imports = [i for i, s in enumerate(module.body[:first]) if _is_import_line(s)]
    if imports:
        plan.after[module.body[imports[-1]]] = lines
        return plan
    position = 0
    while position < first and _is_preamble(module.body[position], position):
        position += 1
    plan.before[module.body[position]] = lines
    return plan


def _existing_before(
    module: cst.Module,
    existing: Sequence[cst.ImportFrom],
    owner: str,
    first: int,
    parent: Parent,
) -> cst.ImportFrom | None:
    """The first `from <owner> import ...` of the module body above the first rewritten line."""
    for imp in existing:
        index = _index(module, parent(imp))
        if 0 <= index < first and dotted(imp.module) == owner:
            return imp
    return None


def _function_placement(
    sites: Sequence[Site],
    names: Mapping[str, str],
    parent: Parent,
    plan: ImportPlan,
) -> bool:
    """Import inside functions when every providing import is local to a function."""
    per_function: dict[cst.FunctionDef, list[Site]] = {}
    for site in sites:
        scope = site.provider.scope if site.provider is not None else None
        if not isinstance(scope, FunctionScope) or not isinstance(scope.node, cst.FunctionDef):
            return False
        per_function.setdefault(scope.node, []).append(site)
    placed: dict[cst.CSTNode, list[cst.SimpleStatementLine]] = {}
    for function, members in per_function.items():
        body = function.body
        if not isinstance(body, cst.IndentedBlock):
            return False
        anchors = [
            _index(body, child_of(m.provider.node, body, parent))  # type: ignore[union-attr]
            for m in members
        ]
        uses = [_index(body, child_of(m.node, body, parent)) for m in members]
        anchor = min(anchors)
        if anchor < 0 or min(uses) <= anchor:
            return False
        pairs, modules = _needs({n for m in members for n in m.targets}, names, ())
        placed[body.body[anchor]] = _lines(pairs, modules)
    plan.after.update(placed)
    return True
