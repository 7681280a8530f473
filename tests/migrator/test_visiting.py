"""The rebuild-free walk (migrator.codemods.shared.visiting) calls a visitor exactly as libcst's
own `visit` does: same methods, same nodes, same order, attribute hooks included."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import libcst as cst
from cst_nodes import all_nodes
from libcst.metadata import ExpressionContextProvider, MetadataWrapper, ScopeProvider

from migrator.codemods.shared import untyped_scope
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.trivia import TRIVIA
from migrator.codemods.shared.visiting import Wrapper, preorder, visit

# Every kind of statement and expression the grammar has, or near enough: EXTRA, the fixtures and
# some of the migrator's own modules.
ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "migrator" / "codemods" / "tf1").rglob("*.py")) + sorted(
    (ROOT / "tests" / "migrator" / "fixtures").rglob("*.py")
)
EXTRA = b"""
async def f(a, /, b: int = 1, *c, d, **e) -> None:
    async with x as (y, z), w:
        async for i in range(3):
            yield await g(f"{a!r:>{b}} {c=}", *c, **e)
    match a:
        case [1, *rest] | {"k": v, **kw} if v: pass
        case Point(x=0) as p: del p
    lambda q, *, r=2: (q if r else -q) @ r
    global G; nonlocal_ = [j for j in c if j async for k in e]
    try: raise E from None
    except* (A, B) as err: ...
    finally: return {**e, 1: 2}, {1, 2}, a[1:2:3, ...]
from . import (a as b,)
from .. m import *
@dec(1)
class C(B, metaclass=M): x: int = (yield)
"""


class Recorder(cst.CSTVisitor):
    def __init__(self, stop_at: type) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.stop_at = stop_at

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", id(node), type(node).__name__))
        return not isinstance(node, self.stop_at)  # also checks a False return skips children

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.calls.append(("leave", id(original_node), ""))

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.calls.append(("visit-attr", id(node), attribute))

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        self.calls.append(("leave-attr", id(original_node), attribute))


class Plain(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.calls.append(("name", id(node)))

    def leave_Call(self, original_node: cst.Call) -> None:
        self.calls.append(("call", id(original_node)))

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


class CallHooks:
    """Hooks for one node type only, as libcst's scope analysis has (`visit_ClassDef_bases`):
    the walk must still call them, and in their place among the other calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.calls.append(("name", id(node)))

    def visit_Call_func(self, node: cst.Call) -> None:
        self.calls.append(("call-func", id(node)))

    def leave_Call_args(self, original_node: cst.Call) -> None:
        self.calls.append(("call-args-done", id(original_node)))


class OneHook(CallHooks, cst.CSTVisitor):
    pass


class Punctuation(Plain):
    """Has methods for trivia: its walk must enter every comma and every whitespace."""

    def visit_Comma(self, node: cst.Comma) -> None:
        self.calls.append(("comma", id(node)))

    def leave_SimpleWhitespace(self, original_node: cst.SimpleWhitespace) -> None:
        self.calls.append(("space", id(original_node)))


class TriviaBlind(cst.CSTVisitor):
    """Sees every node through on_visit and on_leave, and says it does nothing on trivia."""

    IGNORES_TRIVIA = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", id(node)))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.calls.append(("leave", id(original_node)))


class Shadowed(Plain):
    """A visit_ method held by the instance: libcst looks it up on the instance first."""

    def __init__(self) -> None:
        super().__init__()
        self.visit_Attribute = lambda node: self.calls.append(("attribute", id(node)))


class BatchedPlain(cst.BatchableCSTVisitor):
    """Batchable visitors without attribute hooks; two of them must interleave as libcst's."""

    def __init__(self, tag: str, calls: list[tuple[str, str, int]]) -> None:
        super().__init__()
        self.tag, self.calls = tag, calls

    def visit_Name(self, node: cst.Name) -> None:
        self.calls.append((self.tag, "name", id(node)))

    def visit_Call(self, node: cst.Call) -> bool:
        self.calls.append((self.tag, "call", id(node)))
        return False  # a batched walk ignores it: the call's children are still visited

    def leave_Call(self, original_node: cst.Call) -> None:
        self.calls.append((self.tag, "call-done", id(original_node)))


class ModuleOnly(cst.BatchableCSTVisitor):
    """Only the module's own methods, as libcst's ScopeProvider has (it walks from there)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def visit_Module(self, node: cst.Module) -> None:
        self.calls.append(f"visit {len(node.body)}")

    def leave_Module(self, original_node: cst.Module) -> None:
        self.calls.append(f"leave {len(original_node.body)}")


class BatchedOneHook(CallHooks, cst.BatchableCSTVisitor):
    pass


def parsed() -> list[tuple[bytes, cst.Module]]:
    found = [(EXTRA, cst.parse_module(EXTRA))]
    for path in SOURCES:
        source = path.read_bytes()
        try:
            found.append((source, cst.parse_module(source)))
        except cst.ParserSyntaxError:
            continue  # fixtures that do not parse on purpose
    return found


def modules() -> list[cst.Module]:
    return [module for _, module in parsed()]


def _same_calls(module: cst.Module, make: Callable[[], cst.CSTVisitor]) -> list:
    """The calls a fresh visitor from `make` gets from our walk, checked to be libcst's."""
    ours, theirs = make(), make()
    visit(module, ours)
    module.visit(theirs)
    assert ours.calls == theirs.calls  # type: ignore[attr-defined]
    return ours.calls  # type: ignore[attr-defined]


def test_same_calls_as_libcst_with_attribute_hooks() -> None:
    total = 0
    for module in modules():
        total += len(_same_calls(module, lambda: Recorder(cst.Lambda)))
    assert total > 50_000


def test_same_calls_as_libcst_without_attribute_hooks() -> None:
    for module in modules():
        _same_calls(module, Plain)


def test_a_visitor_with_methods_for_trivia_is_walked_through_all_of_it() -> None:
    kinds: set[str] = set()
    for module in modules():
        kinds.update(kind for kind, _ in _same_calls(module, Punctuation))
    assert kinds == {"name", "call", "comma", "space"}


def test_a_visitor_that_ignores_trivia_is_walked_past_it() -> None:
    entered = skipped = 0
    for module in modules():
        ours, theirs = TriviaBlind(), TriviaBlind()
        visit(module, ours)
        module.visit(theirs)  # libcst knows nothing of IGNORES_TRIVIA: every node
        trivia = {id(node) for node in all_nodes(module) if type(node) in TRIVIA}

        def real(calls: list[tuple[str, int]], trivia: set[int] = trivia) -> list:
            return [call for call in calls if call[1] not in trivia]

        assert real(ours.calls) == real(theirs.calls)
        entered += len(ours.calls) - len(real(ours.calls))
        skipped += len(theirs.calls) - len(real(theirs.calls))
    # only trivia in a field that may hold more (`import *`) is entered
    assert skipped > 20_000 and entered < skipped / 100


def test_preorder_lists_what_a_visitor_ignoring_trivia_meets() -> None:
    checked = 0
    for module in modules():
        blind = TriviaBlind()
        visit(module, blind)
        met, ends, open_ = [], [], []
        for kind, node_id in blind.calls:
            if kind == "visit":
                open_.append(len(met))
                met.append(node_id)
                ends.append(0)
            else:
                ends[open_.pop()] = len(met)
        nodes, their_ends = preorder(module)
        assert [id(node) for node in nodes] == met
        assert their_ends == ends
        checked += len(nodes)
    assert checked > 20_000


def test_same_calls_as_libcst_with_a_method_on_the_instance() -> None:
    attributes = 0
    for module in modules():
        attributes += sum(kind == "attribute" for kind, _ in _same_calls(module, Shadowed))
    assert attributes > 1_000
    # ...and the class's own table is not the one the instance method went into
    _same_calls(modules()[-1], Plain)


def test_wrapper_visit_builds_nothing(monkeypatch) -> None:
    module = modules()[-1]
    theirs = Plain()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(theirs)

    def rebuild(self: cst.CSTNode, visitor: object) -> cst.CSTNode:
        raise AssertionError(f"{type(self).__name__} rebuilt")

    monkeypatch.setattr(cst.Module, "_visit_and_replace_children", rebuild)
    ours = Plain()
    assert Wrapper(module, unsafe_skip_copy=True).visit(ours) is module
    assert ours.calls == theirs.calls and ours.calls


def test_same_calls_as_libcst_batched_without_hooks() -> None:
    for module in modules():
        ours: list[tuple[str, str, int]] = []
        theirs: list[tuple[str, str, int]] = []
        Wrapper(module, unsafe_skip_copy=True).visit_batched(
            [BatchedPlain("a", ours), BatchedPlain("b", ours)]
        )
        MetadataWrapper(module, unsafe_skip_copy=True).visit_batched(
            [BatchedPlain("a", theirs), BatchedPlain("b", theirs)]
        )
        assert ours == theirs
        assert {tag for tag, _, _ in ours} <= {"a", "b"}
    ours_module, theirs_module = ModuleOnly(), ModuleOnly()
    Wrapper(module, unsafe_skip_copy=True).visit_batched([ours_module])
    MetadataWrapper(module, unsafe_skip_copy=True).visit_batched([theirs_module])
    assert (
        ours_module.calls
        == theirs_module.calls
        == [f"visit {len(module.body)}"] + [f"leave {len(module.body)}"]
    )


def test_same_calls_as_libcst_with_hooks_on_one_node_type() -> None:
    hooked = 0
    for module in modules():
        calls = _same_calls(module, OneHook)
        batched_ours, batched_theirs = BatchedOneHook(), BatchedOneHook()
        Wrapper(module, unsafe_skip_copy=True).visit_batched([batched_ours])
        MetadataWrapper(module, unsafe_skip_copy=True).visit_batched([batched_theirs])
        assert batched_ours.calls == batched_theirs.calls == calls
        hooked += sum(kind != "name" for kind, _ in calls)
    assert hooked > 1_000


def _scope_facts(mapping: Mapping[cst.CSTNode, object], module: cst.Module) -> tuple[list, dict]:
    """Each node's scope (by kind and first appearance) and each scope's assignments and accesses
    (with the order index libcst counts them by, and what each access refers to): equal for two
    resolutions over the same tree only if they recorded the same. Nodes are named by their place
    in the tree; those libcst parsed from string annotations (new objects on each resolution) by
    their code."""
    nodes = all_nodes(module)
    places = {id(node): place for place, node in enumerate(nodes)}

    def name(node: object) -> object:
        if node is None or id(node) in places:
            return places.get(id(node))
        return (type(node).__name__, module.code_for_node(node))  # type: ignore[arg-type]

    numbers: dict[int, int] = {}
    scopes = {}
    per_node = []
    for node in nodes:
        scope = mapping.get(node)
        if scope is not None and type(node) not in TRIVIA:
            number = numbers.setdefault(id(scope), len(numbers))
            scopes[number] = scope
            per_node.append((places[id(node)], type(scope).__name__, number))
    facts = {
        key: (
            sorted(
                (a.name, repr(name(getattr(a, "node", None))), a._index)
                for a in scope.assignments  # type: ignore[attr-defined]
            ),
            sorted(
                (
                    repr(name(access.node)),
                    access._index,
                    access.is_annotation,
                    access.is_type_hint,
                    tuple(
                        sorted(
                            (r.name, repr(name(getattr(r, "node", None)))) for r in access.referents
                        )
                    ),
                )
                for access in scope.accesses  # type: ignore[attr-defined]
            ),
        )
        for key, scope in scopes.items()
    }
    return per_node, facts


def test_scope_metadata_is_libcst_s() -> None:
    source = EXTRA + b"\n" + (ROOT / "migrator" / "pipeline" / "transform.py").read_bytes()
    module = cst.parse_module(source)
    ours_contexts = Wrapper(module, unsafe_skip_copy=True).resolve(ExpressionContextProvider)
    theirs_contexts = MetadataWrapper(module, unsafe_skip_copy=True).resolve(
        ExpressionContextProvider
    )
    assert dict(ours_contexts) == dict(theirs_contexts)
    assert len(ours_contexts) > 1_000
    accesses = 0
    hints = []
    for source in (TYPED, TYPED.replace(b"typing", b"hinting")):
        module = cst.parse_module(source)
        ours = Wrapper(module, unsafe_skip_copy=True, source=source).resolve(ScopeProvider)
        theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
        facts = _scope_facts(ours, module)
        assert facts == _scope_facts(theirs, module)
        hints.append(sum(a[3] for _, found in facts[1].values() for a in found))
    # TypeVar's "Model" and int, NewType's and cast's "Model", and Literal, a subscripted typing
    # name: what typing's names change is in the comparison.
    assert hints == [5, 0]
    for source, module in parsed():
        # Given the bytes, a file that never spells `typing` skips the scope analysis's questions
        # about it (one that does must not, which TYPED checks).
        ours = Wrapper(module, unsafe_skip_copy=True, source=source).resolve(ScopeProvider)
        theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
        # The scope of trivia is not recorded (nothing asks it), all the rest is libcst's.
        assert not any(type(node) in TRIVIA for node in ours)
        assert len(ours) == sum(type(node) not in TRIVIA for node in theirs)
        facts = _scope_facts(ours, module)
        assert facts == _scope_facts(theirs, module)
        accesses += sum(len(found) for _, found in facts[1].values())
    assert accesses > 5_000
    assert untyped_scope.KNOWN  # the pinned libcst: the skip is what is tested


# typing's NewType, TypeVar, cast and Literal change what the scope analysis records: the string
# arguments of the first three are read as type hints (accesses of `Model`), Literal's are not
# read at all.
TYPED = b"""
import typing
from typing import Literal, NewType as Kind, cast
T = typing.TypeVar("T", "Model", int)
Id = Kind("Id", "Model")
m = cast("Model", object())
x: typing.List["Model"] = []
y: Literal["Model"] = "Model"
class Model: pass
"""


def test_a_built_tree_is_copied_only_where_a_node_appears_twice() -> None:
    """Metadata is keyed by node: a node met twice would get one parent, one scope."""
    module = cst.parse_module(b"x = f(1)\ny = g(2)\n")
    assert Wrapper.of_built(module).module is module
    name = cst.Name("x")
    twice = cst.Module(
        body=[cst.SimpleStatementLine([cst.Expr(name)]), cst.SimpleStatementLine([cst.Expr(name)])]
    )
    space = cst.SimpleWhitespace(" ")  # trivia counts too
    spaced = cst.Module(
        body=[
            cst.SimpleStatementLine(
                [cst.Assign([cst.AssignTarget(cst.Name(n), space, space)], cst.Integer("1"))]
            )
            for n in "ab"
        ]
    )
    for built in (twice, spaced):
        wrapper = Wrapper.of_built(built)
        assert wrapper.module is not built
        assert wrapper.module.code == built.code
        parents = wrapper.resolve(ParentProvider)
        names = [n for n in parents if isinstance(n, cst.Name)]
        assert len(names) == 2 and len({id(n) for n in names}) == 2
