"""The outline of a file kept for the global-step plan alone: its classes' headers, bodies blanked.

A file the triage keeps only because the plan needs its facts (`prepare_source(facts_only=True)`)
and that never spells `global_step` holds no step update, so all it contributes is its
module-level classes: each one's name, line and base classes as the module's names resolve them
and, for a class that defines `apply_gradients`, that method and the methods it calls
(migrator.codemods.global_step.classes). The bodies of its functions and of its other classes are
most of what libcst parsed and resolved for such a file (the model files of a framework trainer:
27 files of the dense speed tree, 54% of their lines in functions, 35% in classes). The outline
writes `pass` on the first line of each of those bodies and leaves the rest of it blank, so every
line that stays is where it was (the facts' lines need no mapping) and what binds the module's
names is untouched: only a `global` statement in a body binds one, and a file where that name is
read by a class is not outlined.

The plan facts of the outline equal the whole file's on every such file of the speed trees and
the real-code set; the test suite checks it on its fixtures.
"""

from __future__ import annotations

import ast
import re

from migrator.sources import pytree

_GLOBAL = re.compile(rb"\bglobal\b")


def outline(source: bytes) -> bytes | None:
    """The file with the bodies of its top-level functions, and of its top-level classes that do
    not spell `apply_gradients`, blanked; None when nothing is blanked or the file cannot be
    outlined safely (it does not parse, has a lone CR, or a `global` statement binds a name a
    class reads)."""
    if source.count(b"\r") != source.count(b"\r\n"):
        return None
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None
    lines = source.splitlines(keepends=True)
    if _GLOBAL.search(source) and _binds_what_classes_read(tree, lines):
        return None
    blanked = False
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef):
            if _kept_whole(statement, lines):
                continue
        elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        row = _body_row(statement, lines)
        if row is None:
            continue
        line = lines[row]
        indent = line[: len(line) - len(line.lstrip(b" \t\f"))]
        lines[row] = indent + b"pass" + _ending(line)
        for index in range(row + 1, statement.end_lineno or row + 1):
            lines[index] = _ending(lines[index])
        blanked = True
    return b"".join(lines) if blanked else None


def _binds_what_classes_read(tree: ast.Module, lines: list[bytes]) -> bool:
    """Whether a `global` statement names a name a top-level class reads in its header, or
    anywhere in a class kept whole (`def _load(): global tf; import tensorflow as tf`): blanking
    the function that says it would change what the name resolves to."""
    declared = {
        name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names
    }
    if not declared:
        return False
    read: list[ast.AST] = []
    for statement in tree.body:
        if not isinstance(statement, ast.ClassDef):
            continue
        if _kept_whole(statement, lines):
            read.append(statement)
        else:
            read += [*statement.bases, *(k.value for k in statement.keywords)]
    return any(
        isinstance(node, ast.Name) and node.id in declared
        for part in read
        for node in ast.walk(part)
    )


def _kept_whole(statement: ast.ClassDef, lines: list[bytes]) -> bool:
    return b"apply_gradients" in b"".join(lines[statement.lineno - 1 : statement.end_lineno])


def _body_row(statement: ast.stmt, lines: list[bytes]) -> int | None:
    """The 0-based line the body of a function or class starts on, when no part of the header
    shares it (`def f(): return 1` keeps its body)."""
    first = statement.body[0]  # type: ignore[attr-defined]
    decorators = getattr(first, "decorator_list", [])
    row = min([first.lineno, *(d.lineno for d in decorators)]) - 1
    if row >= len(lines) or row < statement.lineno:
        return None
    # A decorated or compound first statement cannot share the header's line; a simple one
    # can, after the colon.
    if not decorators and lines[row][: first.col_offset].strip():
        return None
    return row


def _ending(line: bytes) -> bytes:
    return line[len(line.rstrip(b"\r\n")) :]
