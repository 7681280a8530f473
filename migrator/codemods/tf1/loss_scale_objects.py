"""The loss-scale objects of a file: tf.contrib's managers and TF's DynamicLossScale/FixedLossScale.

A contrib manager is ported where it stands (class renamed, arguments unchanged). A TF loss-scale
object is recorded while walking and decided once the optimizers are linked to it
(`optimizers.py`): it is ported only when every use of it is an optimizer the port rewrites too,
since the NPU managers answer a different interface (no update()). A dynamic manager built under
tf.control_dependencies() is moved out of the `with` where that provably changes nothing, else
warned (`control_deps.py`); one already on npu_lossscale is only checked for that.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import code
from migrator.codemods.shared.plan import Builder, CallEdit
from migrator.codemods.tf1.builders import tf_dynamic_builder, tf_fixed_builder
from migrator.codemods.tf1.control_deps import plan_control_deps
from migrator.codemods.tf1.sites import LossScaleObject
from migrator.codemods.tf1.subclass import incompatible_subclass

_TF_CTOR_PARAMS = {
    Kind.TF_DYNAMIC: ("initial_loss_scale", "increment_period", "multiplier"),
    Kind.TF_FIXED: ("loss_scale_value",),
}


class LossScaleObjects:
    """Handlers for the managers' and loss-scale objects' references; `decide` and
    `control_deps` run once the file is read."""

    def __init__(self, file: FileContext) -> None:
        self.file = file
        self.by_call: dict[cst.Call, LossScaleObject] = {}
        # dynamic managers the port builds, and those the file builds from npu_lossscale already
        self._dynamic_calls: list[cst.Call] = []
        self._ported_dynamic: list[cst.Call] = []

    def contrib_manager(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, _: str) -> None:
        target = api.FIXED if kind is Kind.CONTRIB_FIXED else api.DYNAMIC
        if call is None and incompatible_subclass(self.file, node):
            return
        if call is None:
            self.file.edits.refs[node] = target
            self.file.site(node, node, target)
            self.file.change(node, registry.CONTRIB_MANAGER, f"`{code(node)}` -> {target}")
            return
        self.file.edits.calls[call] = CallEdit(target)
        self.file.site(call, node, target)
        self.file.change(
            call,
            registry.CONTRIB_MANAGER,
            f"`{code(node)}(...)` -> {target}(...), arguments unchanged",
        )
        if kind is Kind.CONTRIB_DYNAMIC:
            self._dynamic_calls.append(call)

    def tf_ctor(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, name: str) -> None:
        if call is None:
            self.file.warn(
                node,
                registry.UNPORTED_API,
                f"`{code(node)}` is used as a value, not constructed; the NPU managers are a "
                "different type, port this use by hand",
            )
            return
        bound = args_.bind(call, _TF_CTOR_PARAMS[kind])
        problem = bound if isinstance(bound, str) else None
        build: Builder | None = None
        if not isinstance(bound, str):
            if kind is Kind.TF_DYNAMIC:
                multiplier = bound.get("multiplier")
                if multiplier is not None and args_.has_call(call.args[multiplier].value):
                    problem = (
                        "its multiplier is a call; the port needs it twice (incr_ratio and "
                        "decr_ratio=1/multiplier) and will not evaluate it twice"
                    )
                build = tf_dynamic_builder(bound)
            else:
                build = tf_fixed_builder(bound)
        fields = {} if isinstance(bound, str) else bound
        self.by_call[call] = LossScaleObject(
            call, kind, self.file.line(call), problem, build, fields
        )

    def already_ported(self, node: cst.CSTNode, call: cst.Call | None, *_: object) -> None:
        if call is not None:
            self._ported_dynamic.append(call)

    def ctor_for(self, value: cst.BaseExpression) -> LossScaleObject | None:
        if isinstance(value, cst.Call):
            return self.by_call.get(value)
        if not isinstance(value, cst.Name):
            return None
        scope = self.file.scope(value)
        if scope is None:
            return None
        access = next((a for a in scope.accesses if a.node is value), None)
        if access is None or len(access.referents) != 1:
            return None
        (assignment,) = access.referents
        if not isinstance(assignment, Assignment) or assignment.scope is not scope:
            return None
        if any(type(a) is not Assignment for a in scope[value.value]):
            return None
        target = assignment.node
        statement = self.file.parent(self.file.parent(target)) if self.file.parent(target) else None
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and statement.targets[0].target is target
            and isinstance(statement.value, cst.Call)
        ):
            return None
        ctor = self.by_call.get(statement.value)
        if ctor is not None:
            ctor.variable = assignment
        return ctor

    def decide(self) -> None:
        for ctor in self.by_call.values():
            self._decide(ctor)

    def _decide(self, ctor: LossScaleObject) -> None:
        if ctor.keras:
            return  # mapped into (or left with) the Keras optimizer it is passed to inline
        what = code(ctor.call.func)
        problem = ctor.problem
        if problem is None and not ctor.consumers:
            problem = (
                "it is not passed to an optimizer the tool ports; the NPU managers have another "
                "interface (no update()), so port its uses by hand"
            )
        if problem is None and ctor.variable is not None:
            passed = {id(o.call.args[o.bound["loss_scale"]].value) for o in ctor.consumers}
            # `loss_scaler()` reads the scale, which the NPU managers answer the same way.
            others = [
                r
                for r in ctor.variable.references
                if id(r.node) not in passed and not self._called_bare(r.node)
            ]
            if others:
                problem = (
                    f"`{ctor.variable.name}` is also used at line {self.file.line(others[0].node)} "
                    "where a TensorFlow LossScale object is expected"
                )
        if problem is None and any(o.problem is not None for o in ctor.consumers):
            problem = "the optimizer that uses it cannot be ported (see its warning)"
        if problem is not None:
            self.file.report(
                ctor.line,
                _ctor_rule(ctor.kind),
                f"`{what}(...)` left unchanged: {problem}",
                "warning",
            )
            return
        ctor.ported = True
        target = api.DYNAMIC if ctor.kind is Kind.TF_DYNAMIC else api.FIXED
        self.file.port_call(ctor.call, target, ctor.build)
        detail = (
            " with TF's semantics (decrease on every overflow by 1/multiplier)"
            if ctor.kind is Kind.TF_DYNAMIC
            else ""
        )
        self.file.report(
            ctor.line, _ctor_rule(ctor.kind), f"`{what}(...)` -> {target}(...){detail}"
        )
        if ctor.kind is Kind.TF_DYNAMIC:
            self._dynamic_calls.append(ctor.call)

    def _called_bare(self, node: cst.CSTNode) -> bool:
        call = self.file.parent(node)
        return isinstance(call, cst.Call) and call.func is node and not call.args

    def control_deps(self) -> None:
        for call in self._dynamic_calls:
            plan_control_deps(self.file, call, movable=True)
        for call in self._ported_dynamic:
            plan_control_deps(self.file, call, movable=False)


def _ctor_rule(kind: Kind) -> str:
    return (
        registry.TF_DYNAMIC_LOSS_SCALE if kind is Kind.TF_DYNAMIC else registry.TF_FIXED_LOSS_SCALE
    )
