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
from migrator.codemods.shared.nodes import code
from migrator.codemods.shared.visiting import visit

RULE = registry.TORCH_SCALE_BELOW_ONE
STOCK_FLOOR = "0"  # min_loss_scale that gives torch's own rule


class _Guards(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[cst.Comparison, str]] = []

    def visit_Comparison(self, node: cst.Comparison) -> None:
        sides = [node.left, *(c.comparator for c in node.comparisons)]
        if not any(_reads_scale(side) for side in sides):
            return
        for side in sides:
            number = shared_args.literal_value(side)
            if number is not None and 0 < number < 1:
                self.found.append((node, code(side)))
                return


def _reads_scale(node: cst.BaseExpression) -> bool:
    """`x.get_scale()`, also inside a call around it (`float(scaler.get_scale())`)."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value == "get_scale" and not node.args:
        return True
    return any(_reads_scale(arg.value) for arg in node.args)


def literal_below_one(value: cst.BaseExpression) -> str | None:
    """The code of a numeric literal below 1 (`0.5`, `2 ** -4`), else None."""
    number = shared_args.literal_value(value)
    return code(value) if number is not None and number < 1 else None


def scale_guard(module: cst.Module) -> tuple[cst.Comparison, str] | None:
    """The first comparison of a scaler's scale with a number below 1 (the threshold's code)."""
    guards = _Guards()
    visit(module, guards)  # read-only: no rebuild of the tree
    return guards.found[0] if guards.found else None
