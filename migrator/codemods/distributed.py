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
    # simple `name = <world-size test>` assignments: name -> the assigned Name node
    size_tests: dict[str, cst.Name] = dataclasses.field(default_factory=dict)

    @property
    def trains_distributed(self) -> bool:
        return self.horovod_imported or self.strategy_used


def is_size_test(expr: cst.BaseExpression, canonical: Canonical) -> bool:
    """`hvd.size() > 1`, `hvd.size() != 1`, `1 < hvd.size()` with `hvd` resolving to Horovod."""
    if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
        return False
    operands = (expr.left, expr.comparisons[0].comparator)
    sizes = [
        o
        for o in operands
        if isinstance(o, cst.Call)
        and not o.args
        and (name := canonical(o.func)) is not None
        and is_horovod_module(name)
        and name.endswith(".size")
    ]
    return len(sizes) == 1


def _conjuncts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


def _enclosing_test(
    node: cst.CSTNode, parent: Parent, canonical: Canonical
) -> tuple[cst.BaseExpression, bool] | None:
    """The nearest enclosing `if` world-size test and whether `node` is in its else branch."""
    child: cst.CSTNode = node
    current = parent(node)
    while current is not None and not isinstance(
        current, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)
    ):
        if isinstance(current, cst.If) and child is not current.test:
            tests = [c for c in _conjuncts(current.test) if is_size_test(c, canonical)]
            if tests:
                in_else = child is current.orelse
                exact = len(tests) == 1 and tests[0] is current.test
                return tests[0], in_else and exact
        child, current = current, parent(current)
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
    found = _enclosing_test(call, parent, canonical)
    if found is not None:
        test, in_else = found
        if in_else:
            return None, "it is built in the single-worker branch of the world-size test"
        code = cst.Module([]).code_for_node(test)
        return test.deep_clone(), f"the enclosing `if` tests the world size ({code})"
    for name, target in facts.size_tests.items():
        if _visible(scope, name, lambda a, t=target: a.node is t):
            return cst.Name(name), f"`{name}` holds the script's world-size test"
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
