"""The vendor's restriction: a dynamic loss-scale manager must not be built under
`tf.control_dependencies()` (its variables and update ops would get control inputs and run out of
the intended order). We move the construction just before the `with` only when that provably
computes the same value: a plain `name = Manager(...)` directly in the block, whose arguments use
no name bound inside the block and whose target is not touched earlier in it.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import Scope

from migrator import registry
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import Parent

Canonical = Callable[[cst.CSTNode], "str | None"]
ScopeOf = Callable[[cst.CSTNode], "Scope | None"]

_BOUNDARIES = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)


def _is_control_deps(with_node: cst.With, canonical: Canonical) -> bool:
    for item in with_node.items:
        call = item.item
        if not isinstance(call, cst.Call):
            continue
        name = canonical(call.func)
        if (
            name is not None
            and name.startswith("tensorflow")
            and name.endswith(".control_dependencies")
        ):
            return True
        # `graph.control_dependencies(...)`: a method on a Graph object we cannot resolve by scope.
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "control_dependencies":
            return True
    return False


def _ancestors(node: cst.CSTNode, parent: Parent) -> list[cst.CSTNode]:
    out = []
    current = parent(node)
    while current is not None:
        out.append(current)
        if isinstance(current, _BOUNDARIES):
            break
        current = parent(current)
    return out


def _inside(node: cst.CSTNode, container: cst.CSTNode, parent: Parent) -> bool:
    current: cst.CSTNode | None = node
    while current is not None:
        if current is container:
            return True
        current = parent(current)
    return False


def _names(node: cst.CSTNode) -> list[cst.Name]:
    found = [node] if isinstance(node, cst.Name) else []
    for child in node.children:
        found.extend(_names(child))
    return found


def control_deps_decision(
    call: cst.Call, *, parent: Parent, canonical: Canonical, scope: ScopeOf
) -> tuple[cst.With, cst.SimpleStatementLine | None, str] | None:
    """None when `call` is not under control_dependencies; else the `with`, the statement that
    can move before it (None when moving is not provably safe) and why it cannot."""
    chain = _ancestors(call, parent)
    withs = [
        n
        for n in chain
        if isinstance(n, cst.With)
        and _is_control_deps(n, canonical)
        and _inside(call, n.body, parent)
    ]
    if not withs:
        return None
    block = withs[0]
    if len(withs) > 1:
        return block, None, "it is nested in several control_dependencies blocks"
    if len(block.items) > 1:
        # Moving it before the `with` would also take it out of the scopes or device entered
        # there (`with tf.variable_scope("fp16"), tf.control_dependencies(deps):`).
        return block, None, "the same `with` also enters other contexts it must stay in"
    assign = parent(call)
    line = parent(assign) if assign is not None else None
    body = parent(line) if line is not None else None
    if not (
        isinstance(assign, cst.Assign)
        and assign.value is call
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and body is block.body
    ):
        return (
            block,
            None,
            "it is not a plain `name = Manager(...)` statement directly in the block",
        )
    for name in _names(call):
        name_scope = scope(name)
        if name_scope is None:
            continue
        for access in name_scope.accesses:
            if access.node is name and any(
                _inside(r.node, block, parent) for r in access.referents
            ):
                return block, None, f"its arguments use `{name.value}`, bound inside the block"
    target = assign.targets[0].target.value
    statements = list(block.body.body)
    position = next(i for i, s in enumerate(statements) if s is line)
    earlier = [*block.items, *statements[:position]]
    if any(n.value == target for node in earlier for n in _names(node)):
        return block, None, f"`{target}` is used in the block before the manager is built"
    return block, line, ""


def plan_control_deps(file: FileContext, call: cst.Call, *, movable: bool) -> None:
    """Hoist a dynamic manager built under tf.control_dependencies() out of the `with` where
    `movable` and the move is provably the same; warn where it stays."""
    decision = control_deps_decision(
        call, parent=file.parent, canonical=file.canonical, scope=file.scope
    )
    if decision is None:
        return
    with_node, statement, reason = decision
    if statement is not None and movable:
        file.edits.hoists[with_node] = statement
        file.change(
            call,
            registry.MANAGER_IN_CONTROL_DEPS,
            f"the dynamic loss-scale manager moved out of the `with` block at line "
            f"{file.line(with_node)}: the NPU manager must not be built under "
            "tf.control_dependencies()",
        )
        return
    file.warn(
        call,
        registry.MANAGER_IN_CONTROL_DEPS,
        "a dynamic loss-scale manager is built inside tf.control_dependencies() (line "
        f"{file.line(with_node)}) and was left there ({reason or 'it is not movable'}): "
        "npu_lossscale's manager runs there as written, the Ascend adapter's does not; move "
        "it out if the script must also run on the adapter",
    )
