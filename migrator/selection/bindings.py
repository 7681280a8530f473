"""The value a name holds where a call reads it, where the file makes that plain: the one
assignment its scope (or an enclosing function's, or the module's) gives it.

A script's settings often reach a call through a local name (`precision = "bf16-true" if ... else
"32-true"`, then `Fabric(precision=precision)`; `ds_config = {...}`, then
`deepspeed.initialize(config=ds_config)`). Read with `ast`. A name bound more than once, by anything
but a plain assignment (a loop, a parameter, `global`), or edited after it (`ds_config["fp16"] =
...`, `.update(...)`) has no value here: the caller then treats it as computed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import NamedTuple

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_EDITS = frozenset({"update", "setdefault", "pop", "clear"})


class Scope(NamedTuple):
    """What one scope binds: names with their one value, and names bound any other way."""

    values: dict[str, ast.expr]
    others: frozenset[str]
    function: bool  # a class body is not seen from the functions inside it


class Lookup:
    """The scopes a call sits in, innermost last."""

    def __init__(self, chain: tuple[Scope, ...]) -> None:
        self._chain = chain

    def value(self, name: str) -> ast.expr | None:
        """The value `name` holds, or None where the file does not make it plain."""
        for depth, scope in enumerate(reversed(self._chain)):
            if depth and not scope.function:
                continue  # an enclosing class body
            if name in scope.others:
                return None
            if name in scope.values:
                return scope.values[name]
        return None


def calls(tree: ast.Module) -> Iterator[tuple[ast.Call, Lookup]]:
    """Every call in the module, with the names its scope chain binds."""
    yield from _calls(tree, ())


def _calls(node: ast.AST, outer: tuple[Scope, ...]) -> Iterator[tuple[ast.Call, Lookup]]:
    own, nested = _own_nodes(node)
    chain = (*outer, _scope(node, own))
    lookup = Lookup(chain)
    for inner in own:
        if isinstance(inner, ast.Call):
            yield inner, lookup
    for scope in nested:
        yield from _calls(scope, chain)


def _own_nodes(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The nodes that run in `node`'s own scope, and the scopes nested in it. A nested
    definition's decorators and defaults run here, its body there; both count here."""
    own: list[ast.AST] = []
    nested: list[ast.AST] = []
    stack = list(_body(node))
    while stack:
        inner = stack.pop()
        own.append(inner)
        if isinstance(inner, _SCOPES):
            nested.append(inner)
            stack.extend(_outside(inner))
        else:
            stack.extend(ast.iter_child_nodes(inner))
    return own, nested


def _body(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Lambda):
        return [node.body]
    if isinstance(node, _SCOPES):
        return list(node.body)
    return list(ast.iter_child_nodes(node))


def _outside(scope: ast.AST) -> list[ast.AST]:
    """The parts of a nested definition evaluated where it is defined."""
    if isinstance(scope, ast.Lambda):
        return [*scope.args.defaults, *(d for d in scope.args.kw_defaults if d is not None)]
    parts: list[ast.AST] = list(getattr(scope, "decorator_list", []))
    if isinstance(scope, ast.ClassDef):
        return [*parts, *scope.bases, *scope.keywords]
    arguments = scope.args  # type: ignore[attr-defined]
    return [*parts, *arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]


def _scope(node: ast.AST, own: list[ast.AST]) -> Scope:
    stores: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    others: set[str] = set(_parameters(node))
    for inner in own:
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, (ast.Store, ast.Del)):
            stores[inner.id] = stores.get(inner.id, 0) + 1
        elif isinstance(inner, (ast.Global, ast.Nonlocal)):
            others.update(inner.names)
        elif isinstance(inner, _SCOPES) and not isinstance(inner, ast.Lambda):
            others.add(inner.name)
        elif isinstance(inner, (ast.Import, ast.ImportFrom)):
            others.update((a.asname or a.name).split(".")[0] for a in inner.names)
        elif isinstance(inner, ast.Subscript) and isinstance(inner.ctx, ast.Store):
            others.add(_root(inner))
        elif isinstance(inner, ast.Attribute) and inner.attr in _EDITS:
            others.add(_root(inner))
        if isinstance(inner, ast.Assign) and len(inner.targets) == 1:
            target = inner.targets[0]
            if isinstance(target, ast.Name):
                values[target.id] = inner.value
        elif isinstance(inner, ast.AnnAssign) and inner.value is not None:
            if isinstance(inner.target, ast.Name):
                values[inner.target.id] = inner.value
    others.update(name for name, count in stores.items() if count > 1 or name not in values)
    return Scope(
        {n: v for n, v in values.items() if n not in others},
        frozenset(others),
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)),
    )


def _parameters(node: ast.AST) -> Iterator[str]:
    arguments = getattr(node, "args", None)
    if not isinstance(arguments, ast.arguments):
        return
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
        yield argument.arg
    for star in (arguments.vararg, arguments.kwarg):
        if star is not None:
            yield star.arg


def _root(node: ast.expr) -> str:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""
