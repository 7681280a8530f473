"""Small structural matchers for the expressions a hand-written global-step update is made of.

Kept apart from the analysis so each matcher is one readable rule: what counts as `global_step + 1`,
as an update of the step variable, as a `tf.cond` that only skips non-finite steps.
"""

from __future__ import annotations

import libcst as cst

from migrator.codemods.global_step.names import QualifiedNames, is_tf_function


def name_of(expr: cst.BaseExpression | None) -> str | None:
    return expr.value if isinstance(expr, cst.Name) else None


def positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None and not a.star]


def argument(call: cst.Call, index: int, keyword: str) -> cst.BaseExpression | None:
    """The argument passed at position `index` or as `keyword=`, else None."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    args = positional(call)
    return args[index] if index < len(args) else None


def is_plus_one(expr: cst.BaseExpression, step: str) -> bool:
    """`step + 1` or `1 + step`."""
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Add):
        return False
    pair = (expr.left, expr.right)
    return any(
        name_of(a) == step and isinstance(b, cst.Integer) and b.value == "1"
        for a, b in (pair, pair[::-1])
    )


def lambda_body(expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    if isinstance(expr, cst.Lambda) and not expr.params.params:
        return expr.body
    return None


def update_parts(
    call: cst.Call, qnames: QualifiedNames
) -> tuple[cst.BaseExpression, str, cst.BaseExpression | None] | None:
    """Recognise an update of a variable: (variable as written, "assign" | "assign_add", value).

    Matches `v.assign(x)`, `v.assign_add(x)`, `tf.assign(v, x)` and `tf.assign_add(v, x)`.
    """
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("assign", "assign_add"):
        if not is_tf_function(qnames(func), "assign", "assign_add"):
            return func.value, func.attr.value, argument(call, 0, "value")
    if is_tf_function(qnames(func), "assign", "assign_add"):
        ref = argument(call, 0, "ref")
        if ref is not None:
            leaf = "assign_add" if is_tf_function(qnames(func), "assign_add") else "assign"
            return ref, leaf, argument(call, 1, "value")
    return None


def step_update(
    call: cst.Call, qnames: QualifiedNames
) -> tuple[str, str, cst.BaseExpression | None] | None:
    """`update_parts` for a variable named by a (dotted) name: (name, kind, value)."""
    parts = update_parts(call, qnames)
    if parts is None:
        return None
    target, kind, value = parts
    name = name_of(target)
    return None if name is None else (name, kind, value)


def is_true_constant(expr: cst.BaseExpression, qnames: QualifiedNames) -> bool:
    """`True` or `tf.constant(True, ...)`: the flag a non-fp16 run uses in place of a check."""
    if name_of(expr) == "True":
        return True
    return (
        isinstance(expr, cst.Call)
        and is_tf_function(qnames(expr.func), "constant")
        and name_of(argument(expr, 0, "value")) == "True"
    )
