"""The package's shape: no import circles, no module past the size a reader can hold.

Read with `ast` from the files themselves (nothing is imported), so a circle hidden behind
`if TYPE_CHECKING:` counts as one: it is a cycle in the design even where it is not one at run
time. A function-level import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from cli_runner import REPO_ROOT

PACKAGES = ("npu_lossscale", "migrator")
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            # The longest module the dotted name starts with: `from a.b import c` names a.b.c
            # when c is a module, else a.b.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package_edges_only(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its own modules is no circle: drop child -> parent edges
    where the parent is the package the child sits in."""
    return {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }


def test_the_checker_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert _cycles(_package_edges_only(_graph())) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_the_size_limit(package: str) -> None:
    long = {
        str(path.relative_to(REPO_ROOT)): n
        for name, path in _modules().items()
        if name.split(".")[0] == package
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_library_parses_as_python_37() -> None:
    """The library runs on TF 1.15's Python 3.7: no walrus, no positional-only parameters and
    the like (a run-time ``X | Y`` needs a stack's run to find; this catches the grammar)."""
    newer = []
    for name, path in _modules().items():
        if name.split(".")[0] != "npu_lossscale":
            continue
        try:
            ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 7))
        except SyntaxError as error:
            newer.append(f"{path.relative_to(REPO_ROOT)}:{error.lineno}: {error.msg}")
    assert newer == []
