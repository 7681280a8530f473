"""Whether an optimizer is a tf.compat.v1 one (which `--add-loss-scale` wraps) or a Keras one.

Decided as the port decides it (codemods.loss_scale): by the qualified name of the constructor,
followed through names, optimizer wrappers (Horovod's, TPU's) and classes of the file; a Keras
optimizer in the tf.compat.v1 NPULossScaleOptimizer raises ValueError at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import Assignment, ScopeProvider

from migrator.codemods.add_loss_scale.finder import Binding, Finder
from migrator.codemods.shared import api


class Kinds:
    """'v1', 'keras' or None (cannot tell) for optimizer expressions and variables of one file."""

    def __init__(
        self, finder: Finder, parents: Mapping[cst.CSTNode, cst.CSTNode], keras: bool
    ) -> None:
        self.finder = finder
        self.parents = parents
        self.keras = keras  # the file mentions Keras: an unknown optimizer may be a Keras one

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

    def of_binding(self, binding: Binding) -> str | None:
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


def _wraps(name: str | None, call: cst.Call) -> bool:
    """Horovod's DistributedOptimizer, TPU's CrossShardOptimizer and the like take the optimizer
    first and keep its kind."""
    if name is None or not call.args or call.args[0].keyword is not None:
        return False
    return api.keeps_optimizer_kind(name)
