"""Scripts that rely on the loss scale going below 1, as stock torch lets it.

torch's GradScaler has no floor: a sum-reduced loss that overflows even at scale 1 trains on
below it, and fairseq-style loops stop the run with "minimum loss scale reached" when the scale
falls under a small threshold. npu_lossscale.torch.GradScaler floors at 1 by default (a run
stuck at 0 is silently dead); `min_loss_scale=0` is stock's rule to the last bit. The port keeps
what such a script had by passing it, and says so.
"""

from __future__ import annotations

import libcst as cst

from migrator import registry
from migrator.codemods.shared import arguments as shared_args
from migrator.codemods.shared.nodes import code, last_name
from migrator.codemods.shared.visiting import visit
from migrator.selection.scaler_helpers import ScalerHelper

RULE = registry.TORCH_SCALE_BELOW_ONE
STOCK_FLOOR = "0"  # min_loss_scale that gives torch's own rule


class _Guards(cst.CSTVisitor):
    """Comparisons of the scale with a number in (0, 1), and hand regrowth
    (`scaler.update(cur * 2.0)`); the scale is read directly or through a plain name a read was
    assigned to (icefall: `cur_grad_scale = scaler._scale.item()`, then `cur_grad_scale < 0.01`).
    Names are matched by spelling across the file: an over-reach only adds a warning."""

    def __init__(self) -> None:
        self.held: set[str] = set()  # names assigned a read of the scale
        self.comparisons: list[cst.Comparison] = []
        self.updates: list[cst.Call] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if _reads_scale(node.value, frozenset()):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self.held.add(target.target.value)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self.comparisons.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "update" and len(node.args) == 1:
            self.updates.append(node)

    def first(self) -> tuple[cst.CSTNode, str] | None:
        held = frozenset(self.held)
        for node in self.comparisons:
            sides = [node.left, *(c.comparator for c in node.comparisons)]
            minimum = next((side for side in sides if _names_a_minimum(side)), None)
            if minimum is not None:
                # whatever holds the scale (fairseq reads it through a property of its own)
                return node, (
                    f"checks the scale against a configured minimum ({code(minimum)}; "
                    "fairseq's defaults to 1e-4), which torch's scale may fall below 1 to reach"
                )
            if not any(_reads_scale(side, held) for side in sides):
                continue
            for side in sides:
                number = shared_args.literal_value(side)
                if number is not None and 0 < number < 1:
                    return node, (
                        f"checks the scale against {code(side)}, below 1, where torch's scale "
                        "may go"
                    )
        for call in self.updates:
            if _reads_scale(call.args[0].value, held):
                return call, (
                    f"regrows the scale by hand (`{code(call)}`), as scripts whose scale "
                    "falls below 1 do"
                )
        return None


def _reads_scale(node: cst.BaseExpression, held: frozenset[str]) -> bool:
    """`x.get_scale()`, `x._scale` (`.item()`, `float(...)`), a name in `held`, also inside a
    call or arithmetic around it (`float(scaler.get_scale())`, `cur_grad_scale * 2.0`); a read
    under a conditional expression counts (`s._scale.item() if amp else 1.0`)."""
    if isinstance(node, cst.Name):
        return node.value in held
    if isinstance(node, cst.Attribute):
        # `self._scale` alone is some class's own field, not a scaler's
        is_self = isinstance(node.value, cst.Name) and node.value.value == "self"
        return node.attr.value == "_scale" and not is_self
    if isinstance(node, cst.BinaryOperation):
        return _reads_scale(node.left, held) or _reads_scale(node.right, held)
    if isinstance(node, cst.IfExp):
        return _reads_scale(node.body, held) or _reads_scale(node.orelse, held)
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute) and not node.args:
        if func.attr.value == "get_scale":
            return True
        if func.attr.value == "item":
            return _reads_scale(func.value, held)
    return any(_reads_scale(arg.value, held) for arg in node.args)


def _names_a_minimum(node: cst.BaseExpression) -> bool:
    """`self.min_loss_scale`, `args.min_scale`: a minimum read from the configuration, which
    fairseq-style loops compare the scale with (their default is far below 1); the name says
    what the other side is, however the loop reads it."""
    name = (last_name(node) or "").lower()
    return "min" in name and "scale" in name


def literal_below_one(value: cst.BaseExpression) -> str | None:
    """The code of a numeric literal below 1 (`0.5`, `2 ** -4`), else None."""
    number = shared_args.literal_value(value)
    return code(value) if number is not None and number < 1 else None


def scale_guard(module: cst.Module) -> tuple[cst.CSTNode, str] | None:
    """Where the script first relies on the scale going below 1, and a phrase that says how: a
    comparison of the scale with a number in (0, 1), else a hand regrowth of it."""
    guards = _Guards()
    visit(module, guards)  # read-only: no rebuild of the tree
    return guards.first()


def helper_built(module: cst.Module, helpers: frozenset[ScalerHelper]) -> ScalerHelper | None:
    """The first of `helpers` (functions of other files of the run that build a scaler) that
    this file imports by name (`from icefall.utils import create_grad_scaler`) and calls."""
    local: dict[str, ScalerHelper] = {}
    wanted = {(h.module, h.name): h for h in helpers}
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                continue
            source = code(small.module).rsplit(".", 1)[-1] if small.module else ""
            for alias in small.names:
                helper = wanted.get((source, code(alias.name)))
                if helper is not None:
                    bound = alias.asname.name if alias.asname else alias.name
                    local[code(bound)] = helper
    if not local:
        return None
    calls = _Calls(local)
    visit(module, calls)
    return calls.found


class _Calls(cst.CSTVisitor):
    def __init__(self, local: dict[str, ScalerHelper]) -> None:
        self.local = local
        self.found: ScalerHelper | None = None

    def visit_Call(self, node: cst.Call) -> None:
        if self.found is None and isinstance(node.func, cst.Name):
            self.found = self.local.get(node.func.value)


def built_elsewhere(
    module: cst.Module,
    guard: tuple[cst.CSTNode, str] | None,
    helpers: frozenset[ScalerHelper],
) -> tuple[cst.CSTNode, str] | None:
    """Where to warn (the guard) and what, when the file relies on the scale going below 1 and
    its scaler comes from a helper another file of the run defines: the port of that file cannot
    see the guard, so it leaves the floor at 1."""
    helper = None if guard is None else helper_built(module, helpers)
    if guard is None or helper is None:
        return None
    node, how = guard
    return node, (
        f"the script {how}; the scaler created by {helper.name}() in {helper.path} floors at 1 "
        f"unless min_loss_scale is lowered (the port of that file cannot see this guard): pass "
        f"min_loss_scale={STOCK_FLOOR} to it to keep torch's rule"
    )
