"""Reads one module for the global-step move: hand-made step updates and optimizer classes.

The analysis keeps references to the tree's own nodes, so `rewrite` can edit exactly the statements
it inspected; `scan` projects the same results onto plain picklable facts for the project plan.
Anything that does not match a known-safe shape is recorded as a problem with its reason rather
than guessed at: the caller turns problems into manual-review warnings.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import (
    QualifiedName,
    QualifiedNameSource,
    ScopeProvider,
)

from migrator.codemods.global_step.exprs import (
    argument,
    is_plus_one,
    is_true_constant,
    lambda_body,
    name_of,
    positional,
    step_update,
    update_parts,
)
from migrator.codemods.global_step.model import (
    NEW_STEP,
    CallSite,
    Increment,
    ModuleAnalysis,
    OptimizerClass,
    OptimizerRef,
    StepFunction,
)
from migrator.codemods.global_step.names import (
    is_builtin_optimizer,
    is_loss_scale_optimizer,
    is_optimizer_wrapper,
    is_tf_function,
    single_name,
)
from migrator.codemods.global_step.tree import (
    INDEX,
    Index,
    assigned_value,
    assignments,
    branch_values,
    collect,
    indented_blocks,
    names_in,
    statement_owners,
)
from migrator.codemods.shared.lines import LineProvider, start_line
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.qualified import qualified_names

_APPLY_METHODS = {"apply_gradients": 1, "minimize": 1}  # method -> global_step position
_STEP_GETTERS = ("get_or_create_global_step", "get_global_step", "create_global_step")
_FINITE_COMBINERS = ("reduce_all", "logical_and", "cast", "identity", "stop_gradient", "stack")


class Analyzer(cst.CSTVisitor):
    """Run through `MetadataWrapper.visit`; results land in `self.result`."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentProvider, LineProvider)

    def __init__(self) -> None:
        super().__init__()
        self.result = ModuleAnalysis([], {}, [], [])
        # names used as the predicate of a tf.cond in the function being read
        self._update_predicates: set[str] = set()

    # -- metadata helpers -------------------------------------------------------------------
    def qnames(self, node: cst.CSTNode) -> set[QualifiedName]:
        return set(qualified_names(self, node))

    def line(self, node: cst.CSTNode) -> int:
        # Not PositionProvider: it costs a position for every node, we need a dozen (lines.py).
        return start_line(self, node)

    # -- entry ------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> bool:
        self.module = node
        index = Index(node)
        node.visit(index)
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
                self.result.classes[stmt.name.value] = self._class(stmt)
        self.result.loss_scale_lines = [
            self.line(c)
            for c in collect(node, cst.Call, enter_defs=True)
            if is_loss_scale_optimizer(self.qnames(c.func))
        ]
        seen: dict[str, int] = {}
        for fn, path in functions:
            if fn.name.value == "apply_gradients":
                continue  # the increment's destination, not a hand-made update to move
            key = ".".join(path)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key = f"{key}#{seen[key]}"
            self._function(fn, key)

    # -- references to optimizer classes ------------------------------------------------------
    def ref(self, expr: cst.BaseExpression) -> OptimizerRef:
        names = self.qnames(expr)
        text = self.module.code_for_node(expr)
        line = self.line(expr)
        if is_builtin_optimizer(names):
            return OptimizerRef("builtin", "", text, text, line)
        qn = single_name(names)
        if qn is not None and qn.source is QualifiedNameSource.LOCAL and "." not in qn.name:
            return OptimizerRef("local", "", qn.name, text, line)
        if (
            qn is not None
            and qn.source is QualifiedNameSource.IMPORT
            and "." in qn.name.lstrip(".")
            and not qn.name.startswith(("tensorflow.", "keras."))
        ):
            module, _, cls = qn.name.rpartition(".")
            return OptimizerRef("import", module, cls, text, line)
        return OptimizerRef("unknown", "", text, text, line)

    # -- classes ------------------------------------------------------------------------------
    def _class(self, node: cst.ClassDef) -> OptimizerClass:
        info = OptimizerClass(node.name.value, self.line(node), "follows_bases")
        info.bases = [self.ref(a.value) for a in node.bases if a.keyword is None]
        methods = [
            s
            for s in node.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == "apply_gradients"
        ]
        if not methods:
            return info
        apply = methods[-1]
        info.apply = apply
        params = [p.name.value for p in apply.params.params]
        if "global_step" in params:
            info.step_param = "global_step"
        elif len(params) > 2:
            info.step_param = params[2]
        else:
            return self._unsupported(info, "its apply_gradients takes no global_step argument")
        step = info.step_param
        for call in collect(apply, cst.Call, enter_defs=True):
            update = step_update(call, self.qnames)
            if update is not None and update[0] == step:
                info.state = "advances"
                return info
        for call in collect(apply, cst.Call, enter_defs=True):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "apply_gradients":
                if names_in(call, step) and self._is_base_call(func.value, node):
                    return info
                return self._unsupported(
                    info, "its apply_gradients hands the step to another optimizer"
                )
        return self._insertion_point(info, apply, node)

    def _is_base_call(self, receiver: cst.BaseExpression, cls: cst.ClassDef) -> bool:
        if isinstance(receiver, cst.Call) and name_of(receiver.func) == "super":
            return True
        base_texts = {self.module.code_for_node(a.value) for a in cls.bases}
        return self.module.code_for_node(receiver) in base_texts

    def _unsupported(self, info: OptimizerClass, reason: str) -> OptimizerClass:
        info.state = "unsupported"
        info.reason = reason
        return info

    def _insertion_point(
        self, info: OptimizerClass, apply: cst.FunctionDef, cls: cst.ClassDef
    ) -> OptimizerClass:
        returns = collect(apply.body, cst.Return)
        body = apply.body.body if isinstance(apply.body, cst.IndentedBlock) else ()
        last = body[-1] if body else None
        if (
            len(returns) != 1
            or not isinstance(last, cst.SimpleStatementLine)
            or last.body[0] is not returns[0]
        ):
            return self._unsupported(
                info, "its apply_gradients does not end in its only `return` statement"
            )
        value = returns[0].value
        group_list = None
        if isinstance(value, cst.Call) and is_tf_function(self.qnames(value.func), "group"):
            stars = [a for a in value.args if a.star == "*"]
            if len(stars) == 1 and isinstance(stars[0].value, cst.Name):
                group_list = stars[0].value.value
        if group_list is None or not self._is_list(apply, group_list, cls):
            return self._unsupported(
                info,
                "its apply_gradients does not return `tf.group(*updates, ...)` over a list of "
                "updates the increment could join",
            )
        assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        reads = _step_reads(apply, info.step_param)
        if reads and (_rebinds(apply, info.step_param) or names_in(apply, NEW_STEP)):
            return self._unsupported(
                info,
                f"its apply_gradients reads {info.step_param} but also rebinds it or already uses "
                f"the name `{NEW_STEP}`, so the read of the advanced step cannot be written",
            )
        info.step_reads = reads
        info.state = "insertable"
        info.list_name = group_list
        info.tf_alias = self.module.code_for_node(value.func.value)
        info.return_line = self.line(last)
        return info

    def _is_list(self, fn: cst.FunctionDef, name: str, cls: cst.ClassDef | None) -> bool:
        """Whether `name` provably holds a list wherever `fn` returns it, so `.extend` works.

        `name += more` keeps a list a list; a value returned by a method of the same class counts
        when that method returns a provable list (ELECTRA's AdamWeightDecay collects its updates
        in a helper, once per layer group)."""
        values = assignments(fn).get(name, [])
        extended = sum(
            isinstance(a.target, cst.Name)
            and a.target.value == name
            and isinstance(a.operator, cst.AddAssign)
            for a in collect(fn.body, cst.AugAssign)
        )
        known = [v for v in values if v is not None]
        if not known or len(values) - len(known) != extended:
            return False
        return all(self._list_value(v, cls) for v in known)

    def _list_value(self, value: cst.BaseExpression, cls: cst.ClassDef | None) -> bool:
        if isinstance(value, (cst.List, cst.ListComp)):
            return True
        if not isinstance(value, cst.Call):
            return False
        if name_of(value.func) == "list":
            return True
        func = value.func
        if cls is None or not (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
        ):
            return False
        methods = [
            s
            for s in cls.body.body
            if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value
        ]
        if len(methods) != 1:
            return False
        returns = collect(methods[0].body, cst.Return)
        return bool(returns) and all(
            isinstance(r.value, cst.Name) and self._is_list(methods[0], r.value.value, None)
            for r in returns
        )

    # -- functions that update global_step ----------------------------------------------------
    def _function(self, fn: cst.FunctionDef, key: str) -> None:
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
        self._update_predicates = {
            name_of(argument(c, 0, "pred"))
            for c in collect(fn.body, cst.Call)
            if is_tf_function(self.qnames(c.func), "cond")
        } - {None}
        updates = [(c, u) for c, u in candidates if self._is_global_step(u[0], assigns)]
        if not updates and not unnamed:
            return
        uses_loss_scale = any(
            is_loss_scale_optimizer(self.qnames(c.func))
            for c in collect(fn, cst.Call, enter_defs=True)
        )
        step = updates[0][1][0] if updates else "global_step"
        info = StepFunction(key, fn.name.value, self.line(fn), step=step)
        self.result.step_functions.append(info)
        if not uses_loss_scale:
            self.result.unscaled_steps.append((fn.name.value, self.line(fn)))
            info.scaled = False
            try:
                self._call_sites(fn, info)
                self._optimizers(info, fn, assigns)
            except _Problem:
                pass  # classes it cannot name are classes the plan will not see shared
            return
        # The optimizers are traced even when the update itself is unusual: the plan needs them
        # to keep every class this function shares with others unchanged as well.
        try:
            self._call_sites(fn, info)
            self._optimizers(info, fn, assigns)
        except _Problem as problem:
            info.problem, info.problem_line = problem.reason, problem.line
        try:
            if unnamed:
                call, getter = unnamed[0]
                raise _Problem(
                    f"it updates the step `{self.module.code_for_node(getter)}` returns without "
                    "naming it, so there is no variable to pass as global_step",
                    self.line(call),
                )
            if len({u[0] for _, u in updates}) != 1:
                raise _Problem("it updates more than one step variable", self.line(fn))
            blocks = {id(s): b for b in indented_blocks(fn) for s in b.body}
            owner = statement_owners(fn)
            for call, _ in updates:
                stmt = owner.get(id(call))
                block = blocks.get(id(stmt))
                info.increments.append(self._increment(fn, info.step, stmt, block, assigns))
            info.op_name = self._op_name(info)
            self._check_private(fn, info)
        except _Problem as problem:
            info.problem, info.problem_line = problem.reason, problem.line

    def _op_name(self, info: StepFunction) -> str | None:
        """The name the script gave its step op (`tf.identity(..., name="update_step")`), if one
        name is used by every removed update; the moved increment keeps it."""
        names = set()
        for inc in info.increments:
            for stmt in inc.statements:
                for call in collect(stmt, cst.Call):
                    name = argument(call, 99, "name")
                    if is_tf_function(self.qnames(call.func), "identity") and isinstance(
                        name, cst.SimpleString
                    ):
                        names.add(name.evaluated_value)
        return names.pop() if len(names) == 1 else None

    def _is_global_step(self, name: str, assigns: dict[str, list]) -> bool:
        if name == "global_step":
            return True
        return any(
            isinstance(v, cst.Call) and is_tf_function(self.qnames(v.func), *_STEP_GETTERS)
            for v in assigns.get(name, [])
        )

    def _increment(
        self,
        fn: cst.FunctionDef,
        step: str,
        stmt: cst.SimpleStatementLine | None,
        block: cst.IndentedBlock | None,
        assigns: dict[str, list],
    ) -> Increment:
        if stmt is None:
            raise _Problem(
                "it updates the step inside a one-line compound statement", self.line(fn)
            )
        line = self.line(stmt)
        code = self.module.code_for_node(stmt.with_changes(leading_lines=())).strip()
        shape = self._group_shape(stmt, step)
        if block is None or shape is None:
            raise _Problem(
                f"the step update `{code}` is not `x = tf.group(x, [step.assign(...)])` (or "
                "`return tf.group(x, [step.assign(...)])`)",
                line,
            )
        target, first, update_kind, value = shape
        statements: list[cst.BaseStatement] = [stmt]
        if update_kind == "assign_add":
            if not (isinstance(value, cst.Integer) and value.value == "1"):
                raise _Problem(f"`{code}` advances the step by something other than 1", line)
        elif isinstance(value, cst.Name):
            statements[:0] = self._definition(block, stmt, value.value, step, assigns)
        elif value is None:
            raise _Problem(f"`{code}` has no value to assign", line)
        else:
            self._check_new_step(value, step, assigns, line)
        replacement = None
        if target is None:  # `return tf.group(first, [update])` -> `return first`
            replacement = stmt.with_changes(body=[stmt.body[0].with_changes(value=first)])
        elif name_of(first) != target:
            replacement = stmt.with_changes(
                body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(target))], value=first)]
            )
        return Increment(statements, replacement, self.line(statements[0]))

    def _check_private(self, fn: cst.FunctionDef, info: StepFunction) -> None:
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
                raise _Problem(f"`{name}` is also used outside the step update", info.line)

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
        if not is_tf_function(self.qnames(call.func), "group") or len(call.args) != 2:
            return None
        if any(a.keyword is not None or a.star for a in call.args):
            return None
        first, second = (a.value for a in call.args)
        if isinstance(second, (cst.List, cst.Tuple)) and len(second.elements) == 1:
            second = second.elements[0].value
        if not isinstance(second, cst.Call):
            return None
        update = step_update(second, self.qnames)
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
            line = self.line(earlier)
            if value is not None:
                found.insert(0, earlier)
                if (
                    isinstance(value, cst.Call)
                    and is_tf_function(self.qnames(value.func), "identity")
                    and name_of(argument(value, 0, "input")) == new
                ):
                    continue
                self._check_new_step(value, step, assigns, line)
                return found
            branches = branch_values(earlier, new)
            if branches is not None:
                for branch_value in branches:
                    self._check_new_step(branch_value, step, assigns, line)
                found.insert(0, earlier)
                return found
            if names_in(earlier, new):
                raise _Problem(f"`{new}` is computed in a shape the tool does not know", line)
        raise _Problem(f"cannot find where `{new}` is computed", self.line(stmt))

    def _check_new_step(
        self, value: cst.BaseExpression, step: str, assigns: dict[str, list], line: int
    ) -> None:
        """Accept `step + 1`, or `tf.cond(finite, lambda: step + 1, lambda: step)`."""
        if is_plus_one(value, step):
            return
        if isinstance(value, cst.Call) and is_tf_function(self.qnames(value.func), "cond"):
            pred = argument(value, 0, "pred")
            then = lambda_body(argument(value, 1, "true_fn"))
            other = lambda_body(argument(value, 2, "false_fn"))
            if (
                pred is not None
                and then is not None
                and is_plus_one(then, step)
                and (name_of(other) == step)
            ):
                if self._is_finite_flag(pred, assigns, set()):
                    return
                if self._is_update_and_finite(pred, assigns):
                    return
                raise _Problem(
                    f"the step advances only when `{self.module.code_for_node(pred)}` holds, "
                    "which is not a gradient-finiteness check",
                    line,
                )
        raise _Problem(
            f"the new step `{self.module.code_for_node(value)}` is neither `{step} + 1` nor "
            f"`tf.cond(<all gradients finite>, lambda: {step} + 1, lambda: {step})`",
            line,
        )

    def _is_update_and_finite(self, pred: cst.BaseExpression, assigns: dict[str, list]) -> bool:
        """`logical_and(update_step, finite)` with gradient accumulation (NVIDIA's BERT): the
        step advances when this micro-batch applies the update and the accumulated gradients
        were finite; `update_step` is the predicate of the tf.cond that applies the optimizer.
        Inside apply_gradients, which the loss-scale optimizer runs only on clean updates, the
        moved increment advances under exactly that condition."""
        if not isinstance(pred, cst.Call) or not is_tf_function(
            self.qnames(pred.func), "logical_and"
        ):
            return False
        inputs = positional(pred)
        if len(inputs) != 2:
            return False
        for update, finite in (inputs, inputs[::-1]):
            if name_of(update) in self._update_predicates and self._is_finite_flag(
                finite, assigns, set()
            ):
                return True
        return False

    def _is_finite_flag(
        self, expr: cst.BaseExpression, assigns: dict[str, list], seen: set
    ) -> bool:
        """True when `expr` is a reduction of `tf.is_finite` over gradients (or constant True).

        Accumulated flags count too: a bool variable that starts True and is re-assigned
        `logical_and(itself, finite)` on every micro-batch (its own earlier value is finite by
        induction), possibly summed over workers with Horovod's allreduce.
        """
        if isinstance(expr, cst.Name):
            if expr.value in seen:
                return True  # the accumulator's previous value, finite by induction
            values = assigns.get(expr.value)
            if not values or any(v is None for v in values):
                return False
            return all(self._is_finite_flag(v, assigns, seen | {expr.value}) for v in values)
        if is_true_constant(expr, self.qnames):
            return True
        if isinstance(expr, cst.IfExp):
            return all(
                is_true_constant(e, self.qnames) or self._is_finite_flag(e, assigns, seen)
                for e in (expr.body, expr.orelse)
            )
        if isinstance(expr, (cst.List, cst.Tuple)):
            return bool(expr.elements) and all(
                self._is_finite_flag(e.value, assigns, seen) for e in expr.elements
            )
        if isinstance(expr, cst.ListComp):
            return self._is_finite_flag(expr.elt, assigns, seen)
        if not isinstance(expr, cst.Call):
            return False
        names = self.qnames(expr.func)
        if is_tf_function(names, "is_finite"):
            return True
        if is_tf_function(names, "cond"):
            branches = [
                lambda_body(argument(expr, i, k)) for i, k in ((1, "true_fn"), (2, "false_fn"))
            ]
            return all(b is not None and self._is_finite_flag(b, assigns, seen) for b in branches)
        if is_tf_function(names, "get_variable", "Variable"):
            initial = argument(expr, 99, "initializer") or argument(expr, 0, "initial_value")
            return initial is not None and (
                is_true_constant(initial, self.qnames)
                or (
                    isinstance(initial, (cst.Name, cst.Attribute, cst.Call))
                    and "ones_initializer" in self.module.code_for_node(initial)
                )
            )
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "assign":
            return name_of(expr.func.value) in seen and self._is_finite_flag(
                argument(expr, 0, "value"), assigns, seen
            )
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "allreduce":
            # Horovod's, often through a parameter (`hvd=None`) that no import resolves
            value = argument(expr, 0, "tensor")
            return value is not None and self._is_finite_flag(value, assigns, seen)
        if not is_tf_function(names, *_FINITE_COMBINERS):
            return False
        inputs = positional(expr)
        if is_tf_function(names, "logical_and"):
            return len(inputs) == 2 and all(self._is_finite_flag(e, assigns, seen) for e in inputs)
        return bool(inputs) and self._is_finite_flag(inputs[0], assigns, seen)

    # -- where the function applies its optimizer ---------------------------------------------
    def _call_sites(self, fn: cst.FunctionDef, info: StepFunction) -> None:
        for call in collect(fn.body, cst.Call, enter_defs=True):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in _APPLY_METHODS:
                continue
            passed = argument(call, _APPLY_METHODS[func.attr.value], "global_step")
            if passed is not None and name_of(passed) != info.step:
                raise _Problem(
                    f"`{func.attr.value}` receives `{self.module.code_for_node(passed)}` as "
                    f"global_step, not `{info.step}`",
                    self.line(call),
                )
            if passed is None and self._bound_only_after(call, info.step):
                raise _Problem(
                    f"`{info.step}` is assigned only after `{func.attr.value}` is called, so it "
                    "cannot be passed there",
                    self.line(call),
                )
            info.call_sites.append(CallSite(call, passed is not None, self.line(call)))
        if not info.call_sites:
            raise _Problem("cannot find the apply_gradients/minimize call it builds", info.line)

    def _bound_only_after(self, call: cst.Call, name: str) -> bool:
        """Whether `name` is local where `call` runs and bound only further down: passing it
        there would raise UnboundLocalError. (A global, or a local bound earlier, is fine.)"""
        scope = self.get_metadata(ScopeProvider, call.func, None)
        if scope is None:
            return False
        local = list(scope.assignments[name])
        line = self.line(call)
        return bool(local) and all(self.line(a.node) >= line for a in local)

    def _optimizers(self, info: StepFunction, fn: cst.FunctionDef, assigns: dict) -> None:
        seen: set[str] = set()
        for site in info.call_sites:
            receiver = site.call.func.value  # type: ignore[attr-defined]
            if isinstance(receiver, cst.Call):  # `MyOptimizer(...).minimize(loss)`
                self._trace_value(receiver, "", assigns, seen, info)
                continue
            if not isinstance(receiver, cst.Name):
                raise _Problem(
                    f"cannot tell which optimizer `{self.module.code_for_node(receiver)}` is",
                    site.line,
                )
            self._trace(receiver.value, assigns, seen, info, site.line)

    def _trace(
        self, name: str, assigns: dict, seen: set[str], info: StepFunction, line: int
    ) -> None:
        """Follow `opt = Wrapper(opt, ...)` back to the classes the optimizer is made from."""
        if name in seen:
            return
        seen.add(name)
        values = assigns.get(name, [])
        if not values or any(v is None for v in values):
            raise _Problem(
                f"the optimizer `{name}` comes from outside the function, so its class is unknown",
                line,
            )
        for value in values:
            self._trace_value(value, name, assigns, seen, info)

    def _trace_value(
        self,
        value: cst.BaseExpression,
        name: str,
        assigns: dict,
        seen: set[str],
        info: StepFunction,
    ) -> None:
        if not isinstance(value, cst.Call):
            raise _Problem(
                f"cannot tell the class of `{self.module.code_for_node(value)}`", self.line(value)
            )
        inner = positional(value)[:1]
        if inner and (name_of(inner[0]) == name or is_optimizer_wrapper(self.qnames(value.func))):
            if isinstance(inner[0], cst.Name):
                self._trace(inner[0].value, assigns, seen, info, self.line(value))
            else:
                self._trace_value(inner[0], name, assigns, seen, info)
            return
        info.optimizers.append(self.ref(value.func))


def _step_reads(apply: cst.FunctionDef, step: str) -> list[cst.Name]:
    """The loads of `step` in the method's body, less its `step is (not) None` tests."""
    tests = set()
    for comparison in collect(apply.body, cst.Comparison, enter_defs=True):
        if (
            isinstance(comparison.left, cst.Name)
            and comparison.left.value == step
            and all(
                isinstance(c.operator, (cst.Is, cst.IsNot))
                and isinstance(c.comparator, cst.Name)
                and c.comparator.value == "None"
                for c in comparison.comparisons
            )
        ):
            tests.add(id(comparison.left))
    return [
        n
        for n in collect(apply.body, cst.Name, enter_defs=True)
        if n.value == step and id(n) not in tests
    ]


def _rebinds(apply: cst.FunctionDef, step: str) -> bool:
    """Whether the body assigns the parameter (the parameter itself is the first entry)."""
    return len(assignments(apply).get(step, [])) > 1


class _Problem(Exception):
    def __init__(self, reason: str, line: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
