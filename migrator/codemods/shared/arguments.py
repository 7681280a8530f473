"""Argument plumbing shared by the rewrites: bind a call's arguments to a signature, build new ones.

Binding happens on the original call (to decide whether a port is safe); building happens on the
transformed call (so nested rewrites inside an argument survive), by argument position, which no
rewrite changes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import libcst as cst

from migrator.codemods.shared.api import TF_DYNAMIC_DEFAULTS

_NO_SPACE = cst.SimpleWhitespace("")


def bind(
    call: cst.Call,
    params: Sequence[str],
    keywords: Collection[str] | None = None,
    *,
    pass_double_star: bool = False,
) -> dict[str, int] | str:
    """Map each parameter given in `call` to its argument index, or say why that is impossible.

    `params` are taken in order by positional arguments; `keywords` (default: `params`) are the
    names accepted by keyword, for APIs whose positional order is not their whole signature.
    `pass_double_star` leaves `**kwargs` unbound instead of refusing the call, for a port whose
    target takes every keyword the original does.
    """
    accepted = params if keywords is None else keywords
    bound: dict[str, int] = {}
    for index, arg in enumerate(call.args):
        if arg.star == "**" and pass_double_star:
            continue
        if arg.star:
            return f"the call passes {arg.star}-arguments, so its parameters cannot be mapped"
        if arg.keyword is None:
            if index >= len(params):
                return "the call passes more positional arguments than the API accepts"
            bound[params[index]] = index
            continue
        name = arg.keyword.value
        if name not in accepted or name in bound:
            return f"unknown or repeated keyword argument {name!r}"
        bound[name] = index
    return bound


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
    )


def named(arg: cst.Arg, name: str) -> cst.Arg:
    """The same argument passed by keyword `name` (its comma and spacing kept)."""
    return arg.with_changes(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
    )


def renamed(arg: cst.Arg, name: str) -> cst.Arg:
    """The same argument under another keyword (positional arguments stay positional)."""
    if arg.keyword is None:
        return arg
    return arg.with_changes(keyword=cst.Name(name))


def append_keyword(args: Sequence[cst.Arg], name: str, value: cst.BaseExpression) -> list[cst.Arg]:
    """Add `name=value` last, keeping a multi-line call's layout (and its trailing comma)."""
    return append_argument(args, keyword(name, value))


def append_argument(args: Sequence[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """Add `new` last, keeping a multi-line call's layout (and its trailing comma)."""
    if not args:
        return [new]
    out = list(args)
    last = out[-1]
    if isinstance(last.comma, cst.Comma):
        between = (
            out[-2].comma
            if len(out) >= 2 and isinstance(out[-2].comma, cst.Comma)
            else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        out[-1] = last.with_changes(comma=between)
        new = new.with_changes(comma=last.comma)
    elif len(out) >= 2 and _breaks_line(out[-2].comma):
        # One argument per line and no trailing comma: the new one goes on its own line, indented
        # like the others, and the closing bracket keeps the whitespace it had.
        out[-1] = last.with_changes(
            comma=out[-2].comma, whitespace_after_arg=cst.SimpleWhitespace("")
        )
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    elif not _is_blank(last.whitespace_after_arg):
        # `f(\n    a\n)`: the new argument follows `a` on its line; the bracket stays on its own.
        out[-1] = last.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
    return out + [new]


def _is_blank(whitespace: cst.BaseParenthesizableWhitespace) -> bool:
    return isinstance(whitespace, cst.SimpleWhitespace) and not whitespace.value


def replace_argument(args: Sequence[cst.Arg], index: int, new: Sequence[cst.Arg]) -> list[cst.Arg]:
    """`args` with the one at `index` replaced by `new` (none: removed), keeping the separator and
    the whitespace before a closing bracket that the replaced argument carried."""
    out = list(args)
    old = out[index]
    if not new:
        del out[index]
        if out and index == len(out):
            out[-1] = out[-1].with_changes(
                comma=old.comma, whitespace_after_arg=old.whitespace_after_arg
            )
        return out
    spaced = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if index > 0 and _breaks_line(out[index - 1].comma):
        spaced = out[index - 1].comma  # one argument per line: so are the new ones
    placed = [a.with_changes(comma=spaced) for a in new[:-1]]
    placed.append(
        new[-1].with_changes(comma=old.comma, whitespace_after_arg=old.whitespace_after_arg)
    )
    out[index : index + 1] = placed
    return out


def _breaks_line(comma: cst.Comma | cst.MaybeSentinel) -> bool:
    return isinstance(comma, cst.Comma) and isinstance(
        comma.whitespace_after, cst.ParenthesizedWhitespace
    )


def number_value(node: cst.BaseExpression) -> float | None:
    """The value of a plain int/float literal, else None."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    return None


def literal_value(node: cst.BaseExpression) -> float | None:
    """The value of a numeric literal as `is_numeric_literal` accepts it (`0.5`, `-1`,
    `2 ** -4`), computed in floats: None for anything else, or where the arithmetic overflows
    (never a hang on `2 ** 10 ** 10`)."""
    value = number_value(node)
    if value is not None:
        return value
    try:
        if isinstance(node, cst.UnaryOperation) and isinstance(
            node.operator, (cst.Minus, cst.Plus)
        ):
            inner = literal_value(node.expression)
            sign = -1.0 if isinstance(node.operator, cst.Minus) else 1.0
            return None if inner is None else sign * inner
        if isinstance(node, cst.BinaryOperation):
            left, right = literal_value(node.left), literal_value(node.right)
            if left is None or right is None:
                return None
            operations = {
                cst.Add: lambda: left + right,
                cst.Subtract: lambda: left - right,
                cst.Multiply: lambda: left * right,
                cst.Divide: lambda: left / right,
                cst.Power: lambda: left**right,
            }
            compute = operations.get(type(node.operator))
            return None if compute is None else float(compute())
    except (ZeroDivisionError, OverflowError, TypeError, ValueError):
        return None
    return None


def is_numeric_literal(node: cst.BaseExpression) -> bool:
    """A number written out in the source (`128`, `2.0`, `2 ** 15`): safe as a fixed scale."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        return is_numeric_literal(node.expression)
    if isinstance(node, cst.BinaryOperation):
        return is_numeric_literal(node.left) and is_numeric_literal(node.right)
    return False


def string_value(node: cst.BaseExpression) -> str | None:
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def has_call(node: cst.CSTNode) -> bool:
    """Whether evaluating `node` may run user code (so it must not be evaluated twice)."""
    if isinstance(node, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr, cst.Lambda)):
        return True
    return any(has_call(child) for child in node.children)


def reciprocal(multiplier: cst.BaseExpression) -> cst.BaseExpression:
    """`1 / multiplier`, folded to a literal when that literal is exact (2 -> 0.5)."""
    value = number_value(multiplier)
    if value is not None and value != 0:
        inverse = 1.0 / value
        if inverse * value == 1.0 and len(repr(inverse)) <= 8:
            return cst.Float(repr(inverse))
    operand = multiplier.deep_clone()
    simple = (cst.Name, cst.Attribute, cst.Subscript, cst.Integer, cst.Float)
    if not isinstance(operand, simple) and not operand.lpar:
        operand = operand.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(
        left=cst.Integer("1"),
        operator=cst.Divide(),
        right=operand,
    )


def tf_dynamic_arguments(values: dict[str, cst.BaseExpression]) -> list[cst.Arg]:
    """ExponentialUpdateLossScaleManager arguments equal to TF's DynamicLossScale.

    TF divides the scale by `multiplier` on *every* overflow, so the manager must decrease after
    one bad step (decr_every_n_nan_or_inf=1) by exactly 1/multiplier; its own defaults (2 and 0.8)
    would train differently.
    """
    full = {
        name: values.get(name) or cst.parse_expression(default)
        for name, default in TF_DYNAMIC_DEFAULTS.items()
    }
    multiplier = full["multiplier"]
    return [
        keyword("init_loss_scale", full["initial_loss_scale"]),
        keyword("incr_every_n_steps", full["increment_period"]),
        keyword("decr_every_n_nan_or_inf", cst.Integer("1")),
        keyword("incr_ratio", multiplier),
        keyword("decr_ratio", reciprocal(multiplier)),
    ]


def dynamic_manager(name: str) -> cst.Call:
    """The manager equal to TF's `loss_scale="dynamic"` (DynamicLossScale with its defaults)."""
    return cst.Call(func=cst.Name(name), args=tf_dynamic_arguments({}))


def fixed_manager(name: str, value: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name(name), args=[cst.Arg(value=value)])
