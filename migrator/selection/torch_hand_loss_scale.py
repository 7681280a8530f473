"""PyTorch code that scales its loss by hand, and where to warn that its overflow check fails.

THUMT's `LossScalingOptimizer` multiplies the loss by `self._scale` before `backward()`, scales
each gradient back with `grad.mul_(1.0 / self._scale)` in another method, and skips the step where
`torch.isfinite(norm)` fails. No GradScaler is named, so nothing is ported and the file passed
silently, yet on an Ascend NPU in saturation mode an overflow is clamped to 65504, finite, and the
step is applied. The finding is the only thing done here; the file is left. As for TensorFlow
(migrator.selection.hand_loss_scale, whose reading of names this shares), precise on purpose: in
a file that imports torch and calls `backward()`, a class (or the module's functions) multiplying
a loss by a scale it also divides gradients by. The class need not call `backward()` itself: a
scaler class hands the scaled loss back to the optimizer class that does (pytext's
`DynamicLossScaler.upscale`). Nor need it divide the gradients where it calls `backward()` on the
scaled loss and tests the gradients for inf/NaN (apex's fp16_utils `DynamicLossScaler`, whose
FP16_Optimizer divides them in another file). Read with `ast`, no libcst pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import NamedTuple

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
    products,
    reciprocals,
)
from migrator.sources import pytree

_IN_PLACE_MULTIPLY = frozenset({"mul_", "mul"})
_IN_PLACE_DIVIDE = frozenset({"div_", "div", "true_divide"})
_CHECKS = frozenset({"isfinite", "isinf", "isnan"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


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
    line, scaled, check, seen, unscales = found
    back = "gradients scaled back" if unscales else "another class scales the gradients back"
    start = f"the file scales its loss by hand (`{scaled}`, {back}); left as it is: "
    if check and not seen:
        message = (
            f"{start}its overflow check (`{check}`) is defined in another module: if it looks for "
            "inf/NaN only, as most do, it misses overflows an Ascend NPU in saturation mode clamps "
            "to 65504, and an overflowed step is applied; port it to "
            "npu_lossscale.torch.GradScaler (or run in INF/NAN mode)"
        )
    elif check:
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


class Site(NamedTuple):
    """Where and how a class (or the module's functions) scales its loss by hand."""

    line: int  # where to warn: the check, else the loss multiplication
    scaled: str  # the loss multiplication
    check: str | None  # the overflow check, None where there is none
    seen: bool  # whether the check's inf/NaN test is in this file
    unscales: bool  # whether the same class scales the gradients back


def site(source: bytes) -> Site | None:
    """The first class (or the module's functions) that scales its loss by hand, or None. A call
    of a function named for overflows that the module does not define (pytext's
    `DynamicLossScaler.has_overflow(grad_norm)`, fairseq's) is a check not seen."""
    if not might_scale_by_hand(source):
        return None
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not imports_package(tree, "torch"):
        return None
    groups = list(_groups(tree))
    if not any(_backward_in(group) for group in groups):
        return None
    helpers: set[str] | None = None  # computed once a group may scale its loss
    methods: set[str] | None = None  # once a group may leave the gradients to another class
    for group in groups:
        aliases = _aliases(group)
        divisors = [d for node in group for d in _unscaled_by(node)]
        unscaled = {name for divisor in divisors for name in _scales(divisor, aliases)}
        scaled = next(_scaled_losses(group, unscaled, aliases), None)
        if scaled is None and not _backward_in(group):
            continue
        helpers = _check_helpers(tree) if helpers is None else helpers
        unscales = scaled is not None
        if scaled is None:
            methods = _check_helpers(tree, methods=True) if methods is None else methods
            scaled = _scaled_for_another(group, aliases, methods)
            if scaled is None:
                continue
        checks = [n for n in group if _is_check(n, helpers)]
        seen = bool(checks)
        if not seen:
            defined = {n.name for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)}
            checks = [n for n in group if _named_check(n, defined)]
        if checks:
            first = min(checks, key=lambda n: (n.lineno, n.col_offset))
            return Site(first.lineno, ast.unparse(scaled), ast.unparse(first), seen, unscales)
        return Site(scaled.lineno, ast.unparse(scaled), None, True, unscales)
    return None


def _backward_in(group: list[ast.AST]) -> bool:
    return any(isinstance(n, ast.Call) and callee(n) == "backward" for n in group)


def _scaled_for_another(
    group: list[ast.AST], aliases: dict[str, set[str]], helpers: set[str]
) -> ast.AST | None:
    """`loss * scale` in a class that calls backward() and tests the gradients for inf/NaN, but
    leaves scaling them back to another class: apex's fp16_utils `DynamicLossScaler`, which GLM,
    sentiment-discovery and Megatron's first forks copy beside the FP16_Optimizer that divides
    the gradients (in another file). None for anything else."""
    if not any(_is_check(n, helpers) and _on_gradients(n) for n in group):
        return None
    for node in group:
        for loss, scale in products(node):
            if is_loss(name_of(loss)) and _scales(scale, aliases):
                return node
    return None


def _on_gradients(check: ast.AST) -> bool:
    """Whether an inf/NaN test reads gradients (`_has_inf_or_nan(p.grad.data)`)."""
    values = check.args if isinstance(check, ast.Call) else [check]
    return any(mentions_grad(value) for value in values)


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
) -> Iterator[ast.AST]:
    """`loss * scale` (or `loss *= scale`) where the scale shares a name with what the
    gradients are divided by."""
    for node in group:
        for loss, scale in products(node):
            if is_loss(name_of(loss)) and _scales(scale, aliases) & unscaled:
                yield node
                break


def _check_helpers(tree: ast.Module, *, methods: bool = False) -> set[str]:
    """The module's functions that test a value for inf/NaN (`has_overflow(norm)`): a call to
    one is the class's overflow check. With `methods`, the classes' methods too (apex's
    `DynamicLossScaler._has_inf_or_nan(x)`); not where a check is looked for to warn at: a call of
    a method holding one (`self.optimize_fp16()`) says less than the test inside it."""
    functions = ast.walk(tree) if methods else tree.body
    return {
        node.name
        for node in functions
        if isinstance(node, _FUNCTIONS) and any(_is_check(n, set()) for n in ast.walk(node))
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


def _named_check(node: ast.AST, defined: set[str]) -> bool:
    """A call of a function named for overflows (`has_overflow(norm)`) that the module does not
    define: its test is elsewhere."""
    if not isinstance(node, ast.Call):
        return False
    name = callee(node)
    return "overflow" in name.lower() and name not in defined


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
