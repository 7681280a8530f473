"""Deciding `is_distributed=` for a ported optimizer.

The vendor's rule: distributed training must pass is_distributed=True (so every worker takes the
same skip decision) and single-device training must keep the default False. Where the script
already tests its world size (`if hvd.size() > 1:` or `multi = hvd.size() > 1`), that runtime test
is the right value in both cases, so we reuse it instead of hard-coding True.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator

import libcst as cst
from libcst.metadata import Assignment, FunctionScope, GlobalScope, Scope

from migrator.codemods.shared import nodes
from migrator.codemods.shared.api import is_horovod_module
from migrator.codemods.shared.nodes import Parent

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
    # `X.DistributedOptimizer(...)` and `X.init()` calls: where the script turns Horovod on
    wrappers: list[cst.Call] = dataclasses.field(default_factory=list)
    init_calls: list[cst.Call] = dataclasses.field(default_factory=list)
    # names bound to the tensorflow module (`import tensorflow.compat.v1 as tf`) -> the import
    tensorflow_aliases: dict[str, cst.CSTNode] = dataclasses.field(default_factory=dict)
    # module-level names assigned None; a Horovod alias among them (`try: import ... as hvd` /
    # `except ImportError: hvd = None`) is Horovod only where the import succeeded
    optional_horovod: set[str] = dataclasses.field(default_factory=set)
    # names bound to Horovod by a lazy-import helper (`hvd = LazyImport("horovod.tensorflow")`)
    lazy_horovod: set[str] = dataclasses.field(default_factory=set)
    # BytePS's `bps.DistributedOptimizer(...)`: workers the library cannot sum the flag over
    byteps_wrappers: list[cst.Call] = dataclasses.field(default_factory=list)

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
    return cst.parse_expression(f"{nodes.code(test.left)} {symbol} {nodes.code(target.comparator)}")


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
    code = nodes.code(test)
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
        return multi.deep_clone(), f"the enclosing `if` tests the world size ({nodes.code(multi)})"
    if -1 in directions and not in_else:
        return None, f"it is built in the single-worker branch of `if {code}:`"
    return None


def _visible(
    scope: Scope | None,
    name: str,
    wanted: Callable[[Assignment], bool],
    ignored: Callable[[Assignment], bool] = lambda a: False,
) -> bool:
    """Whether `name` is bound once where the optimizer is built, by the `wanted` binding (the
    `ignored` bindings aside)."""
    if scope is None or name not in scope:
        return False
    assignments = [a for a in scope[name] if not ignored(a)]
    return len(assignments) == 1 and wanted(assignments[0])


def _binds_none(assignment: Assignment, parent: Parent) -> bool:
    """`hvd = None`: the fallback of an optional import (`except ImportError:`)."""
    target = parent(assignment.node)
    statement = parent(target) if isinstance(target, cst.AssignTarget) else None
    return (
        isinstance(statement, cst.Assign)
        and isinstance(statement.value, cst.Name)
        and statement.value.value == "None"
    )


def _enclosing_function(node: cst.CSTNode, parent: Parent) -> cst.CSTNode | None:
    current = parent(node)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
        current = parent(current)
    return current


def _guards(node: cst.CSTNode, parent: Parent) -> list[tuple[cst.If, bool]]:
    """The `if` statements around ``node`` up to its function: (statement, in its else)."""
    guards = []
    child: cst.CSTNode = node
    current = parent(node)
    while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
        if isinstance(current, cst.If) and child is not current.test:
            guards.append((current, child is current.orelse))
        child, current = current, parent(current)
    return guards


def _condition(
    guards: list[tuple[cst.If, bool]], keep: Callable[[cst.BaseExpression], bool] = lambda c: True
) -> cst.BaseExpression:
    """The guards as one expression a reader recognises: `a and not (b)`; of a guard's
    conjunction only the parts `keep` accepts (all of them where it accepts none)."""
    parts = []
    for statement, in_else in reversed(guards):
        test = statement.test.deep_clone()
        conjuncts = _conjuncts(test)
        kept = [c for c in conjuncts if keep(c)]
        if not in_else and kept and len(kept) < len(conjuncts):
            test = kept[0]
            for part in kept[1:]:
                test = cst.BooleanOperation(test, cst.And(), part)
        if in_else:
            text = nodes.code(test)
            simple = isinstance(test, (cst.Name, cst.Attribute, cst.Call))
            test = cst.parse_expression(f"not {text}" if simple else f"not ({text})")
        elif isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        parts.append(test)
    expr = parts[0]
    for part in parts[1:]:
        expr = cst.BooleanOperation(expr, cst.And(), part)
    return expr


def _not_about_accumulation(conjunct: cst.BaseExpression) -> bool:
    """Whether a part of the wrapper's guard is not about gradient accumulation.

    Habana's BERT wraps under `horovod_enabled() and (num_accumulation_steps == 1 or ...)`: with
    accumulation the script all-reduces the summed gradients itself, yet the workers are just as
    many, and in saturation mode each one's overflow status is its own device's, so the flag must
    still be summed over them. Only the part that says whether Horovod runs is the condition."""
    return "accum" not in nodes.code(conjunct).lower()


def _under_strategy_scope(node: cst.CSTNode, parent: Parent) -> bool:
    """Inside `with strategy.scope():` distribution is unconditional where the call is."""
    current = parent(node)
    while current is not None:
        if isinstance(current, cst.With) and any(
            isinstance(item.item, cst.Call)
            and isinstance(item.item.func, cst.Attribute)
            and item.item.func.attr.value == "scope"
            for item in current.items
        ):
            return True
        current = parent(current)
    return False


def _wrapper_decision(call: cst.Call, facts: DistributedFacts, parent: Parent) -> Decision | None:
    """Where the optimizer's own function applies `hvd.DistributedOptimizer`, distribution is on
    exactly when that wrapper is (UNet-style `if hvd_utils.is_using_hvd(): opt = hvd.Distri...`):
    the script's own condition, not a literal True that breaks its single-device runs."""
    home = _enclosing_function(call, parent)
    around = {id(statement): in_else for statement, in_else in _guards(call, parent)}
    conditions, whole = [], []
    for wrapper in facts.wrappers:
        if _enclosing_function(wrapper, parent) is not home:
            continue
        guards = _guards(wrapper, parent)
        if any(id(s) in around and around[id(s)] != e for s, e in guards):
            continue  # the other branch of an `if` around the call: never the same optimizer
        own = [(s, e) for s, e in guards if id(s) not in around]
        if not own:
            return cst.Name("True"), "this function always wraps the optimizer for Horovod"
        conditions.append(_condition(own, keep=_not_about_accumulation))
        whole.append(nodes.code(_condition(own)))
    codes = {nodes.code(c) for c in conditions}
    if len(codes) != 1:
        return None
    condition = conditions[0]
    code = nodes.code(condition)
    if whole[0] != code:
        return condition, (
            f"Horovod runs when `{code}` (the optimizer is wrapped for it only when "
            f"`{whole[0]}`; with gradient accumulation the script all-reduces the gradients "
            "itself, and the workers' overflow flags must still be summed)"
        )
    return condition, f"Horovod wraps the optimizer only when `{code}`"


def _unwrapped_branch(call: cst.Call, parent: Parent) -> cst.If | None:
    """The `if` around the call that says this is the run without Horovod: its test names
    Horovod (neurst's `if hvd_backend: ... else: opt = LossScaleOptimizer(opt)`, `if not
    FLAGS.use_horovod:`) and the call is in its branch for false. The optimizer built there is
    the single-worker one, which `True` broke. (A wrapper in the other branch says nothing by
    itself: DeepLearningExamples' ConvNets wraps for Horovod only without gradient accumulation,
    whose own train step all-reduces the gradients.)"""
    for statement, in_else in _guards(call, parent):
        negated = isinstance(statement.test, cst.UnaryOperation) and isinstance(
            statement.test.operator, cst.Not
        )
        test = statement.test.expression if negated else statement.test  # type: ignore[attr-defined]
        if _names_horovod(test) and in_else != negated:
            return statement
    return None


def _names_horovod(test: cst.BaseExpression) -> bool:
    """A name or attribute read for its truth that names Horovod (`hvd_backend`, `use_horovod`,
    `FLAGS.horovod`): not a call (`hvd.size() > 1` is a world-size test, decided before)."""
    if not isinstance(test, (cst.Name, cst.Attribute)):
        return False
    last = test.value if isinstance(test, cst.Name) else test.attr.value
    return "hvd" in last.lower() or "horovod" in last.lower()


def _init_decision(facts: DistributedFacts, scope: Scope | None, parent: Parent) -> Decision | None:
    """`hvd.size() > 1` needs `hvd.init()`; where the script initialises Horovod only under a flag
    (`if FLAGS.horovod: hvd.init()`), the flag goes first so single-device runs never call it.

    An optional import (`except ImportError: hvd = None`) counts too: its flag matters as much,
    since Horovod installed but not initialised raises on `hvd.size()`. Without a flag it is
    left to `is_distributed_value`'s `hvd is not None` test."""
    for alias, statement in facts.horovod_aliases.items():
        optional = alias in facts.optional_horovod
        if alias not in facts.initialised or not _visible(
            scope,
            alias,
            lambda a, s=statement: a.node is s,
            (lambda a: _binds_none(a, parent)) if optional else (lambda a: False),
        ):
            continue
        inits = [
            c
            for c in facts.init_calls
            if isinstance(c.func, cst.Attribute) and nodes.code(c.func.value) == alias
        ]
        guarded = [_guards(c, parent) for c in inits]
        size = f"{alias}.size() > 1"
        if any(not g for g in guarded):
            if optional:
                continue
            return cst.parse_expression(size), f"the file trains with Horovod ({size} at run time)"
        if optional:
            size = f"{alias} is not None and {size}"
        codes = {nodes.code(_condition(g)) for g in guarded}
        if len(codes) == 1 and _global_names_only(_condition(guarded[0]), scope):
            (condition,) = codes
            value = cst.parse_expression(f"{condition} and {size}")
            return value, f"Horovod is initialised only when `{condition}`"
    return None


def _global_names_only(expr: cst.BaseExpression, scope: Scope | None) -> bool:
    """Whether every name in ``expr`` means the same where the optimizer is built (a module flag
    such as FLAGS.horovod, not a local of the function that called hvd.init())."""
    if scope is None:
        return False
    names = [n.value for n in _walk_names(expr)]
    return all(name in scope.globals for name in names)


def _walk_names(node: cst.CSTNode) -> Iterator[cst.Name]:
    if isinstance(node, cst.Name):
        yield node
        return
    if isinstance(node, cst.Attribute):
        yield from _walk_names(node.value)
        return
    for child in node.children:
        yield from _walk_names(child)


def is_distributed_value(
    call: cst.Call,
    facts: DistributedFacts,
    *,
    parent: Parent,
    canonical: Canonical,
    scope: Scope | None,
) -> tuple[cst.BaseExpression | None, str]:
    """The `is_distributed=` value for an optimizer built by `call` (None: leave the default).

    Returns the expression and a human reason for the report. In order: a world-size `if`
    around the call, a variable holding such a test, the condition under which the same function
    applies Horovod's wrapper, the condition under which Horovod is initialised; True only where
    the file trains distributed with no condition the tool can see.
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
    unwrapped = _unwrapped_branch(call, parent)
    if unwrapped is not None:
        return None, (
            f"it is built in the branch of `if {nodes.code(unwrapped.test)}:` for the run "
            "without Horovod"
        )
    decision = _wrapper_decision(call, facts, parent) or _init_decision(facts, scope, parent)
    if decision is not None:
        return _as_flag(decision[0], scope, canonical, parent), decision[1]
    for alias in sorted(facts.optional_horovod & facts.horovod_aliases.keys()):
        if scope is not None and alias in scope:
            value = cst.parse_expression(f"{alias} is not None and {alias}.size() > 1")
            return value, f"`{alias}` is Horovod only where its import succeeded, else None"
    if not facts.horovod_imported and not _under_strategy_scope(call, parent):
        # Scripts build their strategy only for some runs (xlnet: none with one core per host).
        # has_strategy() is true exactly where the optimizer is built under one.
        value = has_strategy(facts, scope)
        if value is not None:
            return value, "the file builds a tf.distribute strategy for some runs"
    reason = "Horovod" if facts.horovod_imported else "a tf.distribute strategy"
    return cst.Name("True"), f"the file trains with {reason}"


def has_strategy(facts: DistributedFacts, scope: Scope | None) -> cst.BaseExpression | None:
    """`tf.distribute.has_strategy()` through the file's TensorFlow import that `scope` (where the
    optimizer is built) sees, or None where it sees none."""
    for alias, statement in facts.tensorflow_aliases.items():
        if _visible(scope, alias, lambda a, s=statement: a.node is s):
            return cst.parse_expression(f"{alias}.distribute.has_strategy()")
    return None


def horovod_parameter(
    scope: Scope | None, parent: Parent, aliases: Collection[str] = ()
) -> tuple[cst.BaseExpression, str] | None:
    """`is_distributed=` for an optimizer built in a function that is handed Horovod.

    Such a function (NVIDIA's BERT `create_optimizer(..., hvd=None)`) gets None, or Horovod on a
    single worker, when training on one device, so the value is the run-time test
    `hvd is not None and hvd.size() > 1` (`is not None` only where the default is None). A
    parameter counts as Horovod when it is used with an attribute only Horovod has, or when it
    shadows the file's own Horovod import (`import horovod.tensorflow as hvd` and `hvd=None`).
    Enclosing functions are searched too (a model_fn defined inside a builder that takes hvd).
    """
    while scope is not None and not isinstance(scope, GlobalScope):
        found = _horovod_parameter_of(scope, parent, aliases)
        if found is not None:
            return found
        scope = scope.parent
    return None


def _horovod_parameter_of(
    scope: Scope, parent: Parent, aliases: Collection[str]
) -> tuple[cst.BaseExpression, str] | None:
    if not isinstance(scope, FunctionScope) or not isinstance(scope.node, cst.FunctionDef):
        return None
    params = scope.node.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        name = param.name.value
        assignments = list(scope[name]) if name in scope else []
        if len(assignments) != 1 or assignments[0].node is not param:
            continue
        attributes = sorted(
            attribute.attr.value
            for access in assignments[0].references
            if isinstance(attribute := parent(access.node), cst.Attribute)
            and attribute.value is access.node
        )
        used = [a for a in attributes if a in _HOROVOD_ONLY_ATTRIBUTES]
        if used:
            evidence = f"is used as Horovod (`{name}.{used[0]}`)"
        elif name in aliases and attributes:
            evidence = f"shadows the file's Horovod import `{name}`"
        else:
            continue
        # Optional where None is its default, or where the function itself tests it against
        # None (callers pass `hvd if use_horovod else None`).
        optional = (isinstance(param.default, cst.Name) and param.default.value == "None") or any(
            _tested_against_none(access.node, parent) for access in assignments[0].references
        )
        test = f"{name} is not None and {name}.size() > 1" if optional else f"{name}.size() > 1"
        why = f"the parameter `{name}` {evidence}: true at run time"
        return cst.parse_expression(test), f"{why} only on several workers"
    return None


def _tested_against_none(node: cst.CSTNode, parent: Parent) -> bool:
    """`node is None` / `node is not None` (either side)."""
    comparison = parent(node)
    if isinstance(comparison, cst.ComparisonTarget):
        comparison = parent(comparison)
    if not isinstance(comparison, cst.Comparison) or len(comparison.comparisons) != 1:
        return False
    target = comparison.comparisons[0]
    if not isinstance(target.operator, (cst.Is, cst.IsNot)):
        return False
    other = target.comparator if comparison.left is node else comparison.left
    return isinstance(other, cst.Name) and other.value == "None"


def _as_flag(
    expr: cst.BaseExpression, scope: Scope | None, canonical: Canonical, parent: Parent
) -> cst.BaseExpression:
    """A condition with the worker count where a flag belongs made a flag: `is_mpi` assigned
    `hvd.size()` (truthy on one worker too) becomes `is_mpi > 1`, also as a part of `a and b`;
    a parameter with a number for its default (`use_multi_cpu=0`, handed a worker count by
    IntelAI's BERT) becomes `bool(use_multi_cpu)`: the library refuses a count as a flag."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return expr.with_changes(
            left=_as_flag(expr.left, scope, canonical, parent),
            right=_as_flag(expr.right, scope, canonical, parent),
        )
    if not isinstance(expr, cst.Name) or scope is None or expr.value not in scope:
        return expr
    for assignment in scope[expr.value]:
        if not isinstance(assignment, Assignment):
            continue
        if isinstance(assignment.node, cst.Param) and isinstance(
            assignment.node.default, cst.Integer
        ):
            return cst.parse_expression(f"bool({expr.value})")
        holder = parent(assignment.node)
        statement = parent(holder) if holder is not None else None
        if isinstance(statement, cst.Assign) and _is_size_call(statement.value, canonical):
            return cst.parse_expression(f"{expr.value} > 1")
    return expr
