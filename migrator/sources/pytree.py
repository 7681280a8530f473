"""The standard library's tree of a file, parsed once for the triage and the long-file view.

On a long file `ast.parse` is the largest single cost left to those two passes, and when the run
ports one file in-process they read the same bytes one after the other. Only the latest trees
are kept: a tree costs far more memory than its source, and `forget` drops them when a run ends.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator


@functools.lru_cache(maxsize=2)
def parse(source: bytes) -> ast.Module:
    """`ast.parse(source)`; raises as it does (failures are not cached)."""
    return ast.parse(source)


def tree_or_none(source: bytes) -> ast.Module | None:
    """`parse(source)`, or None where the file does not parse: the checks that read a file with
    `ast` alone say nothing then, and the full pass reports the failure in its own words."""
    try:
        return parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def first_line(statement: ast.stmt) -> int:
    """The 1-based line a statement's code starts on: its first decorator's where it has any
    (`ast` gives a decorated definition the line of its `def` or `class`)."""
    decorators = getattr(statement, "decorator_list", [])
    return min([statement.lineno, *(d.lineno for d in decorators)])


def forget() -> None:
    """Drop the kept trees. Left in the cache, a 20,000-line module's tree made the interpreter's
    exit take a second longer than the whole port (freed object by object at shutdown)."""
    parse.cache_clear()


def scopes(tree: ast.Module) -> Iterator[list[ast.AST]]:
    """The nodes of each function (nested ones included), then those of the module's own code:
    the one-function reach of the checks that read a file's own bytes (hand loss scaling,
    gradients that bypass a loss-scale optimizer)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield list(ast.walk(node))
    top = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    yield [n for s in top for n in ast.walk(s)]
