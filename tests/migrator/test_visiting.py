"""The rebuild-free walk (migrator.codemods.shared.visiting) calls a visitor exactly as libcst's
own `visit` does: same methods, same nodes, same order, attribute hooks included."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from migrator.codemods.shared.visiting import Wrapper, visit

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


class BatchedOneHook(CallHooks, cst.BatchableCSTVisitor):
    pass


def modules() -> list[cst.Module]:
    found = [cst.parse_module(EXTRA)]
    for path in SOURCES:
        try:
            found.append(cst.parse_module(path.read_bytes()))
        except cst.ParserSyntaxError:
            continue  # fixtures that do not parse on purpose
    return found


def test_same_calls_as_libcst_with_attribute_hooks() -> None:
    total = 0
    for module in modules():
        ours, theirs = Recorder(cst.Lambda), Recorder(cst.Lambda)
        visit(module, ours)
        module.visit(theirs)
        assert ours.calls == theirs.calls
        total += len(ours.calls)
    assert total > 50_000


def test_same_calls_as_libcst_without_attribute_hooks() -> None:
    for module in modules():
        ours, theirs = Plain(), Plain()
        visit(module, ours)
        module.visit(theirs)
        assert ours.calls == theirs.calls


def test_same_calls_as_libcst_with_hooks_on_one_node_type() -> None:
    hooked = 0
    for module in modules():
        ours, theirs = OneHook(), OneHook()
        visit(module, ours)
        module.visit(theirs)
        assert ours.calls == theirs.calls
        batched_ours, batched_theirs = BatchedOneHook(), BatchedOneHook()
        Wrapper(module, unsafe_skip_copy=True).visit_batched([batched_ours])
        MetadataWrapper(module, unsafe_skip_copy=True).visit_batched([batched_theirs])
        assert batched_ours.calls == batched_theirs.calls == theirs.calls
        hooked += sum(kind != "name" for kind, _ in ours.calls)
    assert hooked > 1_000


def test_scope_metadata_is_libcst_s() -> None:
    source = EXTRA + b"\n" + (ROOT / "migrator" / "pipeline" / "transform.py").read_bytes()
    module = cst.parse_module(source)
    ours = Wrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    assert ours.keys() == theirs.keys()
    for node, scope in theirs.items():
        mine = ours[node]
        assert type(mine) is type(scope)
        assert {
            (name, tuple(sorted(id(a.node) for a in scope.assignments[name])))
            for name in scope._assignments
        } == {
            (name, tuple(sorted(id(a.node) for a in mine.assignments[name])))
            for name in mine._assignments
        }
