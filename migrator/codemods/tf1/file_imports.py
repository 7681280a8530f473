"""The file's own imports: what they bind, which the port removes, which stay for other files.

Walking the imports records the npu_lossscale ones already there (their style is kept), the
tf.contrib and Keras mixed-precision names the port may make unused, star imports (warned: what
they bind cannot be resolved), npu_bridge imports (a file ported already) and Horovod/TensorFlow
aliases (distribution facts). Once every use is decided, `plan_removals` drops an import whose
every reference was rewritten, unless another file of the run imports the name from this one
(then it is re-pointed at npu_lossscale) or this module's `__all__` lists it.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Scope

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.distributed import DistributedFacts
from migrator.codemods.shared.nodes import dotted
from migrator.selection.reexports import names_imported_from

_CONTRIB_TO_NPU = {
    "LossScaleOptimizer": api.OPTIMIZER,
    api.FIXED: api.FIXED,
    api.DYNAMIC: api.DYNAMIC,
}


class FileImports:
    """Collects the import statements while walking; `plan_removals` decides them at the end.

    `reexports` are the (module, name) pairs other files of the run import
    (migrator.selection.reexports); `facts` receives the Horovod and TensorFlow aliases.
    """

    def __init__(
        self, file: FileContext, reexports: frozenset[tuple[str, str]], facts: DistributedFacts
    ) -> None:
        self.file = file
        self.facts = facts
        # names other files of the run import from this module
        self.reexported = names_imported_from(reexports, file.path)
        self.vendor_ported = False
        self.npu_imports: list[cst.ImportFrom] = []
        # dotted names top-level `import npu_lossscale[.keras] [as x]` statements bind
        self.npu_modules: dict[str, str] = {}
        self.contrib_imports: list[tuple[cst.CSTNode, int, str]] = []
        self.keras_imports: list[tuple[cst.CSTNode, int, str]] = []
        self.dunder_all: set[str] = set()
        # (id of an import statement, name) for the bindings the port removes
        self.removed_bindings: set[tuple[int, str]] = set()
        # class names a contrib `import *` binds, which the port's own import must not shadow
        self.star_bound: set[str] = set()
        self.global_scope: Scope | None = None

    def visit_Module(self, node: cst.Module) -> None:
        self.global_scope = self.file.scope(node)

    def visit_Import(self, node: cst.Import) -> bool:
        top_level = isinstance(self.file.parent(self.file.parent(node)), cst.Module)
        for index, alias in enumerate(node.names):
            name = api.canonical(dotted(alias.name))
            bound = alias.asname.name.value if alias.asname else dotted(alias.name)
            if top_level and name in (api.LIBRARY, api.KERAS_MODULE):
                self.npu_modules[name] = bound
            self._note_import(node, index, name, bound)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            return False
        module = api.canonical(dotted(node.module))
        if api.is_vendor_module(module):
            self.vendor_ported = True
        if module in (api.LIBRARY, api.KERAS_MODULE) and not isinstance(node.names, cst.ImportStar):
            self.npu_imports.append(node)
        if isinstance(node.names, cst.ImportStar):
            if api.is_contrib_module(module) or module == "tensorflow.contrib":
                # Its names stay bound (to contrib): an added import must not take them over.
                if api.is_contrib_module(module):
                    self.star_bound.update((api.FIXED, api.DYNAMIC))
                self.file.warn(
                    node,
                    registry.STAR_IMPORT,
                    f"`from {module} import *`: names it provides cannot be resolved; "
                    "port their uses by hand and import them explicitly",
                )
            elif api.is_horovod_module(module):
                self.facts.horovod_imported = True
            return False
        for index, alias in enumerate(node.names):
            name = f"{module}.{dotted(alias.name)}"
            bound = alias.asname.name.value if alias.asname else dotted(alias.name)
            self._note_import(node, index, name, bound)
        return False

    def _note_import(self, node: cst.CSTNode, index: int, name: str, bound: str) -> None:
        if api.is_vendor_module(name):
            self.vendor_ported = True
        elif api.is_horovod_module(name):
            self.facts.horovod_imported = True
            self.facts.horovod_aliases[bound] = node
        elif api.is_contrib_module(name) or name == "tensorflow.contrib.mixed_precision":
            self.contrib_imports.append((node, index, bound))
        elif name == "tensorflow" and "." not in bound:
            self.facts.tensorflow_aliases[bound] = node
        elif api.is_keras_mixed_precision(name):
            self.keras_imports.append((node, index, bound))

    def visit_Assign(self, node: cst.Assign) -> None:
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and node.targets[0].target.value == "__all__"
            and isinstance(node.value, (cst.List, cst.Tuple))
        ):
            values = (args_.string_value(e.value) for e in node.value.elements)
            self.dunder_all.update(v for v in values if v is not None)

    def plan_removals(self) -> None:
        self._plan_keras_import_removals()
        for node, index, bound in self.contrib_imports:
            scope = self.file.scope(node)
            refs = self._references(node, bound)
            if scope is None or refs is None:
                continue
            if not refs and self._keep_reexport(node, scope, bound):
                # A pure re-export another file of the run takes from here: rebound, not warned.
                self.file.edits.removals.setdefault(node, set()).add(index)
                self.removed_bindings.add((id(node), bound))
            elif not refs:
                # Nothing here to port, but the file still fails to import without tf.contrib.
                self.file.warn(
                    node,
                    registry.UNPORTED_API,
                    f"`{bound}` is imported from tf.contrib and not used in this file (a "
                    "re-export?); tf.contrib does not exist in TensorFlow 2 or on Ascend: import "
                    f"it from {api.LIBRARY} here, and port the modules importing it from this one",
                )
            elif self.file.edits and all(id(r) in self.file.consumed for r in refs):
                self.file.edits.removals.setdefault(node, set()).add(index)
                self.removed_bindings.add((id(node), bound))
                self.file.change(
                    node, registry.CONTRIB_IMPORT, f"removed the unused import of `{bound}`"
                )
                self._keep_reexport(node, scope, bound)

    def _plan_keras_import_removals(self) -> None:
        """Drop a Keras mixed-precision import whose every use the Keras port rewrote. Kept when
        anything else may still read the name: another use, another file of the run importing
        it from here, or this module's `__all__`."""
        for node, index, bound in self.keras_imports:
            refs = self._references(node, bound)
            if not refs or not all(id(r) in self.file.consumed for r in refs):
                continue
            global_scope = self.file.scope(node) is self.global_scope
            if global_scope and (bound in self.reexported or bound in self.dunder_all):
                continue
            self.file.edits.removals.setdefault(node, set()).add(index)
            self.removed_bindings.add((id(node), bound))
            self.file.change(
                node, registry.KERAS_IMPORT, f"removed the import of `{bound}`: no use is left"
            )

    def _keep_reexport(self, node: cst.CSTNode, scope: Scope, bound: str) -> bool:
        """Keep `bound` importable from this module when another file of the run imports it
        (`from utils import LossScaleOptimizer`): bound to the npu_lossscale class instead.
        Whether it did."""
        if bound not in self.reexported or scope is not self.global_scope:
            return False
        alias = next(
            (
                a
                for a in getattr(node, "names", ())
                if (a.asname.name.value if a.asname else dotted(a.name)) == bound
            ),
            None,
        )
        target = _CONTRIB_TO_NPU.get(dotted(alias.name)) if alias is not None else None
        if target is None:
            return False
        self.file.edits.rebinds.setdefault(node, []).append((target, bound))
        self.file.change(
            node,
            registry.REEXPORT,
            f"other files import `{bound}` from this module: it stays bound here, to "
            f"{api.LIBRARY}'s {target}",
        )
        return True

    def _references(self, node: cst.CSTNode, bound: str) -> list[cst.CSTNode] | None:
        """Every use of the name an import binds (None: the scope is unknown)."""
        scope = self.file.scope(node)
        if scope is None:
            return None
        return [
            r.node
            for a in scope.assignments
            if a.node is node and (a.name == bound or bound.startswith(a.name + "."))
            for r in a.references
        ]
