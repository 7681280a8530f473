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

Framework trainers spread the same steps over methods, classes and files, where no one class
multiplies a loss by the scale it divides the gradients by. The file is then warned where it does
its own loss scaling and checks gradients (or their norm) for inf/NaN itself, with `backward()`
called in it: fairseq's and metaseq's FP16Optimizer (`self.scaler.scale(loss)`, the gradients
multiplied by `1 / loss_scale`, `self.scaler.check_overflow(grad_norm)`), BMTrain's OptimManager
(through module functions), ColossalAI's naive fp16 optimizer (the loss scaled by a mixin in
another file). Megatron's MixedPrecisionOptimizer unscales and checks the gradients with
torch's private fused op, `torch._amp_foreach_non_finite_check_and_unscale_`, the one GradScaler
uses inside: called by hand it is loss scaling wherever `backward()` is.
"""

from __future__ import annotations

import ast
import re
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
_FUSED = "_amp_foreach_non_finite_check_and_unscale_"
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# What a file doing its own loss scaling without `loss * scale` in one line spells: a loss scale
# by name, or a gradient divided by a scale (`p.grad.data.mul_(1.0 / div_scale)`).
_OWN_SCALE = re.compile(
    rb"loss_scale|grad[^\n]{0,60}?(?:/|div_?\()[^\n]{0,30}?scale", re.IGNORECASE
)


def might_scale_by_hand(source: bytes) -> bool:
    """False => `site` finds nothing (a byte test, before any parse)."""
    if b"torch" not in source or b"tensorflow" in source:
        return False  # migrator.selection.hand_loss_scale reads TensorFlow's
    if _FUSED.encode() in source:
        return True
    return (
        b"backward" in source
        and b"grad" in source
        and b"GradScaler" not in source  # the torch port reads those
        and (PRODUCT.search(source) is not None or _OWN_SCALE.search(source) is not None)
    )


def finding(source: bytes, path: str) -> Finding | None:
    """The warning for a file whose class scales its loss by hand, or None."""
    found = site(source)
    if found is None:
        return None
    line, scaled, check, seen, unscales, own = found
    if own:
        start = f"the file does its own loss scaling (`{scaled}`); left as it is: "
    else:
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
    scaled: str  # the loss multiplication (with `own`, what shows the file's own loss scaling)
    check: str | None  # the overflow check, None where there is none
    seen: bool  # whether the check's inf/NaN test is in this file
    unscales: bool  # whether the same class scales the gradients back
    own: bool = False  # no one class multiplies the loss by the scale it divides gradients by


def site(source: bytes) -> Site | None:
    """The first class (or the module's functions) that scales its loss by hand, or None. A call
    of a function named for overflows that the module does not define (pytext's
    `DynamicLossScaler.has_overflow(grad_norm)`, fairseq's) is a check not seen."""
    if not might_scale_by_hand(source):
        return None
    tree = pytree.tree_or_none(source)
    if tree is None:
        return None
    if not imports_package(tree, "torch"):
        return None
    groups = list(_groups(tree))
    backward = any(_backward_in(group) for group in groups)
    found = _by_product(tree, groups) if backward else None
    if found is None:
        found = _fused(groups)
    if found is None and backward:
        found = _own_scaling(tree, groups)
    return found


def _by_product(tree: ast.Module, groups: list[list[ast.AST]]) -> Site | None:
    """The first class (or the module's functions) that multiplies its loss by a scale."""
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
        if not checks:
            # a method of another class of the file holding the test (mlbench's
            # `self.loss_scaler.has_overflow(norm)`, a staticmethod of its DynamicLossScaler)
            methods = _check_helpers(tree, methods=True) if methods is None else methods
            checks = [n for n in group if _overflow(n) and _is_check(n, methods)]
        seen = bool(checks)
        if not seen:
            defined = {n.name for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)}
            checks = [n for n in group if _named_check(n, defined)]
        if checks:
            first = min(checks, key=lambda n: (n.lineno, n.col_offset))
            return Site(first.lineno, ast.unparse(scaled), ast.unparse(first), seen, unscales)
        return Site(scaled.lineno, ast.unparse(scaled), None, True, unscales)
    return None


def _fused(groups: list[list[ast.AST]]) -> Site | None:
    """Megatron's `torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)`:
    shown with the file's loss multiplication where it has one."""
    calls = [n for g in groups for n in g if isinstance(n, ast.Call) and callee(n) == _FUSED]
    if not calls:
        return None
    first = min(calls, key=lambda n: (n.lineno, n.col_offset))
    scaled = next(
        (
            node
            for group in groups
            for node in group
            if any(is_loss(name_of(loss)) and _scales(scale, {}) for loss, scale in products(node))
        ),
        first,
    )
    return Site(first.lineno, ast.unparse(scaled), ast.unparse(first), True, True, own=True)


def _own_scaling(tree: ast.Module, groups: list[list[ast.AST]]) -> Site | None:
    """Loss scaling spread over classes (fairseq's FP16Optimizer and DynamicLossScaler, BMTrain,
    ColossalAI): a loss scale read or a gradient divided by a scale, and gradients (or their
    norm) tested for inf/NaN, anywhere in the file. None where either is missing."""
    nodes = [n for group in groups for n in group]
    divides = _divides(tree)
    shows = [n for n in nodes if _reads_loss_scale(n) or _unscales_by_scale(n, divides)]
    if not shows:
        return None
    evidence = min(shows, key=lambda n: (n.lineno, n.col_offset))
    helpers = _check_helpers(tree) | _check_helpers(tree, methods=True)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)}
    seen = [n for n in nodes if _is_check(n, helpers) and (_on_gradients(n) or _overflow(n))]
    unseen = [n for n in nodes if _named_check(n, defined)]
    checks = seen or unseen
    if not checks:
        return None
    first = min(checks, key=lambda n: (n.lineno, n.col_offset))
    shown = ast.unparse(evidence)
    return Site(first.lineno, shown, ast.unparse(first), bool(seen), True, own=True)


def _reads_loss_scale(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return isinstance(name, str) and "loss_scale" in name.lower()


def _unscales_by_scale(node: ast.AST, divides: dict[str, int]) -> bool:
    """A gradient divided by a scale: in place (`p.grad.data.mul_(1.0 / div_scale)`), or
    through a module function that divides the gradients by one of its parameters (BMTrain's
    `grad_rescale(param_groups, self.loss_scale)`)."""
    if any(_scales(d, {}) for d in _unscaled_by(node)):
        return True
    if isinstance(node, ast.Call) and callee(node) in divides:
        index = divides[callee(node)]
        return index < len(node.args) and bool(_scales(node.args[index], {}))
    return False


def _divides(tree: ast.Module) -> dict[str, int]:
    """The module's functions that divide gradients by one of their parameters, each with the
    position of that parameter."""
    found: dict[str, int] = {}
    for function in tree.body:
        if not isinstance(function, _FUNCTIONS):
            continue
        names = [a.arg for a in function.args.args]
        for node in ast.walk(function):
            for divisor in _unscaled_by(node):
                if isinstance(divisor, ast.Name) and divisor.id in names:
                    found.setdefault(function.name, names.index(divisor.id))
    return found


def _overflow(check: ast.AST) -> bool:
    """A call named for overflows (`check_overflow(optimizer.param_groups)`): whatever it is given,
    it tests what the step applies."""
    return isinstance(check, ast.Call) and "overflow" in callee(check).lower()


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
    kernels = _kernels(tree)
    return kernels | {
        node.name
        for node in functions
        if isinstance(node, _FUNCTIONS) and any(_is_check(n, kernels) for n in ast.walk(node))
    }


def _kernels(tree: ast.Module) -> set[str]:
    """Functions named for an inf/NaN test that the module calls but does not define: a kernel
    (BMTrain's CUDA `has_inf_nan`). One the module defines is read instead (apex's
    `_has_inf_or_nan`): the warning goes to the test inside it."""
    called = {callee(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    defined = {n.name for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)}
    return {name for name in called - defined if "inf" in name.lower() and "nan" in name.lower()}


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
