"""Reads one module for the global-step move: hand-made step updates and optimizer classes.

The analysis keeps references to the tree's own nodes, so `rewrite` can edit exactly the statements
it inspected; `scan` projects the same results onto plain picklable facts for the project plan.
Anything that does not match a known-safe shape is recorded as a problem with its reason rather
than guessed at: the caller turns problems into manual-review warnings.
"""

from __future__ import annotations

import libcst as cst

from migrator.codemods.global_step.classes import ClassReader
from migrator.codemods.global_step.conditions import StepConditions
from migrator.codemods.global_step.exprs import argument, name_of, update_parts
from migrator.codemods.global_step.increments import Increments
from migrator.codemods.global_step.model import ModuleAnalysis, StepFunction
from migrator.codemods.global_step.names import is_loss_scale_optimizer, is_tf_function
from migrator.codemods.global_step.reading import StepProblem, StepReader
from migrator.codemods.global_step.tracing import OptimizerTracing
from migrator.codemods.global_step.tree import (
    INDEX,
    Index,
    assignments,
    collect,
    indented_blocks,
    statement_owners,
)

_STEP_GETTERS = ("get_or_create_global_step", "get_global_step", "create_global_step")


class Analyzer(StepReader):
    """Run through `MetadataWrapper.visit`; results land in `self.result`.

    The readers of classes (`classes.py`), step conditions (`conditions.py`), increments
    (`increments.py`) and optimizer tracing (`tracing.py`) ask this visitor's metadata.
    """

    def __init__(self, *, steps: bool = True) -> None:
        """`steps=False`: the module cannot hold a step update (no `global_step` in its text), so
        only its classes are read (where it builds loss-scale optimizers only matters to its step
        functions)."""
        super().__init__()
        self.steps = steps
        self.result = ModuleAnalysis([], {}, [], [])
        self.classes = ClassReader(self)
        self.conditions = StepConditions(self)
        self.increments = Increments(self, self.conditions)
        self.tracing = OptimizerTracing(self)

    def visit_Module(self, node: cst.Module) -> bool:
        self.module = node
        if not self.steps:
            # No step functions to find: the one walk the index costs would only serve them.
            self._module(node, [])
            return False
        index = Index(node)
        token = INDEX.set(index)
        try:
            self._module(node, index.functions)
        finally:
            INDEX.reset(token)
        return False

    def _module(
        self, node: cst.Module, functions: list[tuple[cst.FunctionDef, tuple[str, ...]]]
    ) -> None:
        for stmt in node.body:
            if isinstance(stmt, cst.ClassDef):
                self.result.classes[stmt.name.value] = self.classes.read(stmt)
        if self.steps:
            self.result.loss_scale_lines = [
                self.line(c)
                for c in collect(node, cst.Call, enter_defs=True)
                if is_loss_scale_optimizer(self.qnames(c.func))
            ]
        seen: dict[str, int] = {}
        defined = {path: fn for fn, path in functions}
        for fn, path in functions:
            if fn.name.value == "apply_gradients":
                continue  # the increment's destination, not a hand-made update to move
            key = ".".join(path)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key = f"{key}#{seen[key]}"
            self._function(fn, key, defined.get(path[:-1]))

    def _function(
        self, fn: cst.FunctionDef, key: str, enclosing: cst.FunctionDef | None = None
    ) -> None:
        """`enclosing`: the function `fn` is defined in, whose optimizer a closure may use
        (Habana's BERT updates the step in a `def update` inside `create_optimizer`)."""
        candidates = []
        unnamed = []  # `tf.assign_add(tf.train.get_global_step(), 1)`: no name to pass on
        for call in collect(fn.body, cst.Call):
            parts = update_parts(call, self.qnames)
            if parts is None:
                continue
            target, kind, value = parts
            name = name_of(target)
            if name is not None:
                candidates.append((call, (name, kind, value)))
            elif isinstance(target, cst.Call) and is_tf_function(
                self.qnames(target.func), *_STEP_GETTERS
            ):
                unnamed.append((call, target))
        if not candidates and not unnamed:
            return  # most functions: no call even looks like an update, so skip the scope walk
        assigns = assignments(fn)
        self.conditions.update_predicates = {
            name_of(argument(c, 0, "pred"))
            for c in collect(fn.body, cst.Call)
            if is_tf_function(self.qnames(c.func), "cond")
        } - {None}
        updates = [(c, u) for c, u in candidates if self._is_global_step(u[0], assigns)]
        if not updates and not unnamed:
            return
        uses_loss_scale = any(
            is_loss_scale_optimizer(self.qnames(c.func))
            for c in collect(enclosing or fn, cst.Call, enter_defs=True)
        )
        step = updates[0][1][0] if updates else "global_step"
        info = StepFunction(key, fn.name.value, self.line(fn), step=step)
        self.result.step_functions.append(info)
        if not uses_loss_scale:
            self.result.unscaled_steps.append((fn.name.value, self.line(fn)))
            info.scaled = False
            try:
                self.tracing.call_sites(fn, info)
                self.tracing.optimizers(info, fn, assigns)
            except StepProblem:
                pass  # classes it cannot name are classes the plan will not see shared
            return
        # The optimizers are traced even when the update itself is unusual: the plan needs them
        # to keep every class this function shares with others unchanged as well.
        try:
            self.tracing.call_sites(fn, info)
            self.tracing.optimizers(info, fn, assigns)
        except StepProblem as problem:
            info.problem, info.problem_line = problem.reason, problem.line
        try:
            if unnamed:
                call, getter = unnamed[0]
                raise StepProblem(
                    f"it updates the step `{self.code(getter)}` returns without "
                    "naming it, so there is no variable to pass as global_step",
                    self.line(call),
                )
            if len({u[0] for _, u in updates}) != 1:
                raise StepProblem("it updates more than one step variable", self.line(fn))
            blocks = {id(s): b for b in indented_blocks(fn) for s in b.body}
            owner = statement_owners(fn)
            for call, _ in updates:
                stmt = owner.get(id(call))
                block = blocks.get(id(stmt))
                info.increments.append(
                    self.increments.increment(call, info.step, stmt, block, assigns)
                )
            info.op_name = self.increments.op_name(info)
            self.increments.check_private(fn, info)
        except StepProblem as problem:
            info.problem, info.problem_line = problem.reason, problem.line

    def _is_global_step(self, name: str, assigns: dict[str, list]) -> bool:
        if name == "global_step":
            return True
        return any(
            isinstance(v, cst.Call) and is_tf_function(self.qnames(v.func), *_STEP_GETTERS)
            for v in assigns.get(name, [])
        )
