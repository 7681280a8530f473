"""Deciding `is_distributed=` for a ported optimizer.

The vendor's rule: distributed training must pass is_distributed=True (so every worker takes the
same skip decision) and single-device training must keep the default False. Where the script
already tests its world size (`if hvd.size() > 1:` or `multi = hvd.size() > 1`), that runtime test
is the right value in both cases, so we reuse it instead of hard-coding True.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import libcst as cst
from libcst.metadata import Assignment, ClassScope, ComprehensionScope, FunctionScope, Scope

from migrator.codemods.api import is_horovod_module

# Attributes only Horovod's module has. A function parameter used with one of them is Horovod
# handed in (NVIDIA's BERT: `create_optimizer(..., hvd=None)`), which no import resolves.
_HOROVOD_ONLY_ATTRIBUTES = frozenset(
    {
        "DistributedOptimizer",
        "DistributedGradientTape",
        "BroadcastGlobalVariablesHook",
        "broadcast_global_variables",
        "allreduce",
        "allgather",
    }
)

Canonical = Callable[[cst.CSTNode], "str | None"]
Parent = Callable[[cst.CSTNode], "cst.CSTNode | None"]


@dataclasses.dataclass
class DistributedFacts:
    """What the file shows about multi-worker training, gathered while walking it."""

    horovod_imported: bool = False
    strategy_used: bool = False
    # names bound by `import horovod... as X` -> the import statement that binds them
    horovod_aliases: dict[str, cst.CSTNode] = dataclasses.field(default_factory=dict)
    # aliases the file calls `X.init()` on (so `X.size()` is usable where the optimizer is built)
    initialised: set[str] = dataclasses.field(default_factory=set)
    # simple `name = <world-size test>` assignments: name -> (the assigned Name node, whether the
    # test holds on several workers rather than on one)
    size_tests: dict[str, tuple[cst.Name, bool]] = dataclasses.field(default_factory=dict)

    @property
    def trains_distributed(self) -> bool:
        return self.horovod_imported or self.strategy_used


# Comparison operators by symbol; a world-size test compares `hvd.size()` with an integer.
_OPERATORS = {
    cst.GreaterThan: ">",
    cst.GreaterThanEqual: ">=",
    cst.LessThan: "<",
    cst.LessThanEqual: "<=",
    cst.Equal: "==",
    cst.NotEqual: "!=",
}
_MIRRORED = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "==": "==", "!=": "!="}
_NEGATED = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
# `hvd.size() <op> k` that hold exactly on several workers, and exactly on one.
_MULTI_WORKER = {(">", 1), (">=", 2), ("!=", 1)}
_SINGLE_WORKER = {("==", 1), ("<", 2), ("<=", 1)}


def size_test_direction(expr: cst.BaseExpression, canonical: Canonical) -> int:
    """1 for a test true exactly on several workers (`hvd.size() > 1`, `1 != hvd.size()`), -1 for
    one true exactly on a single worker (`hvd.size() == 1`, `hvd.size() < 2`), 0 for anything
    else (`hvd.size() > 4` says nothing about its else branch)."""
    if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
        return 0
    target = expr.comparisons[0]
    symbol = _OPERATORS.get(type(target.operator))
    if symbol is None:
        return 0
    if _is_size_call(expr.left, canonical) and isinstance(target.comparator, cst.Integer):
        key = (symbol, target.comparator.evaluated_value)
    elif _is_size_call(target.comparator, canonical) and isinstance(expr.left, cst.Integer):
        key = (_MIRRORED[symbol], expr.left.evaluated_value)
    else:
        return 0
    return 1 if key in _MULTI_WORKER else -1 if key in _SINGLE_WORKER else 0


def _is_size_call(expr: cst.BaseExpression, canonical: Canonical) -> bool:
    if not isinstance(expr, cst.Call) or expr.args:
        return False
    name = canonical(expr.func)
    return name is not None and is_horovod_module(name) and name.endswith(".size")


def _negated(test: cst.Comparison) -> cst.BaseExpression:
    """`hvd.size() != 1` for `hvd.size() == 1`: the multi-worker test, written as a comparison."""
    target = test.comparisons[0]
    symbol = _NEGATED[_OPERATORS[type(target.operator)]]
    return cst.parse_expression(f"{_code(test.left)} {symbol} {_code(target.comparator)}")


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _conjuncts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


Decision = tuple["cst.BaseExpression | None", str]


def _branch_decision(node: cst.CSTNode, parent: Parent, canonical: Canonical) -> Decision | None:
    """The value an enclosing `if` on the world size gives, or None when no `if` decides it."""
    child: cst.CSTNode = node
    current = parent(node)
    while current is not None and not isinstance(
        current, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)
    ):
        if isinstance(current, cst.If) and child is not current.test:
            decision = _decide(current.test, child is current.orelse, canonical)
            if decision is not None:
                return decision
        child, current = current, parent(current)
    return None


def _decide(test: cst.BaseExpression, in_else: bool, canonical: Canonical) -> Decision | None:
    code = _code(test)
    direction = size_test_direction(test, canonical)
    if direction and (direction > 0) == in_else:
        return None, f"it is built in the single-worker branch of `if {code}:`"
    if direction > 0:
        return test.deep_clone(), f"the enclosing `if` tests the world size ({code})"
    if direction < 0:
        assert isinstance(test, cst.Comparison)
        value = _negated(test)
        return value, f"it is built in the multi-worker `else` branch of `if {code}:`"
    # A conjunction (`if use_hvd and hvd.size() > 1:`): in its body every part holds.
    parts = _conjuncts(test)
    directions = [size_test_direction(c, canonical) for c in parts]
    if 1 in directions:
        if in_else:
            return None, f"it is built in the `else` branch of `if {code}:`"
        multi = parts[directions.index(1)]
        return multi.deep_clone(), f"the enclosing `if` tests the world size ({_code(multi)})"
    if -1 in directions and not in_else:
        return None, f"it is built in the single-worker branch of `if {code}:`"
    return None


def _visible(scope: Scope | None, name: str, wanted: Callable[[Assignment], bool]) -> bool:
    if scope is None or name not in scope:
        return False
    assignments = list(scope[name])
    return len(assignments) == 1 and wanted(assignments[0])


def is_distributed_value(
    call: cst.Call,
    facts: DistributedFacts,
    *,
    parent: Parent,
    canonical: Canonical,
    scope: Scope | None,
) -> tuple[cst.BaseExpression | None, str]:
    """The `is_distributed=` value for an optimizer built by `call` (None: leave the default).

    Returns the expression and a human reason for the report.
    """
    decision = _branch_decision(call, parent, canonical)
    if decision is not None:
        return decision
    for name, (target, multi) in facts.size_tests.items():
        if _visible(scope, name, lambda a, t=target: a.node is t):
            if multi:
                return cst.Name(name), f"`{name}` holds the script's world-size test"
            value = cst.parse_expression(f"not {name}")
            return value, f"`{name}` holds the script's single-worker test"
    for alias, statement in facts.horovod_aliases.items():
        bound_here = _visible(scope, alias, lambda a, s=statement: a.node is s)
        if alias in facts.initialised and bound_here:
            expr = cst.parse_expression(f"{alias}.size() > 1")
            return expr, f"the file trains with Horovod ({alias}.size() > 1 at run time)"
    reason = "Horovod" if facts.horovod_imported else "a tf.distribute strategy"
    return cst.Name("True"), f"the file trains with {reason}"


def horovod_parameter(scope: Scope | None, parent: Parent) -> tuple[cst.BaseExpression, str] | None:
    """`is_distributed=` for an optimizer built in a function that is handed Horovod.

    Such a function (NVIDIA's BERT `create_optimizer(..., hvd=None)`) gets None, or Horovod on a
    single worker, when training on one device, so the value is the run-time test
    `hvd is not None and hvd.size() > 1` (`is not None` only where the default is None).
    """
    # Out of comprehensions and class bodies to the function; the global scope ends the search.
    while isinstance(scope, (ComprehensionScope, ClassScope)):
        scope = scope.parent
    if not isinstance(scope, FunctionScope) or not isinstance(scope.node, cst.FunctionDef):
        return None
    params = scope.node.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        name = param.name.value
        assignments = list(scope[name]) if name in scope else []
        if len(assignments) != 1 or assignments[0].node is not param:
            continue
        used = sorted(
            attribute.attr.value
            for access in assignments[0].references
            if isinstance(attribute := parent(access.node), cst.Attribute)
            and attribute.value is access.node
            and attribute.attr.value in _HOROVOD_ONLY_ATTRIBUTES
        )
        if not used:
            continue
        optional = isinstance(param.default, cst.Name) and param.default.value == "None"
        test = f"{name} is not None and {name}.size() > 1" if optional else f"{name}.size() > 1"
        why = f"the parameter `{name}` is used as Horovod (`{name}.{used[0]}`): true at run time"
        return cst.parse_expression(test), f"{why} only on several workers"
    return None
