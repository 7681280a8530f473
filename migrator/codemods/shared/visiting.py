"""Read-only visits of a libcst tree without rebuilding it.

`CSTNode.visit` serves visitors and transformers alike: it rebuilds every node from its visited
children (and validates it) even for a `CSTVisitor`, which changes nothing. On a 500-line file that
rebuild is most of a walk's cost, and the port walks every file several times. `visit` here calls
the same visitor methods in the same order on the same nodes, reading each node's children in the
order its own `_visit_and_replace_children` visits them (read once per node type from that
method's source: each of libcst's helpers it calls names the field it visits), and builds nothing.

libcst's scope and expression-context analyses walk most of the tree through nested
`node.visit(self)` calls of their own (each function's parameters and body, each assignment's
target and value), so `Wrapper` resolves metadata with `CSTNode.visit` routed to this walk for
CSTVisitors: in a profile of the dense tree's files those rebuilds were a quarter of the time.

Attribute hooks (`visit_Call_func`, `on_visit_attribute`) are honoured: on a node of a type the
visitor has a hook for, they are called around each field exactly as libcst calls them; elsewhere
the two calls per field are spared. libcst's visitor base class defines a no-op stub for every
hook (marked `_is_no_op`), so only methods that replace a stub count: the scope analysis has two,
both on `ClassDef`, and on every other node the calls did nothing (a fifth of a walk's cost).

The same holds for the visit_ and leave_ methods: libcst looks each up by name on every node, and
nearly all are such stubs, so the walk finds them once per visitor class and node type (`_Table`)
and calls only real ones. The batched walk metadata is resolved with is dispatched the same way,
and skipped when its only method is the scope analysis's visit_Module (which walks the module
itself). Measured on the dense tree's 341 libcst files, these took about a fifth of the CPU off.

Two thirds of the nodes are trivia (whitespace, comments, punctuation: see
migrator.codemods.shared.trivia), and none of these visitors has a method for any of them, so the
walk for such a visitor skips the fields that hold only trivia. With that the scope analysis,
the expression contexts and the parent links took half the CPU they did on the dense tree's
388 libcst files, and the median CPU per file went from 0.13 s to 0.08 s.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager

import libcst as cst
from libcst import BatchableCSTVisitor
from libcst._batched_visitor import _BatchedCSTVisitor
from libcst.metadata import MetadataWrapper
from libcst.metadata.base_provider import ProviderT
from libcst.metadata.scope_provider import _ASSIGNMENT_LIKE_NODES, ScopeVisitor

from . import untyped_scope
from .parents import KINDS, NODE, SEQUENCE, field_kind
from .trivia import TRIVIA, trivia_fields

# libcst's helpers in libcst/_nodes/internal.py; each takes (parent, fieldname, value, visitor).
_HELPERS = frozenset(
    {
        "visit_required",
        "visit_optional",
        "visit_sentinel",
        "visit_sequence",
        "visit_body_sequence",
        "visit_iterable",
        "visit_body_iterable",
    }
)
# (field, visited only when not None): `FormattedStringExpression.format_spec` is visited, hooks
# and all, only when present (`visit_sequence(...) if format_spec is not None else None`).
_ORDER: dict[type, tuple[tuple[str, bool], ...]] = {}
# visitor type -> the node type names it has attribute hooks for (None: it may react to any)
_HOOKS: dict[type, frozenset[str] | None] = {}


def visit(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a CSTVisitor, without rebuilding the tree."""
    if not isinstance(visitor, cst.CSTVisitor):
        node.visit(visitor)  # a transformer: libcst's own walk, which builds its result
        return
    _walk(node, visitor, _hooked_types(visitor))


def visit_wrapper(wrapper: MetadataWrapper, visitor: cst.CSTVisitor) -> None:
    """`wrapper.visit(visitor)` (metadata resolved and bound as there), without the rebuild."""
    with visitor.resolve(wrapper):
        visit(wrapper.module, visitor)


class Wrapper(MetadataWrapper):
    """A MetadataWrapper whose walks build nothing: the batched walk libcst resolves the scope
    analysis and the other batchable providers with, and `visit` with a CSTVisitor.

    `_BatchedCSTVisitor` and `_get_visitor_methods` are what libcst's own `visit_batched` uses;
    only the walk that drives them differs.
    """

    def __init__(
        self, module: cst.Module, unsafe_skip_copy: bool = False, *, source: bytes | None = None
    ) -> None:
        """`source`: the bytes `module` was parsed from, when the caller has them; a file that
        never spells `typing` is spared the scope analysis's questions about it (see
        `_untyped_scope_entry`)."""
        super().__init__(module, unsafe_skip_copy)
        self.spells_typing = source is None or b"typing" in source

    @classmethod
    def of_built(cls, module: cst.Module) -> Wrapper:
        """A wrapper of a tree a codemod built, copied (as MetadataWrapper does by default) only
        where some node appears in it twice, which would give that node one set of metadata.

        A tree rebuilt from a parsed one keeps the parsed statements it did not change, so its
        code is their bytes (migrator.codemods.shared.splice) and needs no code generation; the
        copy also cost a fifth of the time of a file the global-step move edits."""
        return cls(module, unsafe_skip_copy=not _repeats_a_node(module))

    def resolve_many(self, providers: Iterable[ProviderT]) -> object:
        global _typing_spelled
        outer, _typing_spelled = _typing_spelled, self.spells_typing
        try:
            with read_only_visits():
                return super().resolve_many(providers)
        finally:
            _typing_spelled = outer

    def visit_batched(
        self,
        visitors: Iterable[BatchableCSTVisitor],
        before_visit: object = None,
        after_leave: object = None,
    ) -> cst.CSTNode:
        visitors = list(visitors)
        with ExitStack() as stack:
            for one in visitors:
                stack.enter_context(one.resolve(self))
            methods = _visitor_methods(visitors)
            if (
                before_visit is not None
                or after_leave is not None
                or any(map(_hooked_type, methods))
            ):
                batched: cst.CSTVisitor = _BatchedCSTVisitor(
                    methods,
                    before_visit=before_visit,  # type: ignore[arg-type]
                    after_leave=after_leave,  # type: ignore[arg-type]
                )
                visit(self.module, batched)
            elif methods.keys() <= {"visit_Module", "leave_Module"}:
                # The analyses (scope, expression contexts, parents) each walk the module
                # themselves from visit_Module; the batched walk after them would call nothing
                # on any other node.
                for method in (*methods.get("visit_Module", ()), *methods.get("leave_Module", ())):
                    method(self.module)
            else:
                visit(self.module, _Batched(methods))
        return self.module

    def visit(self, visitor):  # type: ignore[no-untyped-def,override]
        if not isinstance(visitor, cst.CSTVisitor):
            return super().visit(visitor)
        visit_wrapper(self, visitor)
        return self.module


class _Batched(cst.CSTVisitor):
    """`_BatchedCSTVisitor` without attribute hooks, before_visit or after_leave, dispatched by
    the walk's table: a node type the batched visitors have no method for costs no call at all
    (the expression-context round has methods for a dozen of the ~250 node types)."""

    def __init__(self, methods: Mapping[str, list[Callable[[cst.CSTNode], object]]]) -> None:
        super().__init__()
        self.methods = methods
        self.table = _Table(self.entry, lean=_ignores_trivia(_Batched, self.entry))

    def entry(self, node_type: type) -> _Entry:
        """The walk's table entry: the methods in their order, their results ignored (a batched
        visitor cannot prune the walk)."""
        name = node_type.__name__
        return (
            _calling(self.methods.get(f"visit_{name}", ())),
            True,
            _calling(self.methods.get(f"leave_{name}", ())),
        )


def _calling(methods: Sequence[Callable[[cst.CSTNode], object]]) -> object:
    if not methods:
        return None

    def call(_visitor: object, node: cst.CSTNode) -> None:
        for method in methods:
            method(node)

    return call


# visitor class -> the names libcst's `get_visitors` finds on its instances
_VISITOR_NAMES: dict[type, tuple[str, ...]] = {}


def _visitor_methods(
    visitors: Sequence[BatchableCSTVisitor],
) -> dict[str, list[Callable[[cst.CSTNode], object]]]:
    """`_get_visitor_methods(visitors)`, with each class's method names found once.

    libcst's `get_visitors` runs `inspect.getmembers` over every instance, and metadata
    resolution makes new provider instances for every file: 3% of the dense tree's libcst CPU.
    A visitor with methods of its own (in its instance dict), or its own `get_visitors`, is
    asked as libcst asks it.
    """
    methods: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
    for visitor in visitors:
        visitor_type = type(visitor)
        names = _VISITOR_NAMES.get(visitor_type)
        if visitor_type.get_visitors is not BatchableCSTVisitor.get_visitors or any(
            key.startswith(("visit_", "leave_")) for key in getattr(visitor, "__dict__", ())
        ):
            found = visitor.get_visitors()
        else:
            if names is None:
                names = _VISITOR_NAMES[visitor_type] = tuple(visitor.get_visitors())
            found = {name: getattr(visitor, name) for name in names}
        for name, method in found.items():
            methods.setdefault(name, []).append(method)
    return methods


_LIBCST_VISIT = cst.CSTNode.visit


# The visitor of the latest `_read_only_visit`, with its hooks and table: the scope analysis
# visits subtrees itself, over 400,000 times over the dense tree, nearly all with one visitor per
# file, and working out its table each time (its instance attributes read for visit_ methods)
# cost about 5% of the metadata resolution (3.3 s -> 3.15 s over 130 files, least of 3).
# Held weakly, so that a finished analysis is freed with its file.
_last_visit: tuple[weakref.ref[cst.CSTVisitor], frozenset[str] | None, _Table] | None = None


def _read_only_visit(self: cst.CSTNode, visitor: cst.CSTVisitor) -> object:
    """`CSTNode.visit` as it is while `read_only_visits` holds: the same for a transformer."""
    global _last_visit
    if not isinstance(visitor, cst.CSTVisitor):
        return _LIBCST_VISIT(self, visitor)
    last = _last_visit
    if last is not None and last[0]() is visitor:
        _, hooked, table = last
    else:
        hooked, table = _hooked_types(visitor), _dispatch_table(visitor)
        _last_visit = (weakref.ref(visitor), hooked, table)
    _walk_with(self, visitor, hooked, table)
    return self  # what libcst's visit returns for a CSTVisitor: the node itself


@contextmanager
def read_only_visits() -> Iterator[None]:
    """Route `node.visit(visitor)` to `visit` for CSTVisitors until the block ends.

    libcst's own visitors (the scope analysis) call `node.visit(self)` on subtrees, out of our
    reach otherwise; a CSTVisitor sees the same calls in the same order either way. Nested uses
    leave the routing to the outermost one. The migrator runs files in processes, not threads.
    """
    if cst.CSTNode.visit is _read_only_visit:
        yield
        return
    cst.CSTNode.visit = _read_only_visit  # type: ignore[method-assign]
    try:
        yield
    finally:
        cst.CSTNode.visit = _LIBCST_VISIT  # type: ignore[method-assign]


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, hooked: frozenset[str] | None) -> None:
    _walk_with(node, visitor, hooked, _dispatch_table(visitor))


# What libcst's CSTVisitor.on_visit / on_leave do for a node type, found once per visitor class:
# (the visit_ method or None, whether it is one, the leave_ method or None); see `_entry`.
_Entry = tuple[object, bool, object]
# An entry and the fields the walk enters, in order, each with whether it is skipped when None.
_Fields = tuple[tuple[str, bool], ...]
_Row = tuple[object, bool, object, _Fields]
_TABLES: dict[type, _Table] = {}
_PLAIN_ON_VISIT = cst.CSTVisitor.on_visit
_PLAIN_ON_LEAVE = cst.CSTVisitor.on_leave


def _walk_with(
    node: cst.CSTNode,
    visitor: cst.CSTVisitor,
    hooked: frozenset[str] | None,
    table: _Table,
) -> None:
    # As CSTNode.visit: on_visit, the children unless it returned False, then on_leave.
    node_type = type(node)
    enter, is_visit_method, leave, fields = table[node_type]
    if enter is None:
        go = True
    elif is_visit_method:
        go = enter(visitor, node) is not False  # type: ignore[operator]
    else:
        go = enter(visitor, node)  # type: ignore[operator]
    if go:
        hooks = hooked is None or node_type.__name__ in hooked
        for name, optional in _fields(node_type) if hooks else fields:
            value = getattr(node, name)
            if optional and value is None:
                continue
            if hooks:
                visitor.on_visit_attribute(node, name)
            kind = KINDS.get(type(value)) or field_kind(type(value))
            if kind is NODE:
                _walk_with(value, visitor, hooked, table)
            elif kind is SEQUENCE:
                for item in value:
                    _walk_with(item, visitor, hooked, table)
            if hooks:
                visitor.on_leave_attribute(node, name)
    if leave is not None:
        leave(visitor, node)  # type: ignore[operator]


def preorder(root: cst.CSTNode) -> tuple[list[cst.CSTNode], list[int]]:
    """Every node from `root` down in the order a visitor that ignores trivia meets them, and
    for each the position just past its subtree: the walk of such a visitor that only records
    nodes, without its two method calls per node (a third of the cost)."""
    nodes: list[cst.CSTNode] = []
    ends: list[int] = []
    pending: list[cst.CSTNode | int] = [root]  # an int: where the subtree begun there ends
    while pending:
        item = pending.pop()
        if type(item) is int:
            ends[item] = len(nodes)
            continue
        pending.append(len(nodes))
        nodes.append(item)
        ends.append(0)
        children: list[cst.CSTNode] = []
        for name, optional in _lean_fields(type(item)):
            value = getattr(item, name)
            if optional and value is None:
                continue
            kind = KINDS.get(type(value)) or field_kind(type(value))
            if kind is NODE:
                children.append(value)
            elif kind is SEQUENCE:
                children.extend(value)
        children.reverse()
        pending.extend(children)
    return nodes, ends


def every_node(root: cst.CSTNode) -> list[cst.CSTNode]:
    """`root` and every node under it, trivia included, in libcst's visiting order; a node that
    appears twice is listed twice."""
    found: list[cst.CSTNode] = []
    visit(root, _Nodes(found))
    return found


class _Nodes(cst.CSTVisitor):
    def __init__(self, found: list[cst.CSTNode]) -> None:
        super().__init__()
        self.found = found

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.found.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass


def _repeats_a_node(root: cst.CSTNode) -> bool:
    found = every_node(root)
    return len({id(node) for node in found}) != len(found)


class _Table(dict[type, _Row]):
    """Rows made on first use from `build`'s entry. A `lean` table's visitor does nothing on
    trivia (migrator.codemods.shared.trivia), so its walk skips the fields that hold only
    trivia: two thirds of the nodes. A node type with attribute hooks still has every field
    visited, hooks and all."""

    def __init__(self, build: Callable[[type], _Entry], *, lean: bool) -> None:
        super().__init__()
        self.build = build
        self.lean = lean

    def __missing__(self, node_type: type) -> _Row:
        fields = _lean_fields(node_type) if self.lean else _fields(node_type)
        row = self[node_type] = (*self.build(node_type), fields)
        return row


def _dispatch_table(visitor: cst.CSTVisitor) -> _Table:
    """The visitor class's table, or the batched visitor's own (its methods are its own). An
    instance that holds a visit_ or leave_ attribute of its own gets libcst's on_visit and
    on_leave for every type: they look the method up on the instance first."""
    if isinstance(visitor, _Batched):
        return visitor.table
    visitor_type = type(visitor)
    if visitor_type is ScopeVisitor and not _typing_spelled and untyped_scope.KNOWN:
        return _UNTYPED_SCOPE_TABLE
    if any(key.startswith(("visit_", "leave_")) for key in getattr(visitor, "__dict__", ())):
        return _Table(lambda _: (visitor_type.on_visit, False, visitor_type.on_leave), lean=False)
    table = _TABLES.get(visitor_type)
    if table is None:
        build = functools.partial(_entry, visitor_type)
        table = _TABLES[visitor_type] = _Table(build, lean=_ignores_trivia(visitor_type, build))
    return table


def _entry(visitor_type: type, node_type: type) -> _Entry:
    """How a visitor of `visitor_type` meets a node of `node_type`, as plain functions.

    libcst's on_visit looks up `visit_<Type>` by name on every node and calls it, and most of
    those are the no-op stubs its base class defines for every type (marked `_is_no_op`); the two
    lookups and two calls per node were a tenth of a walk. A class that overrides on_visit or
    on_leave (the scope analysis, the batched visitor) keeps its own, called as libcst calls it.
    """
    if visitor_type.on_visit is _PLAIN_ON_VISIT:
        enter = _method(visitor_type, f"visit_{node_type.__name__}")
        is_visit_method = True
    else:
        enter, is_visit_method = visitor_type.on_visit, False
    if visitor_type.on_leave is _PLAIN_ON_LEAVE:
        leave = _method(visitor_type, f"leave_{node_type.__name__}")
    elif visitor_type is ScopeVisitor and _SCOPE_LEAVE_IS_KNOWN:
        leave = _scope_leave(node_type)
    else:
        leave = visitor_type.on_leave
    return enter, is_visit_method, leave


# libcst's scope analysis overrides on_leave with this, run on every node of every file: the
# isinstance test against a tuple of its (ABC) node classes alone was a tenth of a file's time.
# `_scope_leave` does the same per node type, with the test made once; it is used only while
# libcst's method reads exactly so (libcst is pinned; a new version falls back to its own).
_SCOPE_ON_LEAVE = """def on_leave(self, original_node: cst.CSTNode) -> None:
    self.provider.set_metadata(original_node, self.scope)
    if isinstance(original_node, _ASSIGNMENT_LIKE_NODES):
        self.scope._assignment_count += 1
    super().on_leave(original_node)
"""
_SCOPE_LEAVE_IS_KNOWN = textwrap.dedent(inspect.getsource(ScopeVisitor.on_leave)) == _SCOPE_ON_LEAVE


def _scope_leave(node_type: type) -> Callable[[ScopeVisitor, cst.CSTNode], None]:
    assigning = issubclass(node_type, _ASSIGNMENT_LIKE_NODES)
    method = _method(ScopeVisitor, f"leave_{node_type.__name__}")  # what super().on_leave calls

    def leave(visitor: ScopeVisitor, node: cst.CSTNode) -> None:
        visitor.provider.set_metadata(node, visitor.scope)
        if assigning:
            visitor.scope._assignment_count += 1
        if method is not None:
            method(visitor, node)  # type: ignore[operator]

    return leave


# Whether the file a `Wrapper` is resolving metadata for spells `typing` (True: not known).
_typing_spelled = True


def _untyped_scope_entry(node_type: type) -> _Entry:
    """The scope analysis's entry for a file that never spells `typing`
    (migrator.codemods.shared.untyped_scope)."""
    enter, is_visit_method, leave = _entry(ScopeVisitor, node_type)
    return untyped_scope.METHODS.get(node_type, enter), is_visit_method, leave


def _ignores_trivia(visitor_type: type, build: Callable[[type], _Entry]) -> bool:
    """Whether a visitor of `visitor_type` does nothing on trivia nodes.

    True when it has no visit_ or leave_ method for any trivia type; for libcst's scope analysis,
    whose on_leave records the scope of every node, when that is all it would do there (the
    scope of a comma is never asked); for a class with an on_visit of its own, when it says so
    with `IGNORES_TRIVIA = True`.
    """
    if getattr(visitor_type, "IGNORES_TRIVIA", False):
        return True
    if visitor_type is ScopeVisitor:
        return (
            _SCOPE_LEAVE_IS_KNOWN
            and ScopeVisitor.on_visit is _PLAIN_ON_VISIT
            and not any(
                issubclass(one, _ASSIGNMENT_LIKE_NODES)
                or _method(ScopeVisitor, f"visit_{one.__name__}") is not None
                or _method(ScopeVisitor, f"leave_{one.__name__}") is not None
                for one in TRIVIA
            )
        )
    return all(enter is None and leave is None for enter, _, leave in map(build, TRIVIA))


def _method(visitor_type: type, name: str) -> object:
    found = getattr(visitor_type, name, None)
    return None if found is None or getattr(found, "_is_no_op", False) else found


_UNTYPED_SCOPE_TABLE = _Table(
    _untyped_scope_entry, lean=_ignores_trivia(ScopeVisitor, _untyped_scope_entry)
)


def _fields(node_type: type) -> _Fields:
    order = _ORDER.get(node_type)
    if order is None:
        order = _ORDER[node_type] = _visit_order(node_type)
    return order


def _lean_fields(node_type: type) -> _Fields:
    """`_fields` less those that hold only trivia."""
    lean = _LEAN.get(node_type)
    if lean is None:
        skipped = trivia_fields(node_type)
        lean = _LEAN[node_type] = tuple(f for f in _fields(node_type) if f[0] not in skipped)
    return lean


_LEAN: dict[type, _Fields] = {}


def _visit_order(node_type: type) -> tuple[tuple[str, bool], ...]:
    """The fields `_visit_and_replace_children` visits, in the order it visits them, each with
    whether it is visited only when not None (a helper call in one branch of a conditional whose
    other branch calls none)."""
    owner = next(c for c in node_type.__mro__ if "_visit_and_replace_children" in vars(c))
    tree = ast.parse(textwrap.dedent(inspect.getsource(vars(owner)["_visit_and_replace_children"])))
    calls = sorted(
        (node for node in ast.walk(tree) if _is_helper_call(node)),
        key=lambda call: (call.lineno, call.col_offset),
    )
    guarded = {
        id(call)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.IfExp)
        and not (_has_helper_call(branch.body) and _has_helper_call(branch.orelse))
        for call in ast.walk(branch)
        if _is_helper_call(call)
    }
    names: list[tuple[str, bool]] = []
    for call in calls:
        field = call.args[1] if len(call.args) > 1 else None
        if not (isinstance(field, ast.Constant) and isinstance(field.value, str)):
            raise RuntimeError(f"cannot read the visit order of {node_type.__name__}")
        if all(field.value != name for name, _ in names):
            names.append((field.value, id(call) in guarded))
    return tuple(names)


def _is_helper_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _HELPERS
    )


def _has_helper_call(node: ast.AST) -> bool:
    return any(_is_helper_call(inner) for inner in ast.walk(node))


def _hooked_types(visitor: cst.CSTVisitor) -> frozenset[str] | None:
    """The node type names `visitor` has an attribute hook for; None when it overrides libcst's
    dispatch, and may then react to any attribute.

    The batched visitor's dispatch reads the hooks its visitors define, stubs left out (what
    libcst's `get_visitors` gives it); any other visitor's are its methods that replace a stub.
    """
    if isinstance(visitor, _BatchedCSTVisitor):
        return frozenset(filter(None, map(_hooked_type, visitor.visitor_methods)))
    visitor_type = type(visitor)
    if visitor_type in _HOOKS:
        return _HOOKS[visitor_type]
    found: frozenset[str] | None = None
    if (
        visitor_type.on_visit_attribute is cst.CSTVisitor.on_visit_attribute
        and visitor_type.on_leave_attribute is cst.CSTVisitor.on_leave_attribute
    ):
        found = frozenset(
            hooked
            for name in dir(visitor_type)
            if (hooked := _hooked_type(name))
            and not getattr(getattr(visitor_type, name), "_is_no_op", False)
        )
    _HOOKS[visitor_type] = found
    return found


def _hooked_type(method: str) -> str:
    """`ClassDef` for `visit_ClassDef_bases` or `leave_ClassDef_bases`; "" for anything that
    cannot be an attribute hook (node type names have no underscore)."""
    prefix, _, rest = method.partition("_")
    node_type, _, attribute = rest.partition("_")
    return node_type if prefix in ("visit", "leave") and attribute else ""
