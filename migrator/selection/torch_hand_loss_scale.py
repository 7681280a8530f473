"""PyTorch code that scales its loss by hand, and where to warn that its overflow check fails.

THUMT's `LossScalingOptimizer` multiplies the loss by `self._scale` before `backward()`, scales
each gradient back with `grad.mul_(1.0 / self._scale)` in another method, and skips the step where
`torch.isfinite(norm)` fails. No GradScaler is named, so nothing is ported and the file passed
silently, yet on an Ascend NPU in saturation mode an overflow is clamped to 65504, finite, and the
step is applied. The finding is the only thing done here; the file is left. As for TensorFlow
(migrator.selection.hand_loss_scale, whose reading of names this shares), precise on purpose: in
a file that imports torch, a class (or the module's functions) multiplying a loss by a scale it
also divides gradients by, with a `backward()`. Read with `ast`, no libcst pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from migrator import registry
from migrator.findings import Finding
from migrator.selection.hand_loss_scale import (
    PRODUCT,
    callee,
    divisions,
    imports_package,
    mentions_grad,
    name_of,
    reciprocals,
    scaled_losses,
)
from migrator.sources import pytree

_IN_PLACE_MULTIPLY = frozenset({"mul_", "mul"})
_IN_PLACE_DIVIDE = frozenset({"div_", "div", "true_divide"})
_CHECKS = frozenset({"isfinite", "isinf", "isnan"})


def might_scale_by_hand(source: bytes) -> bool:
    """False => `site` finds nothing (a byte test, before any parse)."""
    return (
        b"torch" in source
        and b"backward" in source
        and b"grad" in source
        and b"tensorflow" not in source  # migrator.selection.hand_loss_scale reads those
        and b"GradScaler" not in source  # the torch port reads those
        and PRODUCT.search(source) is not None
    )


def finding(source: bytes, path: str) -> Finding | None:
    """The warning for a file whose class scales its loss by hand, or None."""
    found = site(source)
    if found is None:
        return None
    line, scaled, check = found
    start = f"the file scales its loss by hand (`{scaled}`, gradients scaled back); left as it is: "
    if check:
        message = (
            f"{start}its overflow check (`{check}`) finds inf/NaN only and misses overflows an "
            "Ascend NPU in saturation mode clamps to 65504, so an overflowed step is applied; port "
            "it to npu_lossscale.torch.GradScaler (or run in INF/NAN mode)"
        )
    else:
        message = (
            f"{start}it checks no gradient for overflow, so an overflowed step is applied in "
            "either overflow mode; port it to npu_lossscale.torch.GradScaler, which skips "
            "overflowed steps in both"
        )
    return Finding(path, line, registry.TORCH_HAND_LOSS_SCALE, message, "warning")


def site(source: bytes) -> tuple[int, str, str | None] | None:
    """(line to warn at, the loss multiplication, the check or None) of the first class (or the
    module's functions) that scales its loss by hand, or None."""
    if not might_scale_by_hand(source):
        return None
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not imports_package(tree, "torch"):
        return None
    for group in _groups(tree):
        if not any(isinstance(n, ast.Call) and callee(n) == "backward" for n in group):
            continue
        unscaled = {name for node in group for name in _unscaled_by(node)}
        scaled = next(scaled_losses(group, unscaled), None)
        if scaled is None:
            continue
        checks = [n for n in group if isinstance(n, ast.Call) and callee(n) in _CHECKS]
        checks.sort(key=lambda n: (n.lineno, n.col_offset))
        if checks:
            return checks[0].lineno, ast.unparse(scaled), ast.unparse(checks[0])
        return scaled.lineno, ast.unparse(scaled), None
    return None


def _groups(tree: ast.Module) -> Iterator[list[ast.AST]]:
    """The nodes of each top-level class (a scaler keeps its scale across its methods), then
    those of everything else in the module."""
    rest = []
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef):
            yield list(ast.walk(statement))
        else:
            rest += list(ast.walk(statement))
    yield rest


def _unscaled_by(node: ast.AST) -> Iterator[str]:
    """The scale names a gradient is divided by: TensorFlow's spellings (`g / s`, `g * (1 / s)`)
    and torch's in-place ones, `grad.mul_(1.0 / s)`, `p.grad.div_(s)`."""
    yield from divisions(node, any_value=False)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if mentions_grad(node.func.value):
            if node.func.attr in _IN_PLACE_MULTIPLY:
                yield from reciprocals(node.args[0])
            elif node.func.attr in _IN_PLACE_DIVIDE:
                yield name_of(node.args[0])
