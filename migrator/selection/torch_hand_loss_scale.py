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
    is_loss,
    is_scale,
    mentions_grad,
    name_of,
    reciprocals,
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
        aliases = _aliases(group)
        divisors = [d for node in group for d in _unscaled_by(node)]
        unscaled = {name for divisor in divisors for name in _scales(divisor, aliases)}
        scaled = next(_scaled_losses(group, unscaled, aliases), None)
        if scaled is None:
            continue
        helpers = _check_helpers(tree)  # only for the one group that scales its loss
        checks = [n for n in group if _is_check(n, helpers)]
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


def _unscaled_by(node: ast.AST) -> Iterator[ast.expr]:
    """What a gradient is divided by: TensorFlow's spellings (`g / s`, `g * (1 / s)`) and
    torch's in-place ones, `grad.mul_(1.0 / s)`, `p.grad.div_(s)`."""
    yield from divisions(node, any_value=False)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if mentions_grad(node.func.value):
            if node.func.attr in _IN_PLACE_MULTIPLY:
                yield from reciprocals(node.args[0])
            elif node.func.attr in _IN_PLACE_DIVIDE:
                yield node.args[0]


def _scales(value: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    """The scale names an operand spells anywhere in it, and those of the local names it reads
    that were assigned one: the same scale reaches the loss and the gradients under different
    spellings (`loss_scale = 2 ** self.lg_loss_scale` for the loss, `2 ** self.lg_loss_scale`
    again for the gradients; `scale = self.scale`)."""
    found: set[str] = set()
    for inner in ast.walk(value):
        if isinstance(inner, ast.Name):
            found |= aliases.get(inner.id, set())
            name = inner.id
        elif isinstance(inner, ast.Attribute):
            name = inner.attr
        else:
            continue
        if is_scale(name):
            found.add(name)
    return found


def _aliases(group: list[ast.AST]) -> dict[str, set[str]]:
    """Each name assigned alone (`name = value`) to the scale names its values spell."""
    aliases: dict[str, set[str]] = {}
    for node in group:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                aliases.setdefault(target.id, set()).update(_scales(node.value, {}))
    return aliases


def _scaled_losses(
    group: list[ast.AST], unscaled: set[str], aliases: dict[str, set[str]]
) -> Iterator[ast.BinOp]:
    """`loss * scale` where the scale shares a name with what the gradients are divided by."""
    for node in group:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for loss, scale in ((node.left, node.right), (node.right, node.left)):
                if is_loss(name_of(loss)) and _scales(scale, aliases) & unscaled:
                    yield node
                    break


def _check_helpers(tree: ast.Module) -> set[str]:
    """The module's functions that test a value for inf/NaN (`has_overflow(norm)`): a call to
    one is the class's overflow check."""
    return {
        statement.name
        for statement in tree.body
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(_is_check(node, set()) for node in ast.walk(statement))
    }


def _is_check(node: ast.AST, helpers: set[str]) -> bool:
    """An inf/NaN test: torch's (`torch.isfinite(x)`), a helper's call, a value compared with
    itself (`x != x`, NaN) or with an infinity (`x == float("inf")`)."""
    if isinstance(node, ast.Call):
        return callee(node) in _CHECKS or callee(node) in helpers
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return False
    left, right = node.left, node.comparators[0]
    if isinstance(node.ops[0], (ast.Eq, ast.NotEq)) and ast.dump(left) == ast.dump(right):
        return True
    return _is_infinity(left) or _is_infinity(right)


def _is_infinity(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Attribute):
        return node.attr == "inf"  # math.inf, torch.inf, np.inf
    return (
        isinstance(node, ast.Call)
        and callee(node) == "float"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value).strip().lower().lstrip("+-") in {"inf", "infinity"}
    )
