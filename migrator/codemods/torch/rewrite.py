"""Apply a torch scaler plan to the tree, touching only the planned nodes.

Everything else comes back as libcst gives it, so comments and layout of untouched code survive.
The walk enters only the planned nodes and their ancestors. An import statement the port empties
is replaced by the new import when one goes after it (its blank lines and comments stay), or
dropped with its comments moved to the next statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import libcst as cst

from migrator.codemods.shared.rewriting import PlannedRewriter, comments_of
from migrator.codemods.torch.plan import TorchPlan


class TorchRewriter(PlannedRewriter):
    """Applies a `TorchPlan`."""

    def __init__(self, plan: TorchPlan, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> None:
        planned: list[cst.CSTNode] = [*plan.calls, *plan.refs, *plan.removals, *plan.after]
        super().__init__(planned, parents, plan.removals)
        self.plan = plan
        # statement -> what it became: None when dropped (keyed by the original node)
        self._statements: dict[cst.SimpleStatementLine, cst.SimpleStatementLine | None] = {}

    # ----------------------------------------------------------------- expressions
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        build = self.plan.calls.get(original)
        if build is None:
            return updated
        args = build(updated.args)
        if not args:
            return updated.with_changes(args=(), whitespace_before_args=cst.SimpleWhitespace(""))
        return updated.with_changes(args=args)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self._ref(original, updated)

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        return self._ref(original, updated)

    def _ref(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        target = self.plan.refs.get(original)
        if target is None:
            return updated
        new = cst.parse_expression(target)
        return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    # ----------------------------------------------------------------- imports
    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        return self.drop_aliases(original, updated)

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        body = [s for old, s in zip(original.body, updated.body) if not self.emptied(old)]
        after = self.plan.after.get(original, [])
        if not body and after:
            # The new import takes the emptied statement's place, blank lines and comments too.
            first = cst.parse_statement(after[0] + "\n")
            assert isinstance(first, cst.SimpleStatementLine)
            updated = updated.with_changes(body=first.body)
        elif not body:
            self._statements[original] = None
            return updated
        elif len(body) != len(updated.body):
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            updated = updated.with_changes(body=body)
        self._statements[original] = updated
        return updated

    # ----------------------------------------------------------------- blocks
    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
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
        for old, new in zip(originals, updated):
            if isinstance(old, cst.SimpleStatementLine) and old in self._statements:
                now = self._statements[old]
                if now is None:
                    # its comments move on, and a blank line that set its group apart
                    blank = bool(old.leading_lines) and old.leading_lines[0].comment is None
                    carried.extend([cst.EmptyLine()] if blank and not carried else [])
                    carried.extend(comments_of(old))
                    continue
                after = self.plan.after.get(old, [])
                emptied = all(self.emptied(s) for s in old.body)
                added = [now, *(cst.parse_statement(x + "\n") for x in after[int(emptied) :])]
            elif old in self.plan.after:  # a try/except or if/else choosing torch's scaler
                lines = [cst.parse_statement(x + "\n") for x in self.plan.after[old]]
                if old in self.plan.collapse:
                    lines[0] = lines[0].with_changes(leading_lines=old.leading_lines)
                    added = lines
                else:
                    added = [new, *lines]
            else:
                added = [new]
            if carried:
                own = list(added[0].leading_lines)
                if own and own[0].comment is None and carried[0].comment is None:
                    carried = carried[1:]  # one blank line, not two
                added[0] = added[0].with_changes(leading_lines=[*carried, *own])
                carried = []
            out.extend(added)
        if not out:
            out.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=carried))
            carried = []
        return out, [*carried, *footer]
