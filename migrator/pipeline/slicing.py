"""Long files: port only the top-level statements that can matter, then splice the edits back.

libcst costs about a millisecond per line to parse and more for its metadata, and its scope
analysis is quadratic in a module that assigns and reads one name many times (generated code: a
20,000-line file with one loss-scale call took minutes). The codemods only read and edit the
statements that spell out an API, the imports, and the statements those share names with, so on a
long file everything else is left out of what libcst sees. Each run of left-out statements becomes
one `pass` line carrying a unique comment: the view stays a valid module with the same statement
structure (an import block still ends where it ended), and the unique lines anchor the edits when
they are put back into the original bytes at the lines they came from.

The selection is conservative (a statement is kept when in doubt) and checked: the test suite ports
every fixture both ways and requires the same bytes and findings.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Sequence

from migrator.findings import MigrationResult
from migrator.report.linediff import LineMatcher
from migrator.selection.prefilter import LOSS_SCALE_TRIGGERS
from migrator.selection.triage import FRAMEWORK_PARTS
from migrator.sources import pytree

MIN_LINES = 2000
"""Below this, libcst on the whole file is cheap and the view is not worth building."""

# A statement that spells any of these is kept: what the codemods rewrite or decide by (Keras
# flavour, Horovod and tf.distribute for is_distributed, optimizer classes and constructors).
_KEEP_BYTES: tuple[bytes, ...] = (
    *LOSS_SCALE_TRIGGERS,
    b"GradScaler",
    b"keras",
    b"Keras",
    b"horovod",
    b"hvd",
    b"distribute",
    b"Strategy",
    b"Optimizer",
    b"optimizer",
    b"apply_gradients",
    b"global_step",
    b"getattr",
    b"contrib",
    b"npu",
    b"__all__",
    # What tells an optimizer of unseen kind apart (loss_scale.py's optimizer-kind check): Keras's
    # training calls, and TF 1-only symbols.
    b".fit",
    b".compile(",
    b"train_on_batch",
    b"Session",
    b"placeholder",
    b"compat.v1",
    b"get_variable",
    b"variable_scope",
    b"estimator",
    b"global_variables_initializer",
    b"ConfigProto",
    b"tf.flags",
    b"tf.app",
    b"tf.logging",
    b"tf.layers",
    b"LEGACY_KERAS",
    # An entry block marks a program of its own, which keras_facts reads (an evaluation script
    # that sets a mixed_float16 policy is not warned); it need not share a name with the rest.
    b"__main__",
)
# One scan per chunk for all of them (a substring test per word was most of the view's time).
_KEEP = re.compile(b"|".join(re.escape(word) for word in _KEEP_BYTES))
# "line N" in a finding's message names a line of the view; expand() maps it like the finding's.
_LINE_REF = re.compile(r"\bline (\d+)\b")


@dataclasses.dataclass(frozen=True)
class View:
    """The smaller module the codemods see, and how its lines map to the original's."""

    original: bytes
    source: bytes
    origin: tuple[int, ...]  # 1-based original line of each view line (a placeholder: its run's)
    placeholders: frozenset[int]  # 0-based view lines that stand for left-out statements
    starts: tuple[int, ...] = ()  # 0-based original lines where its top-level statements start

    def line(self, view_line: int) -> int:
        """The original line of a 1-based view line."""
        if 1 <= view_line <= len(self.origin):
            return self.origin[view_line - 1]
        return view_line

    def expand(self, result: MigrationResult) -> MigrationResult | None:
        """The result on the original bytes; None when an edit touched a left-out run (the
        caller then ports the whole file)."""
        findings = [
            dataclasses.replace(
                f,
                line=self.line(f.line),
                message=_LINE_REF.sub(lambda m: f"line {self.line(int(m[1]))}", f.message),
            )
            for f in result.findings
        ]
        if result.new_source == result.old_source:
            return dataclasses.replace(
                result, old_source=self.original, new_source=self.original, findings=findings
            )
        new = self._splice(result.new_source)
        if new is None:
            return None
        return dataclasses.replace(
            result, old_source=self.original, new_source=new, findings=findings
        )

    def _splice(self, new_view: bytes) -> bytes | None:
        old = self.source.splitlines(keepends=True)
        new = new_view.splitlines(keepends=True)
        lines = self.original.splitlines(keepends=True)
        out: list[bytes] = []
        done = 0  # original lines [0, done) are in `out` already
        for tag, i1, i2, j1, j2 in LineMatcher(old, new).get_opcodes():
            if tag == "equal":
                continue
            if any(i in self.placeholders for i in range(i1, i2)):
                return None
            # Replaced lines sit in kept statements, whose lines are contiguous in the original;
            # an insertion goes right after the view line before it, as in the view.
            start = self.origin[i1] - 1 if i1 < i2 else self._after(i1)
            stop = self.origin[i2 - 1] if i1 < i2 else start
            out += lines[done:start]
            out += new[j1:j2]
            done = stop
        out += lines[done:]
        return b"".join(out)

    def _after(self, index: int) -> int:
        """The original 0-based line where text inserted before view line `index` goes."""
        if index == 0:
            return self.origin[0] - 1 if self.origin else 0
        previous = index - 1
        if previous in self.placeholders:
            # After a left-out run: before the next kept line (or at the end of the file).
            return self.origin[index] - 1 if index < len(self.origin) else len(self._lines)
        return self.origin[previous]

    @property
    def _lines(self) -> list[bytes]:
        return self.original.splitlines(keepends=True)


def view_of(source: bytes) -> View | None:
    """The view of a long file, or None where the whole file must be ported (short, does not
    parse, or nearly everything is kept)."""
    lines = source.splitlines(keepends=True)
    if len(lines) < MIN_LINES:
        return None
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None  # the full pass reports it with its location
    chunks = _chunks(tree.body, len(lines))
    if chunks is None:
        return None
    keep = _kept(chunks, lines)
    if all(keep):
        return None
    return _build(source, lines, chunks, keep)


@dataclasses.dataclass
class _Chunk:
    """Top-level statements that start on one line, with the lines up to the next one (0-based)."""

    start: int
    stop: int
    statements: list[ast.stmt]


def _chunks(body: Sequence[ast.stmt], line_count: int) -> list[_Chunk] | None:
    chunks: list[_Chunk] = []
    reach = -1  # last 0-based line of the statements seen so far
    for statement in body:
        first = pytree.first_line(statement) - 1
        last = (statement.end_lineno or statement.lineno) - 1
        if chunks and first <= reach:
            chunks[-1].statements.append(statement)  # `a = 1; b = 2`, or a continuation
        else:
            chunks.append(_Chunk(first, first, [statement]))
        reach = max(reach, last)
    if not chunks or reach >= line_count:
        return None  # line counting disagrees with the parser (lone CR etc.): don't guess
    for chunk, following in zip(chunks, chunks[1:]):
        chunk.stop = following.start
    chunks[-1].stop = line_count
    return chunks


def _kept(chunks: list[_Chunk], lines: list[bytes]) -> list[bool]:
    """Which chunks the codemods must see: the first, imports and chunks spelling a keep-word,
    then, to a fixpoint, every chunk binding a word a kept chunk spells, and every chunk spelling
    such a word when it is a module-level variable, function or class, or an API name imported
    by a kept-word import. Plain module imports do not spread: every line reads `tf`."""
    texts = [b"".join(lines[c.start : c.stop]) for c in chunks]
    words = [set(_WORD.findall(text)) for text in texts]
    spelled = [_KEEP.search(text) is not None for text in texts]
    binders: dict[bytes, list[int]] = {}
    spreading: set[bytes] = set()
    keep = []
    for index, chunk in enumerate(chunks):
        binds, imports, api = _bound(chunk.statements, texts[index])
        for name in binds | imports:
            binders.setdefault(name, []).append(index)
        spreading |= binds | api
        keep.append(index == 0 or spelled[index] or bool(imports))
    readers: dict[bytes, list[int]] = {}
    for index, spelt in enumerate(words):
        for name in spelt & spreading:
            readers.setdefault(name, []).append(index)
    pending = [i for i, k in enumerate(keep) if k]
    while pending:
        for name in words[pending.pop()]:
            for other in (*binders.get(name, ()), *readers.get(name, ())):
                if not keep[other]:
                    keep[other] = True
                    pending.append(other)
    return keep


# Every identifier-like word, in code, strings and comments alike: more than the names a chunk
# reads, which only ever keeps more.
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")

# Statements whose module-level bindings are all in their targets (or their own name).
_FLAT = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.FunctionDef, ast.ClassDef)


def _bound(
    statements: Iterable[ast.stmt], text: bytes
) -> tuple[set[bytes], set[bytes], set[bytes]]:
    """Names the statements bind at module level other than by import, names imports bind, and
    those of the latter that name an API (a codemod may rewrite or drop their import).

    Nested blocks (`if`, `try`, `for`, `with`) and functions that declare `global` are walked
    whole, binding more than the module level does, which only ever keeps more."""
    binds: set[str] = set()
    imports: set[str] = set()
    api: set[str] = set()
    for statement in statements:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                dotted = f"{getattr(statement, 'module', None) or ''}.{alias.name}"
                if _names_api(dotted):
                    api.add((alias.asname or alias.name).split(".")[0])
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(statement.name)
        walk_all = b"global" in text or not isinstance(statement, _FLAT)
        for node in ast.walk(statement) if walk_all else _targets(statement):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                binds.add(node.id)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                binds.update(node.names)
            elif isinstance(node, ast.alias):
                imports.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                binds.add(node.target.id)
    return _encoded(binds), _encoded(imports), _encoded(api)


def _encoded(names: set[str]) -> set[bytes]:
    return {n.encode() for n in names}


def _names_api(dotted: str) -> bool:
    parts = dotted.split(".")
    return any(p in FRAMEWORK_PARTS for p in parts) or _KEEP.search(dotted.encode()) is not None


def _targets(statement: ast.stmt) -> list[ast.AST]:
    if isinstance(statement, ast.Assign):
        roots: list[ast.AST] = list(statement.targets)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        roots = [statement.target]
    else:
        return []
    nodes: list[ast.AST] = []
    for root in roots:
        if root.__class__ is ast.Name:
            nodes.append(root)  # nothing under a plain name binds (most targets: worth the test)
        else:
            nodes.extend(ast.walk(root))
    return nodes


def _build(source: bytes, lines: list[bytes], chunks: list[_Chunk], keep: list[bool]) -> View:
    newline = b"\r\n" if b"\r\n" in (lines[0] if lines else b"") else b"\n"
    out: list[bytes] = list(lines[: chunks[0].start])
    origin: list[int] = list(range(1, chunks[0].start + 1))
    placeholders: set[int] = set()
    run = 0
    for index, chunk in enumerate(chunks):
        if keep[index]:
            for line in range(chunk.start, chunk.stop):
                out.append(lines[line])
                origin.append(line + 1)
            continue
        if index > 0 and not keep[index - 1]:
            continue  # the run's placeholder is written already
        run += 1
        placeholders.add(len(out))
        out.append(b"pass  # npu-migrate: left-out run %d%s" % (run, newline))
        origin.append(chunk.start + 1)
    starts = tuple(chunk.start for chunk in chunks)
    return View(source, b"".join(out), tuple(origin), frozenset(placeholders), starts)
