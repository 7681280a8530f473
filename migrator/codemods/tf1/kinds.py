"""Which kind an optimizer expression is: Keras 3, Keras 2, tf.compat.v1, or unknown.

The TF1 port wraps only tf.compat.v1 optimizers and the Keras port only Keras 3 ones, so both
ask this before porting a wrapper. The answer follows what the file shows: a constructor's
qualified name, a name to its assignments in scope, `self.x` to what its class assigns, a
function of this file to what it returns, a class of this file to its bases, a module alias
(`tfk = tf.keras`) to the module, and a wrapper (Horovod's, Keras's loss-scale one) to what it
wraps. It is a question asked of the file's metadata, not a visitor: nothing is collected.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment

from migrator.codemods.shared import api
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import small_statements


class OptimizerKinds:
    """`flavour(expr)`: 'keras', 'keras2' (tf_keras, optimizers.legacy, TensorFlow Addons), 'v1'
    or None (unknown)."""

    def __init__(self, file: FileContext) -> None:
        self.file = file

    def flavour(self, inner: cst.BaseExpression) -> str | None:
        flavour = self._flavour(inner, set())
        return None if flavour == "cycle" else flavour

    def _flavour(self, expr: cst.BaseExpression, seen: set[int]) -> str | None:
        """'keras', 'keras2' (tf_keras, optimizers.legacy, TensorFlow Addons), 'v1' or None
        (unknown) for an optimizer expression, following names to their assignments in scope and
        Horovod's wrapper to what it wraps."""
        if id(expr) in seen:
            return "cycle"  # `opt = wrap(opt)`: says nothing about the optimizer itself
        if len(seen) > 8:
            return "cycle"  # a chain this long is wrappers of wrappers: it says nothing
        seen.add(id(expr))
        if isinstance(expr, cst.Call):
            name = self.file.canonical(expr.func)
            if name is not None:
                flavour = _name_flavour(name)  # horovod.tensorflow.keras is Keras
                # A Keras loss-scale wrapper is of what it wraps (`opt = LSO(opt)`: a cycle).
                keras_wrapper = api.classify(name) in (
                    Kind.KERAS_OPTIMIZER,
                    Kind.KERAS_EXPERIMENTAL,
                )
                # tf.tpu.CrossShardOptimizer(opt) too: of what it wraps.
                wraps = api.wraps_optimizer(name) or (
                    flavour is None
                    and api.keeps_optimizer_kind(name)
                    and bool(expr.args)
                    and expr.args[0].keyword is None
                )
                if (flavour is None or keras_wrapper) and wraps and expr.args:
                    return self._flavour(expr.args[0].value, seen)
                return flavour
            if (
                isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value == "DistributedOptimizer"
                and expr.args
                and expr.args[0].keyword is None
            ):
                # Horovod bound where no import shows it (`hvd = LazyImport("horovod...")`):
                # its wrapper is of what it wraps, as where the import resolves.
                return self._flavour(expr.args[0].value, seen)
            aliased = self._through_module_alias(expr.func)
            if aliased is not None:
                return _name_flavour(aliased)
            return self._class_flavour(expr.func) or self._function_flavour(expr.func, seen)
        if isinstance(expr, cst.Name):
            return _agreed({self._assigned_flavour(a, seen) for a in self.file.assignments(expr)})
        if isinstance(expr, cst.Attribute):
            return self._attribute_flavour(expr, seen)
        return None

    def _attribute_flavour(self, expr: cst.Attribute, seen: set[int]) -> str | None:
        """`self.optimizer`: what the enclosing class assigns to that attribute of `self`."""
        if not (isinstance(expr.value, cst.Name) and expr.value.value == "self"):
            return None
        cls = self.file.parent(expr)
        while cls is not None and not isinstance(cls, cst.ClassDef):
            cls = self.file.parent(cls)
        if cls is None:
            return None
        values = []
        for node in small_statements(cls.body, skip=(cst.ClassDef,)):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    t = target.target
                    if (
                        isinstance(t, cst.Attribute)
                        and t.attr.value == expr.attr.value
                        and isinstance(t.value, cst.Name)
                        and t.value.value == "self"
                    ):
                        values.append(node.value)
        return _agreed({self._flavour(v, seen) for v in values})

    def _through_module_alias(self, func: cst.BaseExpression) -> str | None:
        """`tfk.optimizers.Adam` where the file says `tfk = tf.keras` once: the qualified name
        of `tf.keras.optimizers.Adam` (scripts shorten module paths this way)."""
        root: cst.BaseExpression = func
        rest: list[str] = []
        while isinstance(root, cst.Attribute):
            rest.insert(0, root.attr.value)
            root = root.value
        if not rest or not isinstance(root, cst.Name):
            return None
        assignments = self.file.assignments(root)
        if len(assignments) != 1:
            return None
        holder = self.file.parent(assignments[0].node)
        statement = self.file.parent(holder) if holder is not None else None
        if not (isinstance(holder, cst.AssignTarget) and isinstance(statement, cst.Assign)):
            return None
        if not isinstance(statement.value, cst.Attribute):
            return None
        module = self.file.canonical(statement.value)
        return ".".join([module, *rest]) if module is not None else None

    def _assigned_flavour(self, assignment: Assignment, seen: set[int]) -> str | None:
        value = self.file.assigned_value(assignment)
        return self._flavour(value, seen) if value is not None else None

    def _function_flavour(self, func: cst.BaseExpression, seen: set[int]) -> str | None:
        """A function defined in this file (`make_optimizer()`): the flavour its returns agree
        on, Keras 2 winning as for a name assigned twice."""
        if not isinstance(func, cst.Name):
            return None
        defs = [a.node for a in self.file.assignments(func) if isinstance(a.node, cst.FunctionDef)]
        if len(defs) != 1:
            return None
        values = [r.value for r in _returns(defs[0].body) if r.value is not None]
        return _agreed({self._flavour(v, seen) for v in values})

    def _class_flavour(self, func: cst.BaseExpression) -> str | None:
        """A class defined in this file: Keras or v1 by its bases (BERT's AdamWeightDecay)."""
        if not isinstance(func, cst.Name):
            return None
        classes = [a.node for a in self.file.assignments(func) if isinstance(a.node, cst.ClassDef)]
        if len(classes) != 1:
            return None
        for base in classes[0].bases:
            name = self.file.canonical(base.value)
            flavour = _name_flavour(name) if name is not None else None
            if flavour is None and isinstance(base.value, cst.Name):
                flavour = self._class_flavour(base.value)
            if flavour is not None:
                return flavour
        return None


def _name_flavour(name: str) -> str | None:
    flavour = api.optimizer_flavour(name)
    return "keras2" if flavour == "keras" and api.is_keras_2_optimizer(name) else flavour


def _returns(block: cst.CSTNode) -> list[cst.Return]:
    """The return statements of a function body, not those of functions or classes inside it."""
    found: list[cst.Return] = []
    stack = [block]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Return):
            found.append(node)
        elif not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.BaseExpression)):
            stack.extend(node.children)
    return found


def _agreed(flavours: set[str | None]) -> str | None:
    """One flavour for several assignments or returns: Keras 2 wins (it is what fails), then
    Keras; v1 only where all agree; a cycle (`opt = wrap(opt)`) says nothing."""
    flavours.discard("cycle")
    if not flavours:
        return "cycle"  # only wrappers of itself: no information either way
    for keras in ("keras2", "keras"):
        if keras in flavours:
            return keras
    return "v1" if flavours == {"v1"} else None
