"""Start lines of nodes, as PositionProvider gives them, without resolving PositionProvider.

PositionProvider generates the code of the whole file while recording a position for every node,
some 35 ms for a 270-line file, yet the analyzers only ask for a dozen lines (for findings). A
node's line is the line its innermost statement or clause (`_OWNERS`: a line, or a header)
begins on, plus its line in the code of that statement or clause alone, generated only up to
the node (`_Until` stops where PositionProvider would take the start): a line or a header, not
the blocks before it.

For a module just parsed from bytes, where each statement and clause begins needs no code
generation at all: the tokenizer pass that checks the bytes before parsing
(migrator.sources.limits) notes the line of the first token of each, in source order, and a
statement's code begins there less its own leading blank and comment lines. The parse hands them
over (`remember_starts`), and they are paired with the tree's statements and clauses in the same
order. (Generating the code before each asked statement was 7% of the dense tree's libcst CPU;
generating a statement's code to find where its nested statements begin, 5%.)

Otherwise (a tree the codemods built) the lines before a top-level statement are counted on the
code of the statements before it, and a statement's first lookup generates its code up to the
node; one asked about again has its code generated once, noting where each statement and
clause in it begins (`_begins`). Code is generated without libcst's context manager per node
and cached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import libcst as cst
from libcst import MetadataDependent
from libcst.metadata import BaseMetadataProvider, CodeRange, MetadataWrapper, PositionProvider

from migrator.codemods.shared.codegen import NO_RECORD, PlainState, node_code
from migrator.codemods.shared.parents import ParentProvider
from migrator.sources.limits import Starts

Positions = Mapping[cst.CSTNode, CodeRange]


def count_newlines(code: str) -> int:
    """Line breaks as libcst counts them: `\\r\\n`, a lone `\\r` and a lone `\\n` are one each.

    (The number of matches of libcst's `NEWLINE_RE`, `\\r\\n?|\\n`.)"""
    return code.count("\n") + code.count("\r") - code.count("\r\n")


class LineIndex:
    """Answers `line(node, parents)` for the nodes of one module, as PositionProvider would.

    libcst counts lines token by token while we count them on each statement's code, which can
    only differ where one token ends in `\\r` and the next starts with `\\n`; code that libcst
    parsed never has that (the two would have been read as one `\\r\\n`).
    """

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self._starts = _remembered(module)
        self._position: dict[cst.CSTNode, int] = {}  # top-level statement -> its index
        self._before: dict[cst.CSTNode, int] = {}  # top-level statement -> lines before it
        self._scanned = 0  # statements of module.body whose `_before` is known
        self._lines = sum(count_newlines(self._code(h)) for h in module.header)
        self._inside: dict[cst.CSTNode, dict[cst.CSTNode, int]] = {}  # see `_begins`
        self._asked: dict[cst.CSTNode, int] = {}
        self._everything: Positions | None = None

    def line(self, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> int:
        """`parents` is the module's ParentProvider mapping."""
        found = self._top_level(node, parents)
        if found is None:
            return self._fallback(node)
        stmt, inner = found
        begins = self._inside.get(stmt)
        if begins is None:
            begins = self._begins_from_tokens(stmt)
            if begins is None:
                asked = self._asked[stmt] = self._asked.get(stmt, 0) + 1
                if asked <= PARTIAL_LOOKUPS:
                    within = _start_line(stmt, node, self.module)
                    if within is not None:
                        return self._lines_before(stmt) + within
                before = self._lines_before(stmt)
                begins = {n: before + line for n, line in _begins(stmt, self.module).items()}
            self._inside[stmt] = begins
        within = _start_line(inner, node, self.module)
        if within is None or inner not in begins:  # never met: see `_begins_from_tokens`
            return self._fallback(node)
        return begins[inner] + within - 1

    def _top_level(
        self, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]
    ) -> tuple[cst.BaseStatement, cst.CSTNode] | None:
        """The statement of the module body that holds `node` (or is it), and the innermost
        statement or clause that does (see `_OWNERS`); None outside the body."""
        inner = node if _owns_lines(type(node)) else None
        parent = parents.get(node)
        while parent is not None and parent is not self.module:
            node, parent = parent, parents.get(parent)
            if inner is None and _owns_lines(type(node)):
                inner = node
        if parent is self.module and isinstance(node, cst.BaseStatement):
            return node, inner if inner is not None else node
        return None

    def _lines_before(self, stmt: cst.BaseStatement) -> int:
        """Lines of the header and of the statements before `stmt`, counted as far as needed."""
        if self._starts is not None:
            first = self._starts.lines[self._starts.top[self._index(stmt)]]
            return first - 1 - _own_lines_before_token(stmt)
        body = self.module.body
        while stmt not in self._before and self._scanned < len(body):
            current = body[self._scanned]
            self._before[current] = self._lines
            self._lines += count_newlines(self._code(current))
            self._scanned += 1
        return self._before[stmt]

    def _index(self, stmt: cst.BaseStatement) -> int:
        if not self._position:
            self._position = {s: i for i, s in enumerate(self.module.body)}
        return self._position[stmt]

    def _code(self, node: cst.CSTNode) -> str:
        return node_code(node, self.module)

    def _begins_from_tokens(self, stmt: cst.BaseStatement) -> dict[cst.CSTNode, int] | None:
        """The line each statement and clause in `stmt` (itself included) begins on, from where
        the tokenizer saw their first tokens: a statement's code begins with its own blank and
        comment lines. None without the tokenizer's lines, or where they do not pair one to
        one with the statements and clauses of the tree (not met in the tests)."""
        if self._starts is None:
            return None
        owners = _owners(stmt)
        lines = self._starts.inside(self._index(stmt))
        if len(lines) != len(owners):
            return None
        return {o: line - _own_lines_before_token(o) for o, line in zip(owners, lines)}

    def _fallback(self, node: cst.CSTNode) -> int:
        """The module itself and its header/footer comments: resolve the whole file, once."""
        if self._everything is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._everything = wrapper.resolve(PositionProvider)
        return self._everything[node].start.line


def _own_lines_before_token(stmt: cst.BaseStatement) -> int:
    """The blank and comment lines a statement's code starts with, before its first token."""
    lines = len(stmt.leading_lines)
    decorators = getattr(stmt, "decorators", ())
    if decorators:
        lines += len(decorators[0].leading_lines)
    return lines


# id(module) -> (module, where the tokenizer saw its statements start), for the last module
# parsed only: its metadata is resolved before the next parse, and a tree held here stays in
# memory (a 20,000-line module's is a few hundred MB); a module not found falls back to codegen.
_STARTS: dict[int, tuple[cst.Module, Starts]] = {}
_REMEMBERED = 1


def remember_starts(module: cst.Module, starts: Starts | None) -> None:
    """Record, for a module just parsed, where the tokenizer saw its statements start
    (migrator.sources.limits.statement_starts); ignored unless there is one per top-level
    statement."""
    if starts is None or len(starts.top) != len(module.body):
        return
    while len(_STARTS) >= _REMEMBERED:
        del _STARTS[next(iter(_STARTS))]
    _STARTS[id(module)] = (module, starts)


def _remembered(module: cst.Module) -> Starts | None:
    found = _STARTS.get(id(module))
    return found[1] if found is not None and found[0] is module else None


def code_starts(module: cst.Module) -> list[int] | None:
    """The line the code of each top-level statement of a module just parsed begins on (its own
    blank and comment lines first), from the tokenizer's pass; None where it was not remembered."""
    starts = _remembered(module)
    if starts is None:
        return None
    firsts = starts.top_level()
    return [line - _own_lines_before_token(s) for line, s in zip(firsts, module.body)]


PARTIAL_LOOKUPS = 1
"""Without the tokenizer's lines: lookups in one statement answered by generating its code up to
the node (the analyzers ask a few lines per file, mostly in different statements); past that,
the statement's code is generated once with the lines its nested statements begin on."""

# What a node's line is counted from: statements and the clauses of compound ones, each of
# which starts a line of its own.
_OWNERS = (
    cst.BaseStatement,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)
_OWNS: dict[type, bool] = {}


def _owns_lines(node_type: type) -> bool:
    # Cached per type: isinstance against libcst's ABCs is slow.
    found = _OWNS.get(node_type)
    if found is None:
        found = _OWNS[node_type] = issubclass(node_type, _OWNERS)
    return found


class _Marking(PlainState):
    """Generates code, noting the line each statement or clause's code begins on."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(module.default_indent, module.default_newline)
        self.begins: dict[cst.CSTNode, int] = {}
        self._line, self._counted = 1, 0

    def before_codegen(self, node: cst.CSTNode) -> None:
        if _owns_lines(type(node)):
            self._line += count_newlines("".join(self.tokens[self._counted :]))
            self._counted = len(self.tokens)
            self.begins[node] = self._line


def _owners(stmt: cst.BaseStatement) -> list[cst.CSTNode]:
    """`stmt` and the statements and clauses inside it (see `_OWNERS`), in source order: one
    per logical line that does not continue a decorator, as the tokenizer sees them."""
    found: list[cst.CSTNode] = []
    pending: list[cst.CSTNode] = [stmt]
    while pending:
        node = pending.pop()
        found.append(node)
        body = getattr(node, "body", None)
        inner = list(body.body) if isinstance(body, cst.IndentedBlock) else []
        inner += getattr(node, "handlers", ())
        for clause in (getattr(node, "orelse", None), getattr(node, "finalbody", None)):
            if clause is not None:
                inner.append(clause)
        inner += getattr(node, "cases", ())
        pending += reversed(inner)
    return found


def _begins(stmt: cst.BaseStatement, module: cst.Module) -> dict[cst.CSTNode, int]:
    """The line (from 1) each statement and clause in the code of `stmt` alone begins on."""
    state = _Marking(module)
    stmt._codegen(state)
    return state.begins


class _Reached(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _Until(PlainState):
    """Generates code until PositionProvider would know the start of `target`, then stops.

    PositionProvider takes a node's start where its syntactic position is recorded (or, when
    that is hoisted from a child, `start_node`, the child's start), and otherwise where its code
    begins (`before_codegen`); this stops at the same point, with the lines made so far."""

    def __init__(self, target: cst.CSTNode, module: cst.Module) -> None:
        super().__init__(module.default_indent, module.default_newline)
        self.target = target
        self.begins = 0

    def line(self) -> int:
        return 1 + count_newlines("".join(self.tokens))

    def before_codegen(self, node: cst.CSTNode) -> None:
        if node is self.target:
            self.begins = self.line()

    def after_codegen(self, node: cst.CSTNode) -> None:
        if node is self.target:
            raise _Reached(self.begins)

    def record_syntactic_position(
        self, node: object, *, start_node: cst.CSTNode | None = None, **_: object
    ) -> contextlib.nullcontext:
        if node is self.target:
            if start_node is None:
                raise _Reached(self.line())
            self.target = start_node
        return NO_RECORD


def _start_line(stmt: cst.BaseStatement, node: cst.CSTNode, module: cst.Module) -> int | None:
    """PositionProvider's start line of `node` in the code of `stmt` alone; None if the code
    never reaches it."""
    try:
        stmt._codegen(_Until(node, module))
    except _Reached as reached:
        return reached.line
    return None


class LineProvider(BaseMetadataProvider[LineIndex]):
    """Records one LineIndex, on the Module; ask it through `start_line`.

    As metadata it is built once per MetadataWrapper, so the analyzers that share a wrapper
    share its caches. It declares no dependency (the parents come with each question) so that
    libcst resolves it in the same round as the rest: every round walks the whole tree.
    """

    def _gen_impl(self, module: cst.Module) -> None:
        self.set_metadata(module, LineIndex(module))


def start_line(visitor: MetadataDependent, node: cst.CSTNode) -> int:
    """PositionProvider's `.start.line` of `node`, for a visitor that declares LineProvider and
    ParentProvider and runs over a MetadataWrapper."""
    (index,) = visitor.metadata[LineProvider].values()
    return index.line(node, visitor.metadata[ParentProvider])
