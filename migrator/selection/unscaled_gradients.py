"""Gradients from `tf.gradients(loss, ...)` fed to a loss-scale optimizer's `apply_gradients`.

TF's loss-scale optimizers (tf.contrib's, `MixedPrecisionLossScaleOptimizer`, the one
`enable_mixed_precision_graph_rewrite` returns) and ours scale the loss in `compute_gradients`
(and `minimize`) only; `apply_gradients` takes its gradients as unscaled and decides the overflow.
A script that wraps its optimizer and then takes `tf.gradients` of the plain loss (a BERT fork's
`create_optimizer` under the graph rewrite) never scales its loss: the port keeps that faithfully
and the fp16 gradients still underflow, with nothing said. This finds that shape so the report
says it; the file is not changed (`--add-loss-scale` rewires such gradients for an optimizer it
wraps itself, an existing wrapper is the script's own choice).

Read with the standard library's `ast` from the user's own bytes, precise on purpose: in one
function (or at module level), a name bound to such a wrapper's call, a name bound to
`<module>.gradients(...)` (or to a value holding such a call: `list(zip(tf.gradients(...), v))`),
and that wrapper's `apply_gradients` called with the gradients or a value computed from them
(clipped, zipped) after they were taken, or with such a call inside its arguments.
"""

from __future__ import annotations

import ast

from migrator import registry
from migrator.findings import Finding
from migrator.sources import pytree

# The wrappers whose loss scaling lives in compute_gradients: the last name the call spells, with
# the text the callee must also contain (Keras's LossScaleOptimizer scales in neither method).
_WRAPPERS = {
    "LossScaleOptimizer": "contrib",
    "MixedPrecisionLossScaleOptimizer": "",
    "enable_mixed_precision_graph_rewrite": "",
    "NPULossScaleOptimizer": "",
}


def finding(source: bytes, path: str) -> Finding | None:
    """The warning for the first such `tf.gradients` call, or None."""
    if b"apply_gradients" not in source or b".gradients(" not in source:
        return None
    if not any(name.encode() in source for name in _WRAPPERS):
        return None
    tree = pytree.tree_or_none(source)
    if tree is None:
        return None
    contrib = _contrib_names(tree)
    for scope in pytree.scopes(tree):
        found = _unscaled(scope, contrib)
        if found is not None:
            call, optimizer = found
            return Finding(
                path,
                call.lineno,
                registry.TF_UNSCALED_GRADIENTS,
                f"`{ast.unparse(call)}` feeds `{optimizer}.apply_gradients`, so the loss is never "
                "scaled (as in the original: a loss-scale optimizer scales it in "
                "compute_gradients and minimize only) and fp16 gradients can still underflow; "
                f"steps with inf/NaN gradients are still skipped. Take them from "
                f"`{optimizer}.compute_gradients` to scale the loss",
                "warning",
            )
    return None


def _contrib_names(tree: ast.Module) -> set[str]:
    """Names bound by `from tensorflow.contrib.mixed_precision import LossScaleOptimizer [as X]`."""
    names = set()
    for node in ast.walk(tree):
        module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
        if module.startswith("tensorflow.contrib"):
            names |= {a.asname or a.name for a in node.names if a.name == "LossScaleOptimizer"}
    return names


def _unscaled(scope: list[ast.AST], contrib: set[str]) -> tuple[ast.Call, str] | None:
    assigns = sorted(
        (n for n in scope if isinstance(n, ast.Assign)), key=lambda n: (n.lineno, n.col_offset)
    )
    wrappers = [a for a in assigns if _is_wrapper(a.value, contrib)]
    wrapped = {t for a in wrappers for t in _targets(a)}
    if not wrapped:
        return None
    # `grads = tf.gradients(...)`, or taken inside the value (`list(zip(tf.gradients(...), v))`)
    gradients = [(a, call) for a in assigns if (call := _gradients_in(a.value)) is not None]
    branches = _branches(scope)
    applies = [
        node
        for node in scope
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "apply_gradients"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in wrapped
    ]
    found: list[tuple[ast.Call, str]] = []  # (the tf.gradients call, the optimizer it feeds)
    for apply in applies:
        optimizer = apply.func.value.id  # type: ignore[attr-defined]
        wrapped_here = [w for w in wrappers if optimizer in _targets(w)]
        inline = _gradients_in(apply)  # `opt.apply_gradients(zip(tf.gradients(...), v))`
        if inline is not None and not all(_exclusive(branches, w, apply) for w in wrapped_here):
            found.append((inline, optimizer))
        for assign, call in gradients:
            if apply.lineno <= assign.lineno:
                continue
            if all(_exclusive(branches, wrapper, assign) for wrapper in wrapped_here):
                continue  # wrapped only in the other branch of an `if`: the plain optimizer
            derived = _derived(assign, [a for a in assigns if a.lineno < apply.lineno])
            if any(_names(a) & derived for a in [*apply.args, *apply.keywords]):
                found.append((call, optimizer))
                break
    # The first such call in the file's order (`finding` warns once, there), whichever
    # apply_gradients it feeds; min keeps the first apply among equals.
    return min(found, key=lambda item: (item[0].lineno, item[0].col_offset), default=None)


def _gradients_in(node: ast.AST) -> ast.Call | None:
    """The first `tf.gradients(...)` call in `node` whose loss the script does not scale."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and _is_tf_gradients(inner) and not _scaled_by_hand(inner):
            return inner
    return None


def _derived(gradients: ast.Assign, before: list[ast.Assign]) -> set[str]:
    """Names holding the gradients, or values computed from them (clipped, zipped), at a later
    line: a name bound again to something else (`grads = opt.compute_gradients(...)`) drops out.
    Line order only, so a rebinding in one branch of an `if` drops it for both: the check
    prefers saying nothing to a false alarm."""
    derived = set(_targets(gradients))
    for later in before:
        if later.lineno <= gradients.lineno:
            continue
        if _names(later.value) & derived:
            derived |= set(_targets(later))
        else:
            derived -= set(_targets(later))
    return derived


def _scaled_by_hand(call: ast.Call) -> bool:
    """`tf.gradients(loss * scale, ...)`: the script scales the loss itself."""
    loss = call.args[0] if call.args else None
    return isinstance(loss, ast.BinOp) and isinstance(loss.op, ast.Mult)


Branches = dict[int, set[tuple[int, bool]]]


def _branches(scope: list[ast.AST]) -> Branches:
    """For each node of the scope (by id), the `if` statements it sits in: (the if's id, whether
    in its else)."""
    found: Branches = {}
    for node in scope:
        if isinstance(node, ast.If):
            for in_else, block in ((False, node.body), (True, node.orelse)):
                for statement in block:
                    for inner in ast.walk(statement):
                        found.setdefault(id(inner), set()).add((id(node), in_else))
    return found


def _exclusive(branches: Branches, a: ast.AST, b: ast.AST) -> bool:
    """Whether `a` and `b` sit in different branches of one `if`, so never run together."""
    here, there = branches.get(id(a), set()), branches.get(id(b), set())
    return any((statement, not in_else) in there for statement, in_else in here)


def _is_wrapper(value: ast.AST, contrib: set[str]) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if isinstance(func, ast.Name) and last in contrib:
        return True
    return last in _WRAPPERS and _WRAPPERS[last] in ast.unparse(func)


def _is_tf_gradients(call: ast.Call) -> bool:
    """`tf.gradients(...)` (any module alias), not an optimizer's `compute_gradients`."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "gradients"
        and (
            isinstance(func.value, ast.Name)
            and func.value.id in ("tf", "tensorflow", "tf1", "v1")
            or isinstance(func.value, ast.Attribute)
            and ast.unparse(func.value).startswith("tf")
        )
    )


def _targets(assign: ast.Assign) -> list[str]:
    return [n.id for t in assign.targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
