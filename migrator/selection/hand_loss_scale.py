"""TensorFlow code that scales its loss by hand, and where to warn that its overflow check fails.

`scaled_loss = total_loss * self.loss_scale`, gradients of that, then `grad * (1. / loss_scale)`
(tensorflow/benchmarks' tf_cnn_benchmarks): no API the port rewrites is named, so the file passed
silently. Its overflow check reads the gradients' values (`tf.reduce_all(tf.is_finite(grads))`),
which on an Ascend NPU in saturation mode never sees an overflow: the overflowed values are clamped
to the fp16 maximum (65504), finite. The finding is the only thing done here; the file is left.

Read with the standard library's `ast` (the tree the triage has just parsed), so the triage can
admit such a file and the pipeline can warn about it without a libcst pass. Precise on purpose:
a loss multiplied by a scale and gradients divided (or multiplied by the reciprocal) by the same
scale, both in one function (or both at module level), or a pair of helpers that do it (StyleGAN's
`apply_loss_scaling(loss)` and `undo_loss_scaling`), in a file that imports TensorFlow. A file
that only checks a loss's finiteness for logging does not qualify, and a file that reads the NPU's
own float status (a vendor hand port) is left alone. The warning sits at the first `is_finite` on
gradients where the file has one, else at the loss multiplication (the check is in another file,
or there is none: then no overflow mode helps, and the message says so).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from migrator import registry
from migrator.findings import Finding
from migrator.sources import pytree

# `loss * scale` or `scale * loss` on one line, a name, a cast or a call around either
# (`loss.float() * scale`, `tf.cast(loss, tf.float32) * loss_scale`), `loss *= scale`, or the
# product called (`tf.multiply(loss, scale)`, `loss.mul(scale)`): the tree decides; this only
# spares the walk on the many training files that spell all three words.
PRODUCT = re.compile(
    rb"loss[^\n*=]{0,40}?\*=?\s*[\w.(]*scale|scale[^\n*=]{0,40}?\*\s*[\w.(]*loss"
    rb"|mul(?:tiply)?_?\([^)]{0,80}?loss[^)]{0,80}?scale|loss\w*\.mul_?\(\s*[\w.(]*scale"
    rb"|scalar_mul\([^)]{0,80}?scale[^)]{0,80}?loss",
    re.IGNORECASE,
)
# A scaling helper pair, StyleGAN's tflib (copied into its forks): `loss =
# self.apply_loss_scaling(loss)`, then `undo_loss_scaling(...)` on what scales the gradients back.
_APPLY_HELPER = re.compile(rb"\bapply_loss_scal")
_UNDO_HELPER = re.compile(rb"\bundo_loss_scal")
_DIVIDES = frozenset({"div", "divide", "truediv", "realdiv", "div_no_nan"})
_MULTIPLIES = frozenset({"multiply", "mul", "mul_", "scalar_mul"})
# Calls that apply a function to each gradient (`tf.nest.map_structure(lambda g: g / s, grads)`).
_MAPS = frozenset({"map_structure", "map"})
_PASS_THROUGH = frozenset({"cast", "convert_to_tensor", "identity", "read_value", "to_float"})
# A tensor's own casts (`loss.float()`, `loss.to(torch.float32)`): the value is the tensor's.
_CAST_METHODS = frozenset({"float", "double", "half", "to", "type"})


def findings(source: bytes, path: str) -> list[Finding]:
    """The warnings for a file that scales its loss by hand: one per class that does (THUMT
    keeps a static scaler with no check beside a dynamic one), else one for the file."""
    return [_finding(path, *found) for found in sites(source)]


def _finding(path: str, line: int, scaled: str, check: str | None) -> Finding:
    start = f"the file scales its loss by hand (`{scaled}`, gradients scaled back); left as it is: "
    if check:
        message = (
            f"{start}its overflow check (`{check}`) finds inf/NaN only and misses overflows an "
            "Ascend NPU in saturation mode clamps to 65504, so an overflowed step is applied; port "
            "it to NPULossScaleOptimizer (or run in INF/NAN mode)"
        )
    else:
        # Without a check here, INF/NAN mode is no remedy unless another file checks: a fixed
        # scale with no check at all (TF's official ResNet run loop) applies inf gradients too.
        message = (
            f"{start}it checks no gradient for overflow itself, so unless another file does, an "
            "overflowed step is applied in either overflow mode, and an overflow check on the "
            "gradients' values (tf.is_finite) finds inf/NaN only and misses overflows an Ascend "
            "NPU in saturation mode clamps to 65504; port it to NPULossScaleOptimizer, which "
            "skips overflowed steps in both modes"
        )
    return Finding(path, line, registry.TF_HAND_LOSS_SCALE, message, "warning")


def might_scale_by_hand(source: bytes) -> bool:
    """False => `site` finds nothing (a byte test, before any parse)."""
    return (
        b"scal" in source  # `scale`, or StyleGAN v1's `apply_loss_scaling` alone
        and b"grad" in source
        and b"loss" in source
        and b"tensorflow" in source
        and b"float_status" not in source  # the NPU's own overflow flags: a vendor hand port
        and (PRODUCT.search(source) is not None or _has_helpers(source))
    )


def _has_helpers(source: bytes) -> bool:
    return _APPLY_HELPER.search(source) is not None and _UNDO_HELPER.search(source) is not None


Site = tuple[int, str, "str | None"]  # line to warn at, the loss multiplication, its check


def sites(source: bytes) -> list[Site]:
    """Where the file scales its loss by hand: one site per class that multiplies a loss (with
    that class's own check where it has one), else one for the file (with the file's first
    check); empty when it does not."""
    if not might_scale_by_hand(source):
        return []
    tree = pytree.tree_or_none(source)
    if tree is None:
        return []
    if not imports_package(tree, "tensorflow"):
        return []
    scaled: list[ast.expr] = [m for scope in pytree.scopes(tree) for m in _scaled_losses(scope)]
    if not scaled and _has_helpers(source):
        scaled = [c for c in (_helper_scaling(tree),) if c is not None]
    if not scaled:
        return []
    checks = sorted(_gradient_checks(tree), key=lambda n: (n.lineno, n.col_offset))
    owner = _owning_classes(tree)
    first: dict[str | None, ast.expr] = {}
    for node in sorted(scaled, key=lambda n: (n.lineno, n.col_offset)):
        first.setdefault(owner.get(id(node)), node)
    if len(first) == 1:
        groups = [(next(iter(first.values())), checks)]
    else:
        groups = [(n, [c for c in checks if owner.get(id(c)) == k]) for k, n in first.items()]
    return [
        (own[0].lineno, ast.unparse(node), ast.unparse(own[0]))
        if own
        else (node.lineno, ast.unparse(node), None)
        for node, own in groups
    ]


def _owning_classes(tree: ast.Module) -> dict[int, str]:
    """id(node) -> the name of the top-level class it sits in."""
    return {
        id(node): statement.name
        for statement in tree.body
        if isinstance(statement, ast.ClassDef)
        for node in ast.walk(statement)
    }


def imports_package(tree: ast.Module, package: str) -> bool:
    """Whether the module imports `package` or one of its modules, anywhere in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[0] == package for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] == package:
                return True
    return False


def _scaled_losses(scope: list[ast.AST]) -> Iterator[ast.AST]:
    """`loss * scale` whose scale the same scope also divides gradients by."""
    return scaled_losses(scope, {name for node in scope for name in _unscaled_by(node)})


def scaled_losses(nodes: list[ast.AST], unscaled: set[str]) -> Iterator[ast.AST]:
    """`loss * scale` (or `loss *= scale`) among `nodes` whose scale is one of the `unscaled`
    names."""
    for node in nodes:
        for loss, scale in products(node):
            name = name_of(scale)
            if is_loss(name_of(loss)) and is_scale(name) and name in unscaled:
                yield node


def products(node: ast.AST) -> Iterator[tuple[ast.expr, ast.expr]]:
    """The (multiplied, multiplier) pairs `node` may be: both ways round for `a * b` and
    `tf.multiply(a, b)` (MLPerf's TF GNMT); the target first for `a *= b` (GNMT's PyTorch
    `loss *= self.loss_scale`), the tensor first for `a.mul(b)`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        yield node.left, node.right
        yield node.right, node.left
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
        yield node.target, node.value
    elif isinstance(node, ast.Call) and callee(node) in _MULTIPLIES:
        if len(node.args) == 2:
            yield node.args[0], node.args[1]
            yield node.args[1], node.args[0]
        elif len(node.args) == 1 and isinstance(node.func, ast.Attribute):
            yield node.func.value, node.args[0]


def _helper_scaling(tree: ast.Module) -> ast.Call | None:
    """`apply_loss_scaling(loss)` where the file also calls an `undo_loss_scaling` helper."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not any(callee(c).startswith("undo_loss_scal") for c in calls):
        return None
    for call in calls:
        if callee(call).startswith("apply_loss_scal") and call.args:
            names = (name_of(n) for n in ast.walk(call.args[0]))
            if any(is_loss(name) for name in names):
                return call
    return None


def _unscaled_by(node: ast.AST) -> Iterator[str]:
    """The scale names a gradient expression is divided by here: `g / s`, `g * (1. / s)`,
    `tf.div(g, s)`, `tf.scalar_mul(1. / s, g)`; a gradient is a name spelling `grad`, or any
    value of a comprehension over one (`[g / s for g in grads]`) or of a function mapped over
    one (`tf.nest.map_structure(lambda g: g / s, grads)`)."""
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        if any(mentions_grad(g.iter) for g in node.generators):
            for inner in ast.walk(node.elt):
                yield from map(name_of, divisions(inner, any_value=True))
        return
    if isinstance(node, ast.Call) and callee(node) in _MAPS and len(node.args) >= 2:
        function, values = node.args[0], node.args[1:]
        if isinstance(function, ast.Lambda) and any(mentions_grad(v) for v in values):
            for inner in ast.walk(function.body):
                yield from map(name_of, divisions(inner, any_value=True))
        return
    yield from map(name_of, divisions(node, any_value=False))


def divisions(node: ast.AST, *, any_value: bool) -> Iterator[ast.expr]:
    """What a gradient is divided by in `node` (the `s` of `g / s`, `g * (1. / s)`, `g /= s`,
    `tf.div(g, s)`); with `any_value`, any value counts as a gradient."""

    def grad(value: ast.AST) -> bool:
        return any_value or mentions_grad(value)

    if isinstance(node, ast.AugAssign) and grad(node.target):
        if isinstance(node.op, ast.Div):
            yield node.value
        elif isinstance(node.op, ast.Mult):
            yield from reciprocals(node.value)
    elif isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Div) and grad(node.left):
            yield node.right
        elif isinstance(node.op, ast.Mult):
            for value, other in ((node.left, node.right), (node.right, node.left)):
                if grad(value):
                    yield from reciprocals(other)
    elif isinstance(node, ast.Call) and callee(node) in _DIVIDES and len(node.args) == 2:
        if grad(node.args[0]):
            yield node.args[1]
    elif isinstance(node, ast.Call) and callee(node) in _MULTIPLIES and len(node.args) == 2:
        # `tf.scalar_mul(1. / s, g)` (NVIDIA's TF ConvNets' FixedLossScalerOptimizer)
        for value, other in (node.args, node.args[::-1]):
            if grad(value):
                yield from reciprocals(other)


def reciprocals(node: ast.AST) -> Iterator[ast.expr]:
    """What `1. / s` (or `tf.math.reciprocal(s)`) divides by, anywhere inside."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Div):
            yield inner.right
        elif isinstance(inner, ast.Call) and callee(inner) == "reciprocal" and inner.args:
            yield inner.args[0]


def _gradient_checks(tree: ast.Module) -> Iterator[ast.Call]:
    """`is_finite(...)` over gradients: its argument spells `grad`, or it is the value of a
    comprehension over them (`[tf.reduce_all(tf.is_finite(g)) for g in grads]`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and callee(node) == "is_finite":
            if any(mentions_grad(a) for a in node.args):
                yield node
        elif isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            if any(mentions_grad(g.iter) for g in node.generators):
                for inner in ast.walk(node.elt):
                    if isinstance(inner, ast.Call) and callee(inner) == "is_finite":
                        yield inner


def callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def name_of(node: ast.AST) -> str:
    """The last name an operand spells: `self.loss_scale` -> loss_scale; a cast or a call
    (`tf.cast(s, ...)`, `loss.float()`, `get_loss_scale()`) by what it reads or calls."""
    while isinstance(node, ast.Call):
        if callee(node) in _PASS_THROUGH and node.args:
            node = node.args[0]
        elif callee(node) in _CAST_METHODS and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return callee(node)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def is_scale(name: str) -> bool:
    lower = name.lower()
    return "scale" in lower and "scaled" not in lower and not lower.endswith("loss")


def is_loss(name: str) -> bool:
    return "loss" in name.lower() and not is_scale(name)


def mentions_grad(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        name = inner.id if isinstance(inner, ast.Name) else getattr(inner, "attr", None)
        if isinstance(name, str) and "grad" in name.lower():
            return True
    return False
