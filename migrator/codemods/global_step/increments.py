"""The statements of a hand-made step update that the move removes, and what replaces them.

An update is `x = tf.group(x, [step.assign(...)])` (or `return tf.group(...)`), advancing by one
or assigning a new step computed just before it (`tf.identity` passes, then `step + 1` or a
tf.cond on finiteness, `conditions.py`); the names it computes must be read nowhere else. The
increment keeps the op name the script gave it.
"""

from __future__ import annotations

import libcst as cst

from migrator.codemods.global_step.conditions import StepConditions
from migrator.codemods.global_step.exprs import argument, name_of, step_update
from migrator.codemods.global_step.model import Increment, StepFunction
from migrator.codemods.global_step.names import is_tf_function
from migrator.codemods.global_step.reading import StepProblem, StepReader
from migrator.codemods.global_step.tree import assigned_value, branch_values, collect, names_in


class Increments:
    """Reads the updates of one function at a time with the analysis's `reader`."""

    def __init__(self, reader: StepReader, conditions: StepConditions) -> None:
        self.reader = reader
        self.conditions = conditions

    def increment(
        self,
        update: cst.Call,
        step: str,
        stmt: cst.SimpleStatementLine | None,
        block: cst.IndentedBlock | None,
        assigns: dict[str, list],
    ) -> Increment:
        if stmt is None:
            raise StepProblem(
                "it updates the step outside a statement of its own (in the header of a `with`, "
                "`if` or loop, such as `with tf.control_dependencies([step.assign(...)]):`, or in "
                "a one-line compound statement)",
                self.reader.line(update),
            )
        line = self.reader.line(stmt)
        code = self.reader.code(stmt.with_changes(leading_lines=())).strip()
        shape = self._group_shape(stmt, step)
        if block is None or shape is None:
            raise StepProblem(
                f"the step update `{code}` is not `x = tf.group(x, [step.assign(...)])` (or "
                "`return tf.group(x, [step.assign(...)])`)",
                line,
            )
        target, first, update_kind, value = shape
        statements: list[cst.BaseStatement] = [stmt]
        if update_kind == "assign_add":
            if not (isinstance(value, cst.Integer) and value.value == "1"):
                raise StepProblem(f"`{code}` advances the step by something other than 1", line)
        elif isinstance(value, cst.Name):
            statements[:0] = self._definition(block, stmt, value.value, step, assigns)
        elif value is None:
            raise StepProblem(f"`{code}` has no value to assign", line)
        else:
            self.conditions.check_new_step(value, step, assigns, line)
        replacement = None
        if target is None:  # `return tf.group(first, [update])` -> `return first`
            replacement = stmt.with_changes(body=[stmt.body[0].with_changes(value=first)])
        elif name_of(first) != target:
            replacement = stmt.with_changes(
                body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(target))], value=first)]
            )
        return Increment(statements, replacement, self.reader.line(statements[0]))

    def check_private(self, fn: cst.FunctionDef, info: StepFunction) -> None:
        """The names the updates compute (`new_global_step`) must not be read anywhere else."""
        removed = [s for inc in info.increments for s in inc.statements]
        computed = {
            t.target.value
            for inc in info.increments
            for s in inc.statements[:-1]
            for t in collect(s, cst.AssignTarget)
            if isinstance(t.target, cst.Name)
        }
        for name in computed:
            if names_in(fn, name) != sum(names_in(s, name) for s in removed):
                raise StepProblem(f"`{name}` is also used outside the step update", info.line)

    def op_name(self, info: StepFunction) -> str | None:
        """The name the script gave its step op (`tf.identity(..., name="update_step")`), if one
        name is used by every removed update; the moved increment keeps it."""
        names = set()
        for inc in info.increments:
            for stmt in inc.statements:
                for call in collect(stmt, cst.Call):
                    name = argument(call, 99, "name")
                    if is_tf_function(self.reader.qnames(call.func), "identity") and isinstance(
                        name, cst.SimpleString
                    ):
                        names.add(name.evaluated_value)
        return names.pop() if len(names) == 1 else None

    def _group_shape(
        self, stmt: cst.SimpleStatementLine, step: str
    ) -> tuple[str | None, cst.BaseExpression, str, cst.BaseExpression | None] | None:
        """`T = tf.group(first, [step.assign(v)])` -> (T, first, "assign", v); the target is None
        for `return tf.group(first, [step.assign(v)])`."""
        if len(stmt.body) != 1:
            return None
        node = stmt.body[0]
        if isinstance(node, cst.Return):
            target, call = None, node.value
        elif isinstance(node, cst.Assign) and len(node.targets) == 1:
            target, call = name_of(node.targets[0].target), node.value
            if target is None:
                return None
        else:
            return None
        if not isinstance(call, cst.Call):
            return None
        if not is_tf_function(self.reader.qnames(call.func), "group") or len(call.args) != 2:
            return None
        if any(a.keyword is not None or a.star for a in call.args):
            return None
        first, second = (a.value for a in call.args)
        if isinstance(second, (cst.List, cst.Tuple)) and len(second.elements) == 1:
            second = second.elements[0].value
        if not isinstance(second, cst.Call):
            return None
        update = step_update(second, self.reader.qnames)
        if update is None or update[0] != step:
            return None
        return target, first, update[1], update[2]

    def _definition(
        self,
        block: cst.IndentedBlock,
        stmt: cst.BaseStatement,
        new: str,
        step: str,
        assigns: dict[str, list],
    ) -> list[cst.BaseStatement]:
        """Statements before `stmt` that compute `new`: `tf.identity` passes, then its origin."""
        body = list(block.body)
        found: list[cst.BaseStatement] = []
        position = next(i for i, s in enumerate(body) if s is stmt)
        for earlier in reversed(body[:position]):
            value = assigned_value(earlier, new)
            line = self.reader.line(earlier)
            if value is not None:
                found.insert(0, earlier)
                if (
                    isinstance(value, cst.Call)
                    and is_tf_function(self.reader.qnames(value.func), "identity")
                    and name_of(argument(value, 0, "input")) == new
                ):
                    continue
                self.conditions.check_new_step(value, step, assigns, line)
                return found
            branches = branch_values(earlier, new)
            if branches is not None:
                for branch_value in branches:
                    self.conditions.check_new_step(branch_value, step, assigns, line)
                found.insert(0, earlier)
                return found
            if names_in(earlier, new):
                raise StepProblem(f"`{new}` is computed in a shape the tool does not know", line)
        raise StepProblem(f"cannot find where `{new}` is computed", self.reader.line(stmt))
