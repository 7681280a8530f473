"""Start lines of nodes, as PositionProvider gives them, without resolving PositionProvider.

PositionProvider generates the code of the whole file while recording a position for every node,
some 35 ms for a 270-line file, yet the analyzers only ask for a dozen lines (for findings). A
node's line is the number of lines before its top-level statement plus its line inside that
statement. The first part only needs the code of the statements before it (plain code generation,
several times cheaper), the second a PositionProvider run over that one statement; both are done
on demand and cached, so a file costs at most one plain code generation plus the positions of the
statements that were asked about.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst import MetadataDependent
from libcst.metadata import BaseMetadataProvider, CodeRange, MetadataWrapper, PositionProvider

from migrator.codemods.shared.parents import ParentProvider

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
        self._before: dict[cst.CSTNode, int] = {}  # top-level statement -> lines before it
        self._scanned = 0  # statements of module.body whose `_before` is known
        self._lines = sum(count_newlines(module.code_for_node(h)) for h in module.header)
        self._inside: dict[cst.CSTNode, Positions] = {}
        self._headers: dict[cst.CSTNode, tuple[cst.CSTNode, Positions]] = {}
        self._everything: Positions | None = None

    def line(self, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> int:
        """`parents` is the module's ParentProvider mapping."""
        stmt, below = self._top_level(node, parents)
        if stmt is None:
            return self._fallback(node)
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)) and below is not stmt.body:
            # The class or function line itself, a base, a decorator: its header is enough.
            header, positions = self._header_positions(stmt)
            return self._lines_before(stmt) + positions[header if node is stmt else node].start.line
        return self._lines_before(stmt) + self._positions(stmt)[node].start.line

    def _top_level(
        self, node: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]
    ) -> tuple[cst.BaseStatement | None, cst.CSTNode | None]:
        """The statement of the module body that holds `node` (or is it), with its child that
        holds `node` (None when it is `node`); None outside the body."""
        below = None
        parent = parents.get(node)
        while parent is not None and parent is not self.module:
            below, node, parent = node, parent, parents.get(parent)
        if parent is self.module and isinstance(node, cst.BaseStatement):
            return node, below
        return None, None

    def _lines_before(self, stmt: cst.BaseStatement) -> int:
        """Lines of the header and of the statements before `stmt`, counted as far as needed."""
        body = self.module.body
        while stmt not in self._before and self._scanned < len(body):
            current = body[self._scanned]
            self._before[current] = self._lines
            self._lines += count_newlines(self.module.code_for_node(current))
            self._scanned += 1
        return self._before[stmt]

    def _positions(self, stmt: cst.BaseStatement) -> Positions:
        """PositionProvider over a module holding only `stmt`: its lines, counted from 1.

        A statement's code does not depend on where it stands (a top-level statement carries its
        own leading blank lines and comments), so only the file's indent and newline are kept.
        Skipping the copy keeps the node objects, so the mapping answers for the real nodes.
        The provider is run directly: `MetadataWrapper.resolve` would add a walk over the
        statement for batchable providers (there are none), which costs as much as the positions.
        """
        found = self._inside.get(stmt)
        if found is None:
            alone = cst.Module(
                body=(stmt,),
                header=(),
                footer=(),
                default_indent=self.module.default_indent,
                default_newline=self.module.default_newline,
            )
            found = PositionProvider()._gen(MetadataWrapper(alone, unsafe_skip_copy=True))
            self._inside[stmt] = found
        return found

    def _header_positions(
        self, stmt: cst.ClassDef | cst.FunctionDef
    ) -> tuple[cst.CSTNode, Positions]:
        """Positions of a copy of `stmt` whose body is one `pass`, with the copy: everything
        before the body is the same nodes at the same places, at a fraction of a long class's
        cost. The body comes last in the code of both, so it moves nothing before it."""
        found = self._headers.get(stmt)
        if found is None:
            header = stmt.with_changes(
                body=cst.IndentedBlock(body=(cst.SimpleStatementLine((cst.Pass(),)),))
            )
            found = self._headers[stmt] = (header, self._positions(header))
        return found

    def _fallback(self, node: cst.CSTNode) -> int:
        """The module itself and its header/footer comments: resolve the whole file, once."""
        if self._everything is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._everything = wrapper.resolve(PositionProvider)
        return self._everything[node].start.line


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
