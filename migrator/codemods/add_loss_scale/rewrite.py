"""Writes the plan into the tree: the wrap after each anchor, rerouted gradients, the import."""

from __future__ import annotations

import libcst as cst

from migrator.codemods.add_loss_scale.planner import Planner
from migrator.codemods.global_step.edit import template
from migrator.codemods.shared import api
from migrator.codemods.shared.add_loss_scale_choice import manager_call

_MANAGER_VARIABLE = "loss_scale_manager"


class Rewriter(cst.CSTTransformer):
    """Applies the plan: replaced calls, and the wrap after each anchor statement."""

    def __init__(self, planner: Planner) -> None:
        super().__init__()
        self.planner = planner

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        return self.planner.replace.get(id(original), updated)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        updated = super().on_leave(original, updated)
        names = self.planner.after.get(id(original))
        if not names or not isinstance(updated, cst.BaseStatement):
            return updated
        return cst.FlattenSentinel([updated, *self._wrap_statements(names)])

    def _wrap_statements(self, names: list[str]) -> list[cst.BaseStatement]:
        statements: list[cst.BaseStatement] = []
        for name in names:
            code = template("add_loss_scale_wrap.py.tmpl").format(
                manager=_MANAGER_VARIABLE,
                manager_call=manager_call(self.planner.choice, multiline=True)[1],
                optimizer=name,
            )
            parsed = cst.parse_module(code)
            first, *rest = parsed.body
            statements += [first.with_changes(leading_lines=parsed.header), *rest]
        return statements


def _import_statement(manager: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"from {api.CONTRIB} import {manager}, LossScaleOptimizer\n")  # type: ignore[return-value]


def with_import(module: cst.Module, manager: str) -> cst.Module:
    """The contrib import after the module's last top-level import (or its docstring)."""
    body = list(module.body)
    index = 0
    for i, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
        ):
            index = i + 1
        elif (
            i == 0
            and isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, cst.SimpleString)
        ):
            index = max(index, 1)
    body.insert(index, _import_statement(manager))
    return module.with_changes(body=body)
