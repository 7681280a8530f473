"""`--add-loss-scale`: give loss scaling to a script that trains without it.

The vendor's guide tells users whose GPU script has no loss scaling to wrap their optimizer in
`NPULossScaleOptimizer(opt, manager)` by hand. This codemod does that wrapping in the spelling of
the pre-TF2 contrib API (`LossScaleOptimizer`, `ExponentialUpdateLossScaleManager`,
`FixedLossScaleManager`, imported from `tensorflow.contrib.mixed_precision`), and the ordinary
port then runs over the result exactly as over a script that had scaled its loss on the GPU: one
place decides `is_distributed`, rewrites the imports, and moves the global step. So a script
with and without its own loss scaling come out of the tool the same way.

Only what provably is a tf.compat.v1 optimizer is wrapped (a Keras optimizer in that class raises
ValueError at start-up); gradients from `tf.gradients(loss, vars)` that feed the wrapped
optimizer's `apply_gradients` are taken from its `compute_gradients` instead, or the loss would
never be scaled. Everything else is reported, never guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import libcst as cst
from libcst.metadata import (
    Assignment,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    Scope,
    ScopeProvider,
)

from migrator.codemods import api
from migrator.codemods.add_loss_scale_choice import manager_call
from migrator.codemods.global_step.edit import template
from migrator.codemods.qualified import qualified_names
from migrator.findings import Finding
from migrator.prefilter import LOSS_SCALE_TRIGGERS, might_need_loss_scale_added

RULE = "add-loss-scale"
MANUAL = "add-loss-scale-manual"
UNSCALED = "add-loss-scale-unscaled"
CONTRIB = api.CONTRIB
_TRAINING = ("minimize", "compute_gradients", "apply_gradients")
# tf.gradients keywords that compute_gradients takes under the same or another name.
_GRADIENT_KEYWORDS = {
    "colocate_gradients_with_ops": "colocate_gradients_with_ops",
    "aggregation_method": "aggregation_method",
    "grad_ys": "grad_loss",
}
_MANAGER_VARIABLE = "loss_scale_manager"


@dataclasses.dataclass
class _Binding:
    """One optimizer variable of one scope and the training calls made on it."""

    name: str
    scope: Scope
    uses: list[tuple[str, cst.Call]] = dataclasses.field(default_factory=list)


class _Finder(cst.CSTVisitor):
    """Collects the training calls, the inline constructors and the tf.gradients calls."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentNodeProvider, PositionProvider)

    def __init__(self, done: Callable[[], None]) -> None:
        super().__init__()
        self.done = done  # runs while the metadata is still resolved
        self.bindings: dict[object, _Binding] = {}
        self.inline: list[tuple[str, cst.Call, cst.Call]] = []  # (method, ctor, training call)
        self.untraced: list[tuple[str, cst.Call]] = []
        self.gradients: list[cst.Call] = []
        self.methods: list[bool] = []  # per enclosing def: is it a training method itself

    def canonical(self, node: cst.CSTNode) -> str | None:
        names = sorted(q.name for q in qualified_names(self, node))
        return api.canonical(names[0]) if names else None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _TRAINING and not self.delegating:
            method, receiver = func.attr.value, func.value
            if isinstance(receiver, cst.Name):
                scope = self.get_metadata(ScopeProvider, receiver, None)
                if scope is not None:
                    # One binding per variable, wherever it is used from: keyed by its assignments.
                    assigned = scope[receiver.value] if receiver.value in scope else ()
                    key = frozenset(id(a) for a in assigned) or (id(scope), receiver.value)
                    binding = self.bindings.setdefault(key, _Binding(receiver.value, scope))
                    binding.uses.append((method, node))
            elif isinstance(receiver, cst.Call):
                self.inline.append((method, receiver, node))
            else:
                self.untraced.append((method, node))
        elif self.canonical(func) == "tensorflow.gradients":
            self.gradients.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        self.done()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # An optimizer's own apply_gradients/minimize handing the work to an inner optimizer
        # (a wrapper class) is not the script training: nothing to wrap there.
        self.methods.append(node.name.value in _TRAINING)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.methods.pop()

    @property
    def delegating(self) -> bool:
        return any(self.methods)


class _Planner:
    """Decides what to wrap and where, from what the finder collected."""

    def __init__(self, wrapper: MetadataWrapper, path: str, choice: str, keras: bool) -> None:
        self.finder = _Finder(self.plan)
        self.keras = keras  # the file mentions Keras: an unknown optimizer may be a Keras one
        self.path = path
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions = wrapper.resolve(PositionProvider)
        self.manager_class, self.manager_call = manager_call(choice)
        self.findings: list[Finding] = []
        self.choice = choice
        self.after: dict[int, list[str]] = {}  # statement -> optimizer names wrapped after it
        self.replace: dict[int, cst.BaseExpression] = {}  # node -> its replacement
        self.wraps = 0
        self.indents: dict[int, str] = {}  # anchor statement -> its indentation

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def note(self, node: cst.CSTNode, rule: str, message: str, kind: str = "warning") -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, kind))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ what an optimizer is
    def flavour(self, expr: cst.BaseExpression, seen: frozenset[int] = frozenset()) -> str | None:
        """'v1', 'keras' or None (cannot tell), following names and optimizer wrappers."""
        if id(expr) in seen or len(seen) > 8:
            return "cycle"
        seen = seen | {id(expr)}
        if isinstance(expr, cst.Name):
            return self._name_flavour(expr, seen)
        if not isinstance(expr, cst.Call):
            return None
        name = self.finder.canonical(expr.func)
        flavour = api.optimizer_flavour(name) if name is not None else None
        if flavour is None and isinstance(expr.func, cst.Name):
            flavour = self._class_flavour(expr.func, seen)
        if flavour is None and _wraps(name, expr):
            return self.flavour(expr.args[0].value, seen)
        return flavour

    def _name_flavour(self, name: cst.Name, seen: frozenset[int]) -> str | None:
        flavours = {self._assigned(a, seen) for a in self.assignments(name)}
        flavours.discard("cycle")
        if "keras" in flavours:
            return "keras"
        return "v1" if flavours == {"v1"} else None

    def assignments(self, name: cst.Name) -> list[Assignment]:
        scope = self.finder.get_metadata(ScopeProvider, name, None)
        if scope is None or name.value not in scope:
            return []
        return [a for a in scope[name.value] if isinstance(a, Assignment)]

    def _assigned(self, assignment: Assignment, seen: frozenset[int]) -> str | None:
        holder = self.parents.get(assignment.node)
        statement = self.parents.get(holder) if holder is not None else None
        if isinstance(holder, cst.AssignTarget) and isinstance(statement, cst.Assign):
            return self.flavour(statement.value, seen)
        param = assignment.node if isinstance(assignment.node, cst.Param) else holder
        if isinstance(param, cst.Param):
            # `optimizer="adamw"` names which optimizer to build (ALBERT): not one itself.
            default = param.default
            text = isinstance(default, (cst.SimpleString, cst.ConcatenatedString))
            return "cycle" if text else "param"
        return None  # a loop target, an import: built where the tool cannot see

    def _class_flavour(self, func: cst.Name, seen: frozenset[int]) -> str | None:
        """A class defined in this file is what its bases are (BERT's AdamWeightDecay)."""
        classes = [a.node for a in self.assignments(func) if isinstance(a.node, cst.ClassDef)]
        if len(classes) != 1:
            return None
        for base in classes[0].bases:
            name = self.finder.canonical(base.value)
            flavour = api.optimizer_flavour(name) if name is not None else None
            if flavour is None and isinstance(base.value, cst.Name):
                flavour = self._class_flavour(base.value, seen | {id(base)})
            if flavour is not None:
                return flavour
        return None

    # ------------------------------------------------------------------ where to wrap
    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def anchor(self, binding: _Binding, first_use: cst.Call) -> cst.CSTNode | None:
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

    # ------------------------------------------------------------------ decisions
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

    def _plan_binding(self, binding: _Binding) -> None:
        uses = sorted(binding.uses, key=lambda u: self.line(u[1]))
        first = uses[0][1]
        flavour = self._binding_flavour(binding)
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
        anchor = self.anchor(binding, first)
        if anchor is None:
            self.note(
                first,
                MANUAL,
                f"`{binding.name}` is not assigned before its first training call in the same "
                "block; --add-loss-scale did not wrap it, add NPULossScaleOptimizer by hand",
            )
            return
        self.after.setdefault(id(anchor), []).append(binding.name)
        self.indents[id(anchor)] = " " * self.positions[anchor].start.column
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
            if not self._rewire_gradients(binding, anchor, call) and not scaled:
                self.note(
                    call,
                    UNSCALED,
                    f"the gradients `{binding.name}.apply_gradients` receives are not computed "
                    f"by `{binding.name}.compute_gradients`, so the loss is not scaled there "
                    "(steps with inf/NaN gradients are still skipped); compute them with it",
                )

    def _binding_flavour(self, binding: _Binding) -> str | None:
        """As the port decides (codemods.loss_scale): Keras where a constructor says so; in a
        file that never mentions Keras an optimizer built here is a tf.compat.v1 one even where
        its class is imported (ALBERT's LAMB), since a TF1 script has no other kind."""
        flavours = set()
        for assignment in binding.scope[binding.name]:
            if not isinstance(assignment, Assignment):
                return None
            flavours.add(self._assigned(assignment, frozenset()))
        flavours.discard("cycle")
        if "keras" in flavours:
            return "keras"
        if flavours == {"v1"} or (not self.keras and flavours and flavours <= {"v1", None}):
            return "v1"
        return None

    def _keras(self, node: cst.CSTNode, what: str) -> None:
        self.note(
            node,
            "unported-api",
            f"`{what}` is a Keras optimizer: --add-loss-scale wraps only tf.compat.v1 "
            "optimizers, and the tf.compat.v1 NPULossScaleOptimizer rejects a Keras one "
            "(ValueError at start-up); npu_lossscale has no Keras loss-scale optimizer yet, so "
            "add loss scaling by hand",
        )

    def _plan_inline(self, method: str, ctor: cst.Call, call: cst.Call) -> None:
        code = cst.Module([]).code_for_node(ctor)
        flavour = self.flavour(ctor)
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

    # ------------------------------------------------------------------ tf.gradients
    def _rewire_gradients(self, binding: _Binding, anchor: cst.CSTNode, apply: cst.Call) -> bool:
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
            if not (_names(apply.args) & derived):
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
        derived = {n for t in statement.targets for n in _names(t.target)}
        assigns = [
            a
            for a in _walk(scope.node)
            if isinstance(a, cst.Assign) and self.line(a) > self.line(statement)
        ]
        for assign in sorted(assigns, key=self.line):
            if _names(assign.value) & derived:
                derived |= {n for t in assign.targets for n in _names(t.target)}
        return derived


def _wraps(name: str | None, call: cst.Call) -> bool:
    """Horovod's DistributedOptimizer, TPU's CrossShardOptimizer and the like take the optimizer
    first and keep its kind."""
    if name is None or not call.args or call.args[0].keyword is not None:
        return False
    module, _, leaf = name.rpartition(".")
    return api.wraps_optimizer(name) or (
        leaf.endswith("Optimizer") and module.startswith(("tensorflow.", "horovod."))
    )


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _names(node: cst.CSTNode | tuple[cst.Arg, ...] | list[cst.Arg]) -> set[str]:
    nodes = node if isinstance(node, (tuple, list)) else [node]
    return {n.value for item in nodes for n in _walk(item) if isinstance(n, cst.Name)}


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


class _Rewriter(cst.CSTTransformer):
    """Applies the plan: replaced calls, and the wrap after each anchor statement."""

    def __init__(self, planner: _Planner) -> None:
        super().__init__()
        self.planner = planner

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        return self.planner.replace.get(id(original), updated)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        updated = super().on_leave(original, updated)
        names = self.planner.after.get(id(original))
        if not names or not isinstance(updated, cst.BaseStatement):
            return updated
        indent = self.planner.indents[id(original)]
        return cst.FlattenSentinel([updated, *self._wrap_statements(names, indent)])

    def _wrap_statements(self, names: list[str], indent: str) -> list[cst.BaseStatement]:
        statements: list[cst.BaseStatement] = []
        for name in names:
            code = template("add_loss_scale_wrap.py.tmpl").format(
                manager=_MANAGER_VARIABLE,
                manager_call=manager_call(self.planner.choice, indent)[1],
                optimizer=name,
            )
            parsed = cst.parse_module(code)
            first, *rest = parsed.body
            statements += [first.with_changes(leading_lines=parsed.header), *rest]
        return statements


def _import_statement(manager: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"from {CONTRIB} import {manager}, LossScaleOptimizer\n")  # type: ignore[return-value]


def _with_import(module: cst.Module, manager: str) -> cst.Module:
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


def add_loss_scale(
    module: cst.Module, source: bytes, path: str, choice: str
) -> tuple[cst.Module, list[Finding]]:
    """Wrap the file's tf.compat.v1 optimizers; the module unchanged when there is nothing to do.

    A file that mentions any loss-scale API already scales its loss (or is ported already): the
    ordinary port handles it, and wrapping again would scale twice.
    """
    if any(t in source for t in LOSS_SCALE_TRIGGERS) or not might_need_loss_scale_added(source):
        return module, []
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    planner = _Planner(wrapper, path, choice, keras=b"keras" in source)
    wrapper.visit(planner.finder)
    if not planner.wraps:
        return module, planner.findings
    rewritten = wrapper.module.visit(_Rewriter(planner))
    return _with_import(rewritten, planner.manager_class), planner.findings
