"""The names the npu_lossscale classes are used under, and the import lines that bind them.

A class keeps its own name unless the file binds that name to something else that stays; then
it gets its fallback alias (`NpuLossScaleOptimizer`...), and the Keras class may be reached as
`npu_lossscale.keras.LossScaleOptimizer` through a module import. Where neither is free the port
gives up on the file. The lines themselves are placed by `shared/imports.py`; each is reported as
a change on the line a reviewer finds it at.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.metadata import Scope

from migrator import registry
from migrator.codemods.keras.version import KERAS_2_TARGET
from migrator.codemods.shared import api
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.imports import ImportPlan, imported_names, plan_imports
from migrator.codemods.shared.nodes import dotted
from migrator.codemods.tf1.file_imports import FileImports

# Local names used when the file already binds an npu_lossscale class name to something else.
_ALIASES = {
    api.FIXED: "NPUFixedLossScaleManager",
    api.DYNAMIC: "NPUExponentialUpdateLossScaleManager",
    api.OPTIMIZER: "NpuLossScaleOptimizer",
    api.KERAS_OPTIMIZER: "NPUKerasLossScaleOptimizer",
    KERAS_2_TARGET: "NPUKerasLossScaleOptimizer",
}


class NewImports:
    """`plan(module)` names the needed classes and places their imports, once the file's sites
    are decided; `names` and `imports` are what the rewriter needs."""

    def __init__(self, file: FileContext, imports: FileImports) -> None:
        self.file = file
        self.seen = imports
        self.names: dict[str, str] = {}
        self.imports = ImportPlan()

    def plan(self, module: cst.Module) -> None:
        names = self._local_names()
        if names is None:
            self.file.give_up(
                registry.NAME_CONFLICT,
                "the file binds both npu_lossscale class names and their fallback aliases; "
                "nothing was changed, port it by hand",
            )
            return
        self.names = names
        top_level = [
            i for i in self.seen.npu_imports if self.file.parent(self.file.parent(i)) is module
        ]
        self.imports = plan_imports(
            module,
            self.file.sites,
            names,
            top_level,
            self.file.parent,
            self.seen.npu_modules.values(),
        )
        self._report_imports(module)

    def _report_imports(self, module: cst.Module) -> None:
        """One change per import touched, on the line a reviewer finds it at."""
        placed = [
            *((anchor, lines, "after") for anchor, lines in self.imports.after.items()),
            *((anchor, lines, "before") for anchor, lines in self.imports.before.items()),
        ]
        for anchor, lines, where in placed:
            for line in lines:
                code = module.code_for_node(line).strip()
                message = f"adds `{code}` {where} the statement on this line"
                self.file.change(anchor, registry.NPU_IMPORT, message)
        for existing, pairs in self.imports.merge.items():
            added = imported_names(pairs)
            library = dotted(existing.module) if existing.module else api.LIBRARY
            self.file.change(
                existing, registry.NPU_IMPORT, f"adds {added} to this {library} import"
            )

    def _local_names(self) -> dict[str, str] | None:
        """The name each needed class is used under: its own, else its fallback alias; the Keras
        class through `npu_lossscale.keras` where the file imports the package as a module, or
        where both names are taken."""
        scopes = {
            id(s): s
            for s in [self.seen.global_scope, *(self.file.scope(x.node) for x in self.file.sites)]
            if s
        }
        names: dict[str, str] = {}
        for needed in sorted({t for s in self.file.sites for t in s.targets}):
            module = api.target_module(needed)
            dotted = self._module_reference(needed, scopes.values())
            if dotted is not None and self.seen.npu_modules:
                names[needed] = dotted
                continue
            free = [
                c
                for c in (api.target_class(needed), _ALIASES[needed])
                if c not in self.seen.star_bound
                and not any(self._binds_other(scope, c, module) for scope in scopes.values())
            ]
            if free:
                names[needed] = free[0]
            elif dotted is not None:
                names[needed] = dotted
            else:
                return None
        return names

    def _module_reference(self, target: str, scopes: Iterable[Scope]) -> str | None:
        """`<module>.Class` for a Keras target, through the file's own `import npu_lossscale.keras
        [as x]` when it has one, else through a new one if the name `npu_lossscale` is free."""
        if api.target_module(target) != api.KERAS_MODULE:
            return None
        bound = self.seen.npu_modules.get(api.KERAS_MODULE)
        if bound is None and any(self._binds_other(s, api.LIBRARY, "") for s in scopes):
            return None
        return f"{bound or api.KERAS_MODULE}.{api.target_class(target)}"

    def _binds_other(self, scope: Scope, name: str, module: str) -> bool:
        """Whether `name` is visible in `scope` bound to something that stays in the file and is
        not an import from `module` (an import the port removes does not count)."""
        if name not in scope:
            return False
        for assignment in scope[name]:
            node = getattr(assignment, "node", None)
            if (id(node), name) in self.seen.removed_bindings:
                continue
            if isinstance(node, cst.ImportFrom) and node.module is not None:
                if dotted(node.module) == module:
                    continue
            elif isinstance(node, cst.Import) and all(
                dotted(a.name).split(".")[0] == api.LIBRARY for a in node.names
            ):
                continue
            return True
        return False
