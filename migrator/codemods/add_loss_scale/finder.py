"""What `--add-loss-scale` looks at: the training calls and the tf.gradients calls of a file."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, Scope, ScopeProvider

from migrator.codemods.shared import api
from migrator.codemods.shared.qualified import qualified_names

TRAINING = ("minimize", "compute_gradients", "apply_gradients")
# Helpers that train the optimizer they are given (tf.contrib.training, slim, tf_slim).
HELPERS = ("create_train_op",)


@dataclasses.dataclass
class Binding:
    """One optimizer variable of one scope and the training calls made on it."""

    name: str
    scope: Scope
    uses: list[tuple[str, cst.Call]] = dataclasses.field(default_factory=list)


class Finder(cst.CSTVisitor):
    """Collects the training calls, the inline constructors and the tf.gradients calls."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentNodeProvider, PositionProvider)

    def __init__(self, done: Callable[[], None]) -> None:
        super().__init__()
        self.done = done  # runs while the metadata is still resolved
        self.bindings: dict[object, Binding] = {}
        self.inline: list[tuple[str, cst.Call, cst.Call]] = []  # (method, ctor, training call)
        self.untraced: list[tuple[str, cst.Call]] = []
        self.gradients: list[cst.Call] = []
        self.methods: list[bool] = []  # per enclosing def: is it a training method itself

    def canonical(self, node: cst.CSTNode) -> str | None:
        names = sorted(q.name for q in qualified_names(self, node))
        return api.canonical(names[0]) if names else None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in TRAINING and not self.delegating:
            method, receiver = func.attr.value, func.value
            if isinstance(receiver, cst.Name):
                self._use(receiver, method, node)
            elif isinstance(receiver, cst.Call):
                self.inline.append((method, receiver, node))
            else:
                self.untraced.append((method, node))
            return
        name = self.canonical(func)
        if name == "tensorflow.gradients":
            self.gradients.append(node)
        elif name is not None and name.rpartition(".")[2] in HELPERS and not self.delegating:
            # slim's create_train_op(loss, optimizer) calls compute_gradients and apply_gradients
            # of the optimizer it is given: wrapping that optimizer scales the loss.
            given = [a.value for a in node.args if a.keyword and a.keyword.value == "optimizer"]
            given = given or [a.value for a in node.args[1:2] if a.keyword is None]
            if given and isinstance(given[0], cst.Name):
                self._use(given[0], "compute_gradients", node)

    def _use(self, receiver: cst.Name, method: str, call: cst.Call) -> None:
        scope = self.get_metadata(ScopeProvider, receiver, None)
        if scope is None:
            return
        # One binding per variable, wherever it is used from: keyed by its assignments.
        assigned = scope[receiver.value] if receiver.value in scope else ()
        key = frozenset(id(a) for a in assigned) or (id(scope), receiver.value)
        binding = self.bindings.setdefault(key, Binding(receiver.value, scope))
        binding.uses.append((method, call))

    def leave_Module(self, original_node: cst.Module) -> None:
        self.done()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # An optimizer's own apply_gradients/minimize handing the work to an inner optimizer
        # (a wrapper class) is not the script training: nothing to wrap there.
        self.methods.append(node.name.value in TRAINING)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.methods.pop()

    @property
    def delegating(self) -> bool:
        return any(self.methods)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def names(node: cst.CSTNode | tuple[cst.Arg, ...] | list[cst.Arg]) -> set[str]:
    nodes = node if isinstance(node, (tuple, list)) else [node]
    return {n.value for item in nodes for n in walk(item) if isinstance(n, cst.Name)}
