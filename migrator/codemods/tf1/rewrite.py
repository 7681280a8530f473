"""Apply an analysed plan to the tree, touching only the planned nodes.

Everything else is returned as libcst gives it back, so comments and layout of untouched code
survive. The walk only enters the planned nodes and their ancestors (found through the parent
links the analysis already resolved): a handful of paths instead of every node of the file.
Statement-level changes (imports added or dropped, a manager hoisted out of a `with`) are made
while rebuilding each block, so comments on a dropped line move to the next statement instead of
disappearing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import libcst as cst

from migrator.codemods.shared.api import LIBRARY
from migrator.codemods.shared.imports import ImportPlan
from migrator.codemods.shared.nodes import code
from migrator.codemods.shared.plan import Edits
from migrator.codemods.shared.rewriting import PlannedRewriter, comments_of


class PlanRewriter(PlannedRewriter):
    """Applies an `Edits` plan and an `ImportPlan`; `names` are the local names of the classes."""

    def __init__(
        self,
        edits: Edits,
        imports: ImportPlan,
        names: Mapping[str, str],
        parents: Mapping[cst.CSTNode, cst.CSTNode],
    ) -> None:
        super().__init__(_planned_nodes(edits, imports), parents, edits.removals)
        self.edits = edits
        self.imports = imports
        self.names = names
        self._updated: dict[int, cst.BaseStatement] = {}
        # Keyed by id() but holding the node itself: a freed node's id can be reused by a node
        # built later, which would then be dropped in its place (user code lost).
        self._dropped: dict[int, cst.SimpleStatementLine] = {}
        self._hoisted: dict[int, cst.BaseStatement] = {}

    # ----------------------------------------------------------------- expressions
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        edit = self.edits.calls.get(original)
        if edit is None:
            return updated
        args = edit.build(updated.args, self.names) if edit.build else list(updated.args)
        return updated.with_changes(func=_expression(self.names[edit.target]), args=args)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self._ref(original, updated)

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        return self._ref(original, updated)

    def _ref(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        target = self.edits.refs.get(original)
        if target is None:
            return updated
        return _expression(self.names[target]).with_changes(lpar=updated.lpar, rpar=updated.rpar)

    # ----------------------------------------------------------------- imports
    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        if self._rebinds(original):
            # Other files import these names from this module: bind them to npu_lossscale here.
            pairs = self.edits.rebinds[original]
            return updated.with_changes(
                module=cst.Name(LIBRARY),
                names=[
                    cst.ImportAlias(cst.Name(cls), cst.AsName(cst.Name(name)))
                    if cls != name
                    else cst.ImportAlias(cst.Name(cls))
                    for cls, name in pairs
                ],
                lpar=None,
                rpar=None,
            )
        extra = self.imports.merge.get(original)
        if not extra or isinstance(updated.names, cst.ImportStar):
            return self.drop_aliases(original, updated)
        aliases = list(updated.names) + [
            cst.ImportAlias(
                name=cst.Name(n),
                asname=None if n == local else cst.AsName(name=cst.Name(local)),
            )
            for n, local in extra
        ]
        aliases.sort(key=lambda a: code(a.name))
        aliases = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in aliases]
        return updated.with_changes(names=aliases)

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        body = [
            small for old, small in zip(original.body, updated.body) if not self._fully_removed(old)
        ]
        if not body:
            self._dropped[id(updated)] = updated
            return updated
        if len(body) != len(updated.body):
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            updated = updated.with_changes(body=body)
        return updated

    def _rebinds(self, original: cst.CSTNode) -> bool:
        """Whether an import the port removes whole is instead re-pointed at npu_lossscale."""
        gone = self.edits.removals.get(original)
        names = getattr(original, "names", None)
        return (
            original in self.edits.rebinds
            and isinstance(names, Sequence)
            and gone is not None
            and len(gone) == len(names)
        )

    def _fully_removed(self, small: cst.BaseSmallStatement) -> bool:
        if self._rebinds(small):
            return False
        return self.emptied(small)

    # ----------------------------------------------------------------- hoisting
    def leave_With(self, original: cst.With, updated: cst.With) -> cst.With:
        statement = self.edits.hoists.get(original)
        if statement is None or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        moved = self._updated[id(statement)]
        rest = [s for s in updated.body.body if s is not moved]
        self._hoisted[id(original)] = moved
        return updated.with_changes(
            body=updated.body.with_changes(body=rest or [cst.SimpleStatementLine([cst.Pass()])]),
        )

    # ----------------------------------------------------------------- blocks
    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if original not in self._enter:
            return updated
        body, footer = self._rebuild(original.body, updated.body, updated.footer)
        return updated.with_changes(body=body, footer=footer)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body, footer = self._rebuild(original.body, updated.body, updated.footer)
        return updated.with_changes(body=body, footer=footer)

    def _rebuild(
        self,
        originals: Sequence[cst.BaseStatement],
        updated: Sequence[cst.BaseStatement],
        footer: Sequence[cst.EmptyLine],
    ) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
        out: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        if len(originals) != len(updated):
            raise AssertionError("a statement vanished while rewriting; refusing to continue")
        for old, new in zip(originals, updated):
            after = self.imports.after.get(old, [])
            added = list(self.imports.before.get(old, []))
            kept = id(new) not in self._dropped
            if kept:
                hoisted = self._hoisted.get(id(old))
                added.extend([hoisted, new] if hoisted is not None else [new])
            else:
                carried.extend(comments_of(new))
            added.extend(after)
            if added and carried:
                added[0] = _with_leading(added[0], carried)
                carried = []
            if kept:
                # leave_With finds a hoisted statement by identity among its block's statements
                self._updated[id(old)] = added[len(added) - len(after) - 1]
            out.extend(added)
        if not out:
            out.append(cst.SimpleStatementLine([cst.Pass()]))
            out[0] = _with_leading(out[0], carried)
            carried = []
        return out, [*carried, *footer]


def _expression(dotted: str) -> cst.Name | cst.Attribute:
    """`a.b.C` as an expression: a local name, or a class reached through an imported module."""
    head, *rest = dotted.split(".")
    node: cst.Name | cst.Attribute = cst.Name(head)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _planned_nodes(edits: Edits, imports: ImportPlan) -> Iterable[cst.CSTNode]:
    """Every original node the rewrite replaces, edits or places statements around."""
    yield from edits.calls
    yield from edits.refs
    yield from edits.removals
    yield from edits.hoists
    yield from edits.hoists.values()
    yield from imports.before
    yield from imports.after
    yield from imports.merge


def _with_leading(statement: cst.BaseStatement, extra: list[cst.EmptyLine]) -> cst.BaseStatement:
    if not extra:
        return statement
    return statement.with_changes(leading_lines=[*extra, *statement.leading_lines])
