"""Where `--add-loss-scale` wraps each optimizer, and which tf.gradients calls it reroutes."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import (
    Assignment,
    FunctionScope,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    Scope,
    ScopeProvider,
)

from migrator import registry
from migrator.codemods.add_loss_scale.finder import Binding, Finder, names, walk
from migrator.codemods.add_loss_scale.kinds import Kinds
from migrator.codemods.shared.add_loss_scale_choice import manager_call
from migrator.findings import Finding

RULE = registry.ADD_LOSS_SCALE
MANUAL = registry.ADD_LOSS_SCALE_MANUAL
UNSCALED = registry.ADD_LOSS_SCALE_UNSCALED
# tf.gradients keywords that compute_gradients takes under the same or another name.
_GRADIENT_KEYWORDS = {
    "colocate_gradients_with_ops": "colocate_gradients_with_ops",
    "aggregation_method": "aggregation_method",
    "grad_ys": "grad_loss",
}


class Planner:
    """Decides what to wrap and where, from what the finder collected."""

    def __init__(self, wrapper: MetadataWrapper, path: str, choice: str, keras: bool) -> None:
        self.finder = Finder(self.plan)
        self.module = wrapper.module
        self.path = path
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions = wrapper.resolve(PositionProvider)
        self.kinds = Kinds(self.finder, self.parents, keras)
        self.manager_class, self.manager_call = manager_call(choice)
        self.findings: list[Finding] = []
        self.choice = choice
        self.after: dict[int, list[str]] = {}  # statement -> optimizer names wrapped after it
        self.replace: dict[int, cst.BaseExpression] = {}  # node -> its replacement
        self.wraps = 0

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def note(self, node: cst.CSTNode, rule: str, message: str, kind: str = "warning") -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, kind))  # type: ignore[arg-type]

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def anchor(self, binding: Binding, first_use: cst.Call) -> cst.CSTNode | None:
        """The statement after which the wrap goes: in the innermost block holding the first
        training call that has one, the last earlier statement that assigns the optimizer (an
        `if` that builds one of two optimizers counts as one), so every wrapper the script puts
        around its optimizer (Horovod's) ends up inside the loss-scale optimizer."""
        holders = {
            id(n)
            for a in binding.scope[binding.name]
            if isinstance(a, Assignment)
            for n in self.ancestors(a.node)
        }
        child: cst.CSTNode = first_use
        for parent in self.ancestors(first_use):
            # Past a `def`, the statements before it in the enclosing block: an optimizer built at
            # module level and trained inside a function is wrapped where it is built.
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                index = list(parent.body).index(child)  # type: ignore[arg-type]
                for statement in reversed(parent.body[:index]):
                    if id(statement) in holders:
                        return statement
            child = parent
        return None

    def plan(self) -> None:
        for binding in self.finder.bindings.values():
            self._plan_binding(binding)
        for method, ctor, call in self.finder.inline:
            self._plan_inline(method, ctor, call)
        for method, call in self.finder.untraced:
            receiver = cst.Module([]).code_for_node(call.func.value)  # type: ignore[attr-defined]
            self.note(
                call,
                MANUAL,
                f"`{receiver}.{method}` trains an optimizer the tool cannot follow to its "
                "constructor; --add-loss-scale did not wrap it, add NPULossScaleOptimizer by hand",
            )

    def _plan_binding(self, binding: Binding) -> None:
        uses = sorted(binding.uses, key=lambda u: self.line(u[1]))
        first = uses[0][1]
        flavour = self.kinds.of_binding(binding)
        if flavour == "keras":
            self._keras(first, binding.name)
            return
        if flavour != "v1":
            self.note(
                first,
                MANUAL,
                f"cannot tell that `{binding.name}` is a tf.compat.v1 optimizer (it is passed "
                "in, or built by an expression the tool cannot follow in a file that uses "
                "Keras); --add-loss-scale did not wrap it, add NPULossScaleOptimizer by hand",
            )
            return
        anchors = self._anchors(binding, [call for _, call in uses])
        if anchors is None:
            return
        for anchor in dict.fromkeys(anchors.values()):  # each once, in the order of the uses
            self.after.setdefault(id(anchor), []).append(binding.name)
            self.wraps += 1
            self.note(
                anchor,
                RULE,
                f"`{binding.name}` is wrapped in NPULossScaleOptimizer with {self.manager_call}",
                "change",
            )
        applies = [c for m, c in uses if m == "apply_gradients"]
        scaled = any(m != "apply_gradients" for m, _ in uses)
        for call in applies:
            if not self._rewire_gradients(binding, anchors[id(call)], call) and not scaled:
                self.note(
                    call,
                    UNSCALED,
                    f"the gradients `{binding.name}.apply_gradients` receives are not computed "
                    f"by `{binding.name}.compute_gradients`, so the loss is not scaled there "
                    "(steps with inf/NaN gradients are still skipped); compute them with it",
                )

    def _anchors(self, binding: Binding, calls: list[cst.Call]) -> dict[int, cst.CSTNode] | None:
        """Per training call, where the optimizer it trains is wrapped; None (and a warning)
        where that cannot be one place per path.

        Each call trains what the last assignment on its path built. Where that assignment puts
        the optimizer into something the tool cannot tell is a tf.compat.v1 optimizer (a
        gradient-accumulation object), the wrap goes where the optimizer it was given was built:
        wrapping the plain object fails at start-up, and wrapping it in one branch only would
        leave the other paths unscaled. Two anchors of which one is built from the other would
        wrap the same optimizer twice on one path: refused.
        """
        anchors: dict[int, cst.CSTNode] = {}
        for call in calls:
            anchor = self.anchor(binding, call)
            while anchor is not None and self._rewraps_unknown(binding, anchor):
                anchor = self.anchor(binding, anchor)
            if anchor is None:
                self.note(
                    call,
                    MANUAL,
                    f"`{binding.name}` is not assigned before this training call in the same "
                    "block; --add-loss-scale did not wrap it, add NPULossScaleOptimizer by hand",
                )
                return None
            anchors[id(call)] = anchor
        distinct = list(dict.fromkeys(anchors.values()))
        for anchor in distinct:
            earlier = self.anchor(binding, anchor)
            while earlier is not None:
                if any(earlier is other for other in distinct):
                    self.note(
                        anchor,
                        MANUAL,
                        f"`{binding.name}` is trained on one path as built here and on another "
                        f"as built on line {self.line(earlier)}, which this one wraps; "
                        "--add-loss-scale did not wrap it (it would scale one path twice), add "
                        "NPULossScaleOptimizer by hand around the optimizer every path trains",
                    )
                    return None
                earlier = self.anchor(binding, earlier)
        return anchors

    def _rewraps_unknown(self, binding: Binding, anchor: cst.CSTNode) -> bool:
        """`opt = Something(opt, ...)` where Something is not known to be a tf.compat.v1
        optimizer (or one of the wrappers that keep its kind)."""
        statement = anchor.body[0] if isinstance(anchor, cst.SimpleStatementLine) else None
        if not isinstance(statement, cst.Assign) or not isinstance(statement.value, cst.Call):
            return False
        if binding.name not in names(list(statement.value.args)):
            return False
        return self.kinds.flavour(statement.value) not in ("v1", "keras")

    def _keras(self, node: cst.CSTNode, what: str) -> None:
        self.note(
            node,
            registry.UNPORTED_API,
            f"`{what}` is a Keras optimizer: --add-loss-scale wraps only tf.compat.v1 "
            "optimizers, and the tf.compat.v1 NPULossScaleOptimizer rejects a Keras one "
            "(ValueError at start-up); npu_lossscale has no Keras loss-scale optimizer yet, so "
            "add loss scaling by hand",
        )

    def _plan_inline(self, method: str, ctor: cst.Call, call: cst.Call) -> None:
        code = cst.Module([]).code_for_node(ctor)
        flavour = self.kinds.flavour(ctor)
        if flavour == "keras":
            self._keras(call, code)
            return
        if flavour != "v1":
            if method != "apply_gradients":
                self.note(
                    call,
                    MANUAL,
                    f"cannot tell that `{code}` is a tf.compat.v1 optimizer; --add-loss-scale "
                    "did not wrap it, add NPULossScaleOptimizer by hand",
                )
            return
        self.replace[id(ctor)] = cst.parse_expression(
            f"LossScaleOptimizer({code}, {self.manager_call})"
        )
        self.wraps += 1
        self.note(ctor, RULE, f"`{code}` is wrapped in NPULossScaleOptimizer", "change")
        if method == "apply_gradients":
            self.note(
                call,
                UNSCALED,
                f"`{code}.apply_gradients` gets gradients computed elsewhere, so the loss is not "
                "scaled there (steps with inf/NaN gradients are still skipped)",
            )

    def _rewire_gradients(self, binding: Binding, anchor: cst.CSTNode, apply: cst.Call) -> bool:
        """Take the gradients feeding `apply` from the wrapped optimizer's compute_gradients."""
        for gradients in self.finder.gradients:
            if id(gradients) in self.replace:
                continue
            statement = self.parents.get(gradients)
            scope = self._scope(gradients)
            if not isinstance(statement, cst.Assign) or scope is None:
                continue
            if scope is not self._scope(apply):
                continue
            derived = self._derived(statement, scope)
            if not (names(apply.args) & derived):
                continue
            if self.positions[gradients].start.line <= self.positions[anchor].end.line:
                self.note(
                    gradients,
                    UNSCALED,
                    f"these gradients feed `{binding.name}.apply_gradients` but are computed "
                    "before the optimizer exists, so the loss is not scaled; compute them with "
                    f"`{binding.name}.compute_gradients`",
                )
                return True
            arguments = _gradient_arguments(gradients)
            if arguments is None:
                self.note(
                    gradients,
                    UNSCALED,
                    "these tf.gradients arguments have no compute_gradients counterpart, so the "
                    f"loss is not scaled; compute them with `{binding.name}.compute_gradients`",
                )
                return True
            self.replace[id(gradients)] = _from_compute_gradients(
                gradients, binding.name, arguments
            )
            self.note(
                gradients,
                RULE,
                f"gradients now come from `{binding.name}.compute_gradients` (same order as the "
                "variables), so the loss is scaled",
                "change",
            )
            return True
        return False

    def _scope(self, node: cst.CSTNode) -> Scope | None:
        return self.finder.get_metadata(ScopeProvider, node, None)

    def _derived(self, statement: cst.Assign, scope: Scope) -> set[str]:
        """Names holding the gradients or values computed from them (clipping, zipping)."""
        derived = {n for t in statement.targets for n in names(t.target)}
        # A function's scope has its node; the module's (a flat top-level script) has none.
        root = scope.node if isinstance(scope, FunctionScope) else self.module
        assigns = [
            a
            for a in walk(root)
            if isinstance(a, cst.Assign) and self.line(a) > self.line(statement)
        ]
        for assign in sorted(assigns, key=self.line):
            if names(assign.value) & derived:
                derived |= {n for t in assign.targets for n in names(t.target)}
        return derived


def _gradient_arguments(call: cst.Call) -> list[cst.Arg] | None:
    """compute_gradients' arguments for a tf.gradients call (its own layout kept), or None when
    one has no counterpart there."""
    keywords = [a.keyword.value for a in call.args if a.keyword is not None]
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or len(positional) > 2:
        return None
    if len(positional) + sum(k in ("ys", "xs") for k in keywords) != 2:
        return None
    args = []
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in ("ys", "xs"):
            args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT))
        elif arg.keyword.value in _GRADIENT_KEYWORDS:
            renamed = cst.Name(_GRADIENT_KEYWORDS[arg.keyword.value])
            args.append(arg.with_changes(keyword=renamed))
        else:
            return None
    return args


def _from_compute_gradients(call: cst.Call, optimizer: str, args: list[cst.Arg]) -> cst.ListComp:
    """`[grad for grad, _ in optimizer.compute_gradients(...)]` in place of `tf.gradients(...)`."""
    template = cst.parse_expression("[grad for grad, _ in gradients]")
    assert isinstance(template, cst.ListComp)
    compute = call.with_changes(
        func=cst.Attribute(cst.Name(optimizer), cst.Name("compute_gradients")), args=args
    )
    return template.with_changes(for_in=template.for_in.with_changes(iter=compute))
