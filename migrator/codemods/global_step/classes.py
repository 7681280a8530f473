"""Optimizer classes of a module: can the step increment go into their apply_gradients?

A class whose apply_gradients already advances the step needs nothing; one that passes it on to
its base, nothing either (the base does); one that returns `tf.group(*updates)` over a list it
provably built can take the increment in that list ("insertable"); anything else is unsupported,
with the reason.
"""

from __future__ import annotations

import libcst as cst

from migrator.codemods.global_step.exprs import name_of, step_update
from migrator.codemods.global_step.model import NEW_STEP, OptimizerClass
from migrator.codemods.global_step.names import is_tf_function
from migrator.codemods.global_step.reading import StepReader
from migrator.codemods.global_step.tree import assignments, collect, names_in


class ClassReader:
    """Reads one class at a time with the analysis's `reader`."""

    def __init__(self, reader: StepReader) -> None:
        self.reader = reader

    def read(self, node: cst.ClassDef) -> OptimizerClass:
        """What the move can do with this class's apply_gradients."""
        info = OptimizerClass(node.name.value, self.reader.line(node), "follows_bases")
        info.bases = [self.reader.ref(a.value) for a in node.bases if a.keyword is None]
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
            update = step_update(call, self.reader.qnames)
            if update is not None and update[0] == step:
                info.state = "inserted" if _inserted(apply, call) else "advances"
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
        base_texts = {self.reader.code(a.value) for a in cls.bases}
        return self.reader.code(receiver) in base_texts

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
        if isinstance(value, cst.Call) and is_tf_function(self.reader.qnames(value.func), "group"):
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
        shadow = _shadowing_local(apply, info.step_param)
        if shadow is not None:
            # NEZHA's LAMB: `global_step = tf.train.get_or_create_global_step() + 1` before any
            # read of the parameter. Its reads are of that local, computed from the variable
            # before this step's updates (the increment waits for them), as before the move;
            # the local is renamed so the increment advances the parameter, not the tensor.
            info.shadow = (shadow, _uses(apply.body, info.step_param))
            reads = []
        elif reads and _rebinds(apply, info.step_param):
            return self._unsupported(
                info,
                f"its apply_gradients reads {info.step_param} but also rebinds it, so the read "
                "of the advanced step cannot be written",
            )
        if reads and names_in(apply, NEW_STEP):
            return self._unsupported(
                info,
                f"its apply_gradients reads {info.step_param} but already uses the name "
                f"`{NEW_STEP}`, so the read of the advanced step cannot be written",
            )
        info.step_reads = reads
        info.state = "insertable"
        info.list_name = group_list
        info.tf_alias = self.reader.code(value.func.value)
        info.return_line = self.reader.line(last)
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


def _inserted(apply: cst.FunctionDef, update: cst.Call) -> bool:
    """Whether `update` is in the increment npu-migrate inserts: a top-level `if` of the method
    whose leading comment starts with `npu-migrate:` (templates/global_step_*.py.tmpl)."""
    body = apply.body.body if isinstance(apply.body, cst.IndentedBlock) else ()
    return any(
        isinstance(stmt, cst.If)
        and any(
            line.comment is not None and line.comment.value.startswith("# npu-migrate:")
            for line in stmt.leading_lines
        )
        and any(call is update for call in collect(stmt, cst.Call, enter_defs=True))
        for stmt in body
    )


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


def _shadowing_local(apply: cst.FunctionDef, step: str) -> str | None:
    """A fresh name for `step` where the method's first statement naming it binds it to a value
    that does not read it (`step = <expr>`), at the top of the body, and nothing binds it in a
    nested function: the parameter is never read, every later use is of that local."""
    body = apply.body.body if isinstance(apply.body, cst.IndentedBlock) else ()
    first = next((stmt for stmt in body if names_in(stmt, step)), None)
    if not (isinstance(first, cst.SimpleStatementLine) and len(first.body) == 1):
        return None
    assign = first.body[0]
    if not (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and assign.targets[0].target.value == step
        and not names_in(assign.value, step)
    ):
        return None
    if any(names_in(fn, step) for fn in collect(apply.body, cst.FunctionDef, cst.Lambda)):
        return None
    fresh = f"{step}_read"
    while names_in(apply, fresh):
        fresh += "_"
    return fresh


def _uses(body: cst.CSTNode, name: str) -> list[cst.Name]:
    """Every Name node of the variable `name` (not `x.name`, not a keyword `name=`)."""
    others = {id(a.attr) for a in collect(body, cst.Attribute)}
    others |= {id(a.keyword) for a in collect(body, cst.Arg) if a.keyword is not None}
    return [n for n in collect(body, cst.Name) if n.value == name and id(n) not in others]


def _rebinds(apply: cst.FunctionDef, step: str) -> bool:
    """Whether the body assigns the parameter (the parameter itself is the first entry)."""
    return len(assignments(apply).get(step, [])) > 1
