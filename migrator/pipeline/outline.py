"""The outline of a file kept for the global-step plan alone: the bodies no plan fact is read from,
blanked.

A file the triage keeps only because the plan needs its facts (`prepare_source(facts_only=True)`)
contributes its module-level classes (name, line, base classes as the module's names resolve
them and, for a class that defines `apply_gradients`, that method and the methods it calls) and
its functions and methods that update `global_step` by hand (migrator.codemods.global_step).
Each of those is read from the function or class itself and from the names bound at module
level. The other functions, methods and class bodies are most of what libcst parsed and resolved
for such files (the model files of a framework trainer: in 27 such files of the dense speed tree,
54% of the lines were in top-level functions and 35% in classes), so the outline writes `pass` on
the first line of each of those bodies and leaves the rest of it blank. Every line that stays is
where it was (the facts' lines need no mapping).

A body is kept whole where its text spells what a fact is read from (`global_step`,
`apply_gradients`, a loss-scale trigger, or a name an import binds to one of those), or the word
`global`: a function saying `global x` binds a module-level name other code resolves through. A
kept class that does not define `apply_gradients` has its methods outlined the same way. A name
defined twice in the same body is kept whole, since a step function's key counts the functions of
the same name before it. The plan facts of the outline equal the whole file's on every file of
the speed trees, the real-code set and the tests (tests/migrator/test_outline.py checks the
fixtures).
"""

from __future__ import annotations

import ast
import collections
import re

from migrator.selection.prefilter import LOSS_SCALE_TRIGGERS
from migrator.sources import pytree

_KEEP = re.compile(
    rb"\bglobal\b|"
    + b"|".join(re.escape(w) for w in (b"global_step", b"apply_gradients", *LOSS_SCALE_TRIGGERS))
)
# `import ... get_global_step as gs`, `from ... import LossScaleOptimizer as LSO`.
_ALIAS = re.compile(rb"(\w+)\s+as\s+(\w+)")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def outline(source: bytes) -> bytes | None:
    """The file with the bodies of its functions, methods and classes that cannot hold a plan fact
    blanked; None when nothing is blanked, or the file does not parse or has a lone CR."""
    if source.count(b"\r") != source.count(b"\r\n"):
        return None
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None
    lines = source.splitlines(keepends=True)
    return b"".join(lines) if _blank(tree.body, lines, _kept(source)) else None


def _blank(statements: list[ast.stmt], lines: list[bytes], keep: re.Pattern[bytes]) -> bool:
    """Blank, in `lines`, the bodies of the functions and classes among `statements` that `keep`
    finds nothing in, and the methods of the kept classes that do not define apply_gradients
    (whose other methods the class facts read); whether any was blanked."""
    blanked = False
    defined = collections.Counter(s.name for s in statements if isinstance(s, _DEFS))
    for statement in statements:
        if not isinstance(statement, _DEFS) or defined[statement.name] > 1:
            continue
        text = b"".join(lines[statement.lineno - 1 : statement.end_lineno])
        if keep.search(text):
            if isinstance(statement, ast.ClassDef) and b"apply_gradients" not in text:
                blanked |= _blank(statement.body, lines, keep)
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
    return blanked


def _kept(source: bytes) -> re.Pattern[bytes]:
    """What keeps a body whole in this file: `_KEEP`, and the names its imports bind to what
    `_KEEP` spells."""
    aliases = sorted({m[2] for m in _ALIAS.finditer(source) if _KEEP.search(m[1])})
    if not aliases:
        return _KEEP
    return re.compile(_KEEP.pattern + b"|" + b"|".join(rb"\b%s\b" % a for a in aliases))


def _body_row(statement: ast.stmt, lines: list[bytes]) -> int | None:
    """The 0-based line the body of a function or class starts on, when no part of the header
    shares it (`def f(): return 1` keeps its body)."""
    first = statement.body[0]  # type: ignore[attr-defined]
    row = pytree.first_line(first) - 1
    if row >= len(lines) or row < statement.lineno:
        return None
    # A decorated or compound first statement cannot share the header's line; a simple one
    # can, after the colon.
    if row + 1 == first.lineno and lines[row][: first.col_offset].strip():
        return None
    return row


def _ending(line: bytes) -> bytes:
    return line[len(line.rstrip(b"\r\n")) :]
