"""Find every loss-scale API use in a file and decide, site by site, how it is ported.

The analysis only reads the original tree (with scope metadata) and produces an `Edits` plan plus
findings; `rewrite.py` applies the plan. Deciding first and writing afterwards lets a decision
depend on the whole file: a `DynamicLossScale` object is only ported when every use of it is an
optimizer we port too, a contrib import is only removed when every reference to it was rewritten,
and `is_distributed=` depends on Horovod imports that may come later in the file.

`LossScaleAnalyzer` composes small visitors, one concern each, over one walk and one
`FileContext` (the metadata, resolved once per file, and the plan and findings they fill), as
libcst's codemods share a context:

- `file_imports.FileImports`: the file's imports, which the port removes or keeps for other files;
- `references.ApiReferences`: which names are loss-scale APIs, handed to the handler of their kind;
- `keras_facts.KerasFacts`: the file's Keras/TF generation and its mixed_float16 policies;
- `distribution.Distribution`: Horovod/strategy facts and the `is_distributed=` they decide;
- `loss_scale_objects.LossScaleObjects`: contrib managers, TF loss-scale objects, control deps;
- `optimizers.Optimizers`: the wrapped optimizers (their kind from `kinds.OptimizerKinds`);
- `keras.port.KerasPort`: Keras's loss-scale wrappers;
- `naming.NewImports`: the names the new classes get and the lines that import them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import libcst as cst

from migrator import registry
from migrator.codemods.keras.port import KerasPort, Tf1Facts
from migrator.codemods.shared import api
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import METADATA, FileContext
from migrator.codemods.shared.imports import ImportPlan
from migrator.codemods.shared.plan import Edits
from migrator.codemods.tf1.distribution import Distribution
from migrator.codemods.tf1.file_imports import FileImports
from migrator.codemods.tf1.keras_facts import KerasFacts
from migrator.codemods.tf1.kinds import OptimizerKinds
from migrator.codemods.tf1.loss_scale_objects import LossScaleObjects
from migrator.codemods.tf1.naming import NewImports
from migrator.codemods.tf1.optimizers import Optimizers
from migrator.codemods.tf1.references import ApiReferences
from migrator.selection.keras_helpers import KerasHelper


class LossScaleAnalyzer(cst.CSTVisitor):
    """Walks the original tree once, handing each node to the visitors that care; `leave_Module`
    decides (`finish`), then names the classes and places their imports."""

    METADATA_DEPENDENCIES = METADATA

    def __init__(
        self,
        path: str,
        distributed: str,
        reexports: frozenset[tuple[str, str]] = frozenset(),
        keras_helpers: frozenset[KerasHelper] = frozenset(),
        loss_scale_modules: frozenset[str] = frozenset(),
        strategy_importer: str | None = None,
        horovod_importer: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__()
        self.file = FileContext(path)
        self.distribution = Distribution(
            self.file, distributed, strategy_importer, horovod_importer
        )
        self.file_imports = FileImports(self.file, reexports, self.distribution.facts)
        self.keras_facts = KerasFacts(self.file, keras_helpers, loss_scale_modules)
        self.kinds = OptimizerKinds(self.file)
        self.objects = LossScaleObjects(self.file)
        self.keras = KerasPort(
            self.file,
            Tf1Facts(
                optimizer_flavour=self.kinds.flavour,
                loss_scale_object=self.objects.ctor_for,
                is_distributed=self.distribution.is_distributed,
                keras_pins=lambda: (
                    self.keras_facts.tf_keras,
                    tuple(self.keras_facts.legacy_settings),
                    tuple(self.keras_facts.helper_calls),
                ),
            ),
        )
        self.optimizers = Optimizers(
            self.file,
            kinds=self.kinds,
            keras_facts=self.keras_facts,
            objects=self.objects,
            distribution=self.distribution,
            keras=self.keras,
        )
        self.references = ApiReferences(self.file, self.keras_facts)
        self.references.handlers = {
            Kind.CONTRIB_FIXED: self.objects.contrib_manager,
            Kind.CONTRIB_DYNAMIC: self.objects.contrib_manager,
            Kind.CONTRIB_OPTIMIZER: self.optimizers.contrib_optimizer,
            Kind.TF_DYNAMIC: self.objects.tf_ctor,
            Kind.TF_FIXED: self.objects.tf_ctor,
            Kind.TF_OPTIMIZER: self.optimizers.tf_optimizer,
            Kind.GRAPH_REWRITE: self.optimizers.tf_optimizer,
            Kind.UNPORTED: self.references.unported,
            Kind.CONTRIB_MODULE: self.references.module_access,
            Kind.PORTED_DYNAMIC: self.objects.already_ported,
            Kind.KERAS_OPTIMIZER: self.keras.reference,
            Kind.KERAS_EXPERIMENTAL: self.keras.reference,
        }
        self.new_imports = NewImports(self.file, self.file_imports)

    @property
    def names(self) -> dict[str, str]:
        """The local name of each npu_lossscale class the rewritten code uses."""
        return self.new_imports.names

    @property
    def imports(self) -> ImportPlan:
        return self.new_imports.imports

    # ----------------------------------------------------------------- the walk
    def visit_Module(self, node: cst.Module) -> None:
        self.file.bind(self.metadata)
        self.file.module = node
        self.file_imports.visit_Module(node)
        self.references.visit_Module(node)

    def visit_Import(self, node: cst.Import) -> bool:
        self.file_imports.visit_Import(node)
        self.keras_facts.visit_Import(node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        self.file_imports.visit_ImportFrom(node)
        self.keras_facts.visit_ImportFrom(node)
        return False

    def visit_Name(self, node: cst.Name) -> bool:
        return self.references.visit_Name(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self.references.visit_Attribute(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self.file_imports.visit_Assign(node)
        self.distribution.visit_Assign(node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self.keras_facts.visit_SimpleString(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.keras_facts.visit_Call(node)
        self.references.visit_Call(node)
        self.distribution.visit_Call(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        # Metadata is only available during the visit, so every decision is taken here.
        self.finish()
        if self.file.edits:
            self.new_imports.plan(original_node)

    # ----------------------------------------------------------------- deciding
    def finish(self) -> None:
        """Resolve the cross-site decisions once the whole file has been seen."""
        self.keras_facts.finish()
        if not self.optimizers.check_contrib():
            return
        self.optimizers.decide_unseen_rewrites()
        self.keras.finish()
        self.optimizers.resolve()
        self.optimizers.emit_contrib()
        self.objects.control_deps()
        if self.file_imports.vendor_ported:
            self._leave_vendor_file()
            return
        self.file_imports.plan_removals()

    def _leave_vendor_file(self) -> None:
        """Files importing npu_bridge were ported already: report what is left, change nothing."""
        # (which Keras a port would assume concerns a port that does not happen here)
        changes = [
            f for f in self.file.findings if f.kind == "change" and f.rule != registry.KERAS_VERSION
        ]
        # Warnings about what a port would bring (the rewrite no longer switched on, the inner
        # optimizer's kind, Horovod's init) concern a port that does not happen here.
        self.file.findings = [
            f
            for f in self.file.findings
            if f.kind != "change"
            and f.rule not in (registry.OPTIMIZER_KIND_UNKNOWN, registry.DISTRIBUTED_UNVERIFIED)
            and not f.message.startswith(api.PORTED_REWRITE_NOTE)
        ]
        for f in changes:
            self.file.findings.append(
                dataclasses.replace(
                    f,
                    rule=registry.NPU_BRIDGE,
                    kind="warning",
                    message=f"not changed because the file already uses npu_bridge: {f.message}",
                )
            )
        self.file.edits = Edits()
        self.file.sites = []
