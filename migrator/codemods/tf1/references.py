"""Which names of a file are loss-scale APIs, and who handles each.

Every maximal dotted reference (`tf.contrib.mixed_precision.LossScaleOptimizer`, `Scaler`) rooted
at an imported name is resolved to its qualified name once, classified by `shared/api.py`, and
handed with its call (if it is the callee of one) to the handler registered for its kind: the
loss-scale objects, the optimizers, the Keras port. What cannot be resolved is warned here: a
name bound to several things, a class reached through a call or a value, `getattr()` on
tf.contrib, a contrib module used as a value, an API with no counterpart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import libcst as cst

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import code, dotted, is_dotted_name, small_statements
from migrator.codemods.shared.qualified import alias_names
from migrator.codemods.tf1.keras_facts import KerasFacts

# A reference of one kind: (the Name/Attribute, the call it is the callee of, kind, qualified name)
Handler = Callable[[cst.CSTNode, "cst.Call | None", Kind, str], None]

_LOSS_SCALE_CLASS_NAMES = frozenset(
    {
        "LossScaleOptimizer",
        "ExponentialUpdateLossScaleManager",
        "FixedLossScaleManager",
        "MixedPrecisionLossScaleOptimizer",
        "DynamicLossScale",
        "FixedLossScale",
    }
)


class ApiReferences:
    """The references visitor: `visit_Name`/`visit_Attribute` return whether to look inside.

    `handlers` maps each kind to its handler; UNPORTED and CONTRIB_MODULE are warned here (pass
    `unported` and `module_access`). Every resolved name is shown to `keras_facts` too.
    """

    def __init__(self, file: FileContext, keras_facts: KerasFacts) -> None:
        self.file = file
        self.keras_facts = keras_facts
        self.handlers: Mapping[Kind, Handler] = {}
        self._skip: set[int] = set()
        # names any import binds (None: a star import binds unknown ones); only a reference
        # rooted at one of them can be an API the port handles
        self._imported_roots: set[str] | None = None
        self._foreign_warned: set[str] = set()  # libraries whose loss-scale class was warned

    def visit_Module(self, node: cst.Module) -> None:
        self._imported_roots = _imported_roots(node)

    def visit_Name(self, node: cst.Name) -> bool:
        self._reference(node)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self._reference(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = self.file.canonical(node.func)
        if func == "builtins.getattr" or (
            func is None and isinstance(node.func, cst.Name) and node.func.value == "getattr"
        ):
            self._getattr(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> bool:
        """Handle a (maximal) dotted reference; returns whether to look inside it."""
        if id(node) in self._skip:
            return False
        if not is_dotted_name(node):
            # `Optimizer(...).minimize`, `managers[0].get_loss_scale`: an attribute of a value.
            # libcst names it after the expression it hangs off, but only that expression (a
            # call, visited next) can be ported; the attribute stays as it is. A loss-scale
            # class reached that way (`contrib.mixed_precision().LossScaleOptimizer`, a lazy
            # loader) is warned: the tool cannot port what it cannot resolve.
            if isinstance(node, cst.Attribute) and node.attr.value in _LOSS_SCALE_CLASS_NAMES:
                self.file.warn(
                    node,
                    registry.UNRESOLVED_ACCESS,
                    f"`{code(node)}` reaches a loss-scale class through a call or a value the "
                    "tool cannot follow (a lazy loader?); port it by hand",
                )
            return True
        if not self._may_be_imported(node):
            # Not rooted at an imported name, so no qualified name can make it an API we port.
            # Skipping the scope query keeps a long module linear: libcst walks every
            # assignment of a name on each query, quadratic where one name is assigned often.
            return True
        if self.file.ambiguous(node):
            self.file.warn(
                node,
                registry.UNRESOLVED_ACCESS,
                f"`{code(node)}` is bound to more than one thing in this scope "
                "(e.g. a try/except import); port it by hand",
            )
            return False
        name = self.file.canonical(node)
        if name is not None:
            self.keras_facts.saw(name, node)
        kind = api.classify(name) if name is not None else None
        if kind is None:
            if name is not None and api.foreign_loss_scale(name) is not None:
                self._foreign(node, name)
                return False
            return True
        parent = self.file.parent(node)
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        self.handlers[kind](node, call, kind, name or "")
        return False

    def _foreign(self, node: cst.Name | cst.Attribute, name: str) -> None:
        """Another library's LossScaleOptimizer: left, and warned once per library and file,
        since nothing else in such a file may name a loss-scale API to port."""
        library = name.split(".")[0]
        if library in self._foreign_warned:
            return
        self._foreign_warned.add(library)
        self.file.warn(
            node,
            registry.TF_FOREIGN_LOSS_SCALE,
            f"`{code(node)}` ({api.foreign_loss_scale(name)} LossScaleOptimizer) is left as it "
            "is: its overflow check looks for inf/NaN only, so on an Ascend NPU in saturation "
            "mode, where an overflow is clamped to the fp16 maximum (65504), an overflowed step "
            "is applied; wrap the optimizer in npu_lossscale.keras.LossScaleOptimizer (Keras) or "
            "npu_lossscale.NPULossScaleOptimizer (tf.compat.v1) where the library allows it, or "
            "run in INF/NAN mode",
        )

    def _getattr(self, call: cst.Call) -> None:
        if not call.args:
            return
        target = call.args[0].value
        name = self.file.canonical(target)
        if name is None:
            return
        if name.startswith("tensorflow.contrib") or api.classify(name) is Kind.CONTRIB_MODULE:
            self._skip.add(id(target))
            self.file.warn(
                call,
                registry.UNRESOLVED_ACCESS,
                "getattr() on tf.contrib: the attribute is chosen at run time, so the tool "
                "cannot tell which loss-scale class is used; port it by hand",
            )

    def _may_be_imported(self, node: cst.Name | cst.Attribute) -> bool:
        if self._imported_roots is None:
            return True
        root: cst.BaseExpression = node
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and root.value in self._imported_roots

    def unported(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, name: str) -> None:
        self.file.warn(
            node,
            registry.UNPORTED_API,
            f"`{code(node)}` ({name}) has no npu_lossscale counterpart the tool can substitute; "
            "port it by hand",
        )

    def module_access(self, node: cst.CSTNode, *_: object) -> None:
        self.file.warn(
            node,
            registry.UNRESOLVED_ACCESS,
            f"`{code(node)}` is used as a module object (passed, returned or stored); the tool "
            "cannot follow it to the class used, port it by hand",
        )


def _imported_roots(module: cst.Module) -> set[str] | None:
    """Every name an import statement binds, anywhere in the module, and every name assigned a
    dotted name rooted at one (`keras = tf.keras`: FileContext.canonical follows such an alias);
    None with a star import."""
    names: set[str] = set()
    for node in small_statements(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(dotted(bound).split(".")[0])  # type: ignore[arg-type]
        elif isinstance(node, cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar):
                return None
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(dotted(bound))  # type: ignore[arg-type]
    return names | alias_names(module, names)
