"""`--target npu-bridge`: the finished port, written against the Ascend adapter's own classes.

Teams on Ascend's TensorFlow stack may not add a runtime dependency to their training hosts; the
vendor's adapter ships `FixedLossScaleManager`, `ExponentialUpdateLossScaleManager` and
`NPULossScaleOptimizer` under the same names and (for what the adapter accepts) the same
signatures as npu_lossscale's. So the target is a last step over a file the ordinary port has
finished: everything that makes the port right (the global-step move, accumulation,
`is_distributed` from the script's own condition, the warnings) is decided once, for both targets,
and this step only changes the spelling:

- `from npu_lossscale import ...` becomes `from npu_bridge.npu_init import *`, as the vendor's
  migration guide writes it;
- a keyword argument the adapter's class does not take is dropped and reported as lost (the
  adapter has no overflow-mode argument, no stuck-run guard, no floor);
- a manager called like TensorFlow's LossScale objects (`manager()`, which the port keeps for
  scripts that called `loss_scale()`) reads `manager.get_loss_scale()`, the adapter's method;
- `is_distributed` other than False: the guide pairs it with `npu_distributed_optimizer_wrapper`,
  so the report says to add that wrapper unless the file all-reduces gradients already (Horovod's
  `DistributedOptimizer`, a tf.distribute strategy).

A Keras port targets the adapter's Keras class for TensorFlow 2.6.5 (Keras 2), which the vendor
documents as `npu_device`'s `npu.train.optimizer.NpuLossScaleOptimizer(inner_optimizer, dynamic,
initial_scale, dynamic_growth_steps)`, a subclass of Keras 2's LossScaleOptimizer: the import
(`npu_lossscale.keras`, or `npu_lossscale.keras.keras2` where the file pins Keras 2) becomes
`import npu_device as npu` and each use of the class that one, with only those four arguments (the
others are dropped and reported as lost). The adapter has no Keras 3 class, so a file that runs
Keras 3 -- Keras 3's positional order (`initial_scale` second, where the adapter's class takes
`dynamic`), or a Keras 3-only API (`keras.ops`, `keras.config`, `scale_loss`) -- is left as it
was, with the reason.

A file whose port needs more than that (the PyTorch front-end, the logging hook, `from_manager`)
is left as it was, with a warning saying why: half of it on the adapter and half on npu_lossscale
would defeat the point of the target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from migrator import registry
from migrator.codemods.shared.codegen import bytes_of
from migrator.codemods.shared.visiting import visit
from migrator.findings import Finding

TARGETS = ("npulossscale", "npu-bridge")
CHANGE = registry.TARGET_NPU_BRIDGE
LOST = registry.TARGET_NPU_BRIDGE_LOST
UNSUPPORTED = registry.TARGET_NPU_BRIDGE_UNSUPPORTED
WRAPPER = registry.TARGET_NPU_BRIDGE_DISTRIBUTED
KERAS_2_ONLY = registry.TARGET_NPU_BRIDGE_KERAS_2

# The adapter's classes and the parameters they accept, in order.
ADAPTER_PARAMETERS: dict[str, tuple[str, ...]] = {
    "FixedLossScaleManager": ("loss_scale", "enable_overflow_check"),
    "ExponentialUpdateLossScaleManager": (
        "init_loss_scale",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_ratio",
        "decr_ratio",
    ),
    "NPULossScaleOptimizer": ("opt", "loss_scale_manager", "is_distributed"),
}
_MANAGERS = ("FixedLossScaleManager", "ExponentialUpdateLossScaleManager")
# The adapter's Keras class (TF 2.6.5, `import npu_device as npu`) and what it takes.
KERAS_CLASS = "npu.train.optimizer.NpuLossScaleOptimizer"
KERAS_PARAMETERS = ("inner_optimizer", "dynamic", "initial_scale", "dynamic_growth_steps")
_IMPORT = "from npu_bridge.npu_init import *\n"
# Our Keras modules: the class chosen at import time, and Keras 2's by name.
_KERAS_MODULES = ("npu_lossscale.keras", "npu_lossscale.keras.keras2")
# What only Keras 3 has: the adapter's Keras class (Keras 2) cannot serve such a script.
_KERAS_3_ONLY = ("keras.ops.", "keras.config.", "keras.src.")
# What in a file shows that it all-reduces gradients itself, so the adapter's distributed
# wrapper must not be added a second time.
_OWN_ALLREDUCE = ("DistributedOptimizer", "npu_distributed_optimizer_wrapper", "strategy")


@dataclasses.dataclass
class Retargeted:
    """The port spelled for the adapter (`source`), or None where the file must stay as it was;
    findings on the lines of the ported text the step was given."""

    source: bytes | None
    findings: list[Finding]


def retarget(path: str, ported: bytes) -> Retargeted | None:
    """None where the ported file uses nothing of npu_lossscale (nothing to respell)."""
    wrapper = MetadataWrapper(cst.parse_module(ported))
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module

    def line(node: cst.CSTNode) -> int:
        return positions[node].start.line

    survey = _Survey()
    visit(module, survey)
    if survey.keras and survey.keras_3:
        survey.unsupported.append(survey.keras_3[0])
    if not survey.imports and not survey.unsupported:
        return None
    if survey.unsupported:
        node, what = survey.unsupported[0]
        return Retargeted(
            None,
            [
                Finding(
                    path,
                    line(node),
                    UNSUPPORTED,
                    f"not ported: --target npu-bridge has no counterpart for {what} (the adapter "
                    "ships the TF1 NPULossScaleOptimizer and loss-scale managers, and for TF "
                    "2.6.5's Keras 2 npu.train.optimizer.NpuLossScaleOptimizer); port this file "
                    "with the default target, or by hand",
                    kind="warning",
                )
            ],
        )
    alias = "npu" if "npu" not in survey.bound else "npu_device"
    rewriter = _Rewriter(survey.managers, survey.keras, alias)
    retargeted = module.visit(rewriter)
    findings = _findings(path, module, rewriter, line)
    if survey.keras_unpinned is not None:
        # The default port's class follows the Keras the process runs; the adapter's is Keras 2's
        # only, so where the port could not tell the file's Keras, say what the target assumes.
        findings.append(
            Finding(
                path,
                line(survey.keras_unpinned),
                KERAS_2_ONLY,
                "the adapter's npu.train.optimizer.NpuLossScaleOptimizer is TF 2.6.5's, a "
                "Keras 2 class: it raises at start-up on a Keras 3 optimizer, and nothing in this "
                "file pins Keras 2; run it on TF 2.6.5 (or with TF_USE_LEGACY_KERAS=1 and "
                "tf_keras), or port it with the default target",
                kind="warning",
            )
        )
    return Retargeted(bytes_of(retargeted), findings)


class _Survey(cst.CSTVisitor):
    """What the finished port imports from npu_lossscale, and which names hold managers."""

    def __init__(self) -> None:
        self.imports: list[cst.ImportFrom] = []
        self.unsupported: list[tuple[cst.CSTNode, str]] = []
        self.managers: set[str] = set()
        self.keras: set[str] = set()  # names bound to npu_lossscale.keras.LossScaleOptimizer
        # the import of the class chosen at import time, where the file does not pin Keras 2
        self.keras_unpinned: cst.ImportFrom | None = None
        self.bound: set[str] = set()  # every name the module binds at its top level
        self.keras_3: list[tuple[cst.CSTNode, str]] = []  # what shows the file runs Keras 3

    def visit_Name(self, node: cst.Name) -> None:
        self.bound.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if (
            isinstance(node.value, cst.Name)
            and node.value.value in self.keras
            and node.attr.value != "__name__"
        ):
            self.unsupported.append((node, f"`{node.value.value}.{node.attr.value}` (ours only)"))
        dotted = _dotted(node)
        if node.attr.value == "scale_loss" or (dotted + ".").startswith(_KERAS_3_ONLY):
            what = f"Keras 3 (the file uses `{dotted}`, which only Keras 3 has)"
            self.keras_3.append((node, what))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if isinstance(func, cst.Name) and func.value in self.keras and len(positional) > 1:
            self.keras_3.append(
                (
                    node,
                    "Keras 3's positional order in this LossScaleOptimizer call (`initial_scale` "
                    "second, where the adapter's Keras 2 class takes `dynamic`)",
                )
            )

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        for statement in node.body:
            if isinstance(statement, cst.ImportFrom) and statement.module is not None:
                name = _dotted(statement.module)
                if name == "npu_lossscale":
                    names = statement.names
                    if isinstance(names, cst.ImportStar):
                        self.unsupported.append((node, "`from npu_lossscale import *`"))
                        continue
                    self.imports.append(statement)
                    for alias in names:
                        imported = _dotted(alias.name)
                        if imported not in ADAPTER_PARAMETERS or alias.asname is not None:
                            self.unsupported.append((node, f"npu_lossscale's `{imported}`"))
                elif name in _KERAS_MODULES and not isinstance(statement.names, cst.ImportStar):
                    self.imports.append(statement)
                    for alias in statement.names:
                        imported = _dotted(alias.name)
                        if imported != "LossScaleOptimizer":
                            self.unsupported.append((node, f"npu_lossscale.keras's `{imported}`"))
                        else:
                            self.keras.add(_dotted(alias.asname.name) if alias.asname else imported)
                            if name == "npu_lossscale.keras" and self.keras_unpinned is None:
                                self.keras_unpinned = statement
                elif name.startswith("npu_lossscale."):
                    self.unsupported.append(
                        (node, f"`{name}` (npu_lossscale's {_front_end(name)})")
                    )
            elif isinstance(statement, cst.Import):
                for alias in statement.names:
                    if _dotted(alias.name).split(".")[0] == "npu_lossscale":
                        self.unsupported.append((node, f"`import {_dotted(alias.name)}`"))
            elif isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Call):
                func = statement.value.func
                if isinstance(func, cst.Name) and func.value in _MANAGERS:
                    for target in statement.targets:
                        if isinstance(target.target, cst.Name):
                            self.managers.add(target.target.value)


def _front_end(module: str) -> str:
    part = module.split(".")[1]
    return {"keras": "Keras front-end", "torch": "PyTorch front-end"}.get(part, "library")


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


class _Rewriter(cst.CSTTransformer):
    def __init__(self, managers: set[str], keras: set[str], alias: str) -> None:
        super().__init__()
        self.managers = managers
        self.keras = keras
        self.keras_class = cst.parse_expression(KERAS_CLASS.replace("npu.", f"{alias}.", 1))
        self.keras_import = (
            f"import npu_device as {alias}\n" if alias != "npu_device" else ("import npu_device\n")
        )
        self.import_done = False
        self.dropped: list[tuple[cst.Call, str, str]] = []  # original call, class, argument
        self.called_managers: list[cst.Call] = []
        self.distributed: list[cst.Call] = []
        self.imports: list[cst.SimpleStatementLine] = []
        self.attributes: set[int] = set()

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
        ours = [
            _dotted(s.module)
            for s in original_node.body
            if isinstance(s, cst.ImportFrom)
            and s.module is not None
            and _dotted(s.module) in ("npu_lossscale", *_KERAS_MODULES)
        ]
        if not ours:
            return updated_node
        self.imports.append(original_node)
        if ours[0] in _KERAS_MODULES:
            statement = cst.parse_statement(self.keras_import)
            return statement.with_changes(leading_lines=updated_node.leading_lines)
        if self.import_done:
            return cst.RemoveFromParent()
        self.import_done = True
        statement = cst.parse_statement(_IMPORT)
        assert isinstance(statement, cst.SimpleStatementLine)
        return statement.with_changes(leading_lines=updated_node.leading_lines)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if isinstance(func, cst.Name) and func.value in self.managers and not original_node.args:
            self.called_managers.append(original_node)
            return cst.Call(
                func=cst.Attribute(value=updated_node.func, attr=cst.Name("get_loss_scale"))
            )
        if isinstance(func, cst.Name) and func.value in self.keras:
            return self._keep_accepted(
                original_node, updated_node, "NpuLossScaleOptimizer", KERAS_PARAMETERS
            ).with_changes(func=self.keras_class)
        if not isinstance(func, cst.Name) or func.value not in ADAPTER_PARAMETERS:
            return updated_node
        return self._keep_accepted(
            original_node, updated_node, func.value, ADAPTER_PARAMETERS[func.value]
        )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.attributes.add(id(node.attr))  # `x.LossScaleOptimizer` is not our class

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        # Other uses of the Keras class (isinstance checks, annotations) name the adapter's.
        if original_node.value in self.keras and id(original_node) not in self.attributes:
            return self.keras_class
        return updated_node

    def _keep_accepted(
        self, original_node: cst.Call, updated_node: cst.Call, cls: str, accepted: tuple[str, ...]
    ) -> cst.Call:
        args = []
        for arg in updated_node.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword is not None and keyword not in accepted:
                self.dropped.append((original_node, cls, keyword))
                continue
            if keyword == "is_distributed" and not (
                isinstance(arg.value, cst.Name) and arg.value.value == "False"
            ):
                self.distributed.append(original_node)
            args.append(arg)
        if len(args) == len(updated_node.args):
            return updated_node
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=args)


def _findings(
    path: str, module: cst.Module, rewriter: _Rewriter, line: Callable[[cst.CSTNode], int]
) -> list[Finding]:
    out = [
        Finding(
            path,
            line(rewriter.imports[0]),
            CHANGE,
            "imports the Ascend adapter's classes (`from npu_bridge.npu_init import *`; for Keras "
            "`import npu_device as npu`, its TF 2.6.5 NpuLossScaleOptimizer), as the vendor's "
            "documentation writes it, instead of npu_lossscale's",
        )
    ]
    for call, cls, keyword in rewriter.dropped:
        out.append(
            Finding(
                path,
                line(call),
                LOST,
                f"{cls}: dropped `{keyword}=`, which the adapter's class does not take; what it "
                "set is lost on the npu-bridge target (the adapter's own default applies)",
                kind="warning",
            )
        )
    for call in rewriter.called_managers:
        out.append(
            Finding(
                path,
                line(call),
                CHANGE,
                "the adapter's managers are not callable: reads the scale with get_loss_scale()",
            )
        )
    own = any(marker in module.code for marker in _OWN_ALLREDUCE)
    for call in rewriter.distributed if not own else []:
        out.append(
            Finding(
                path,
                line(call),
                WRAPPER,
                "with more than one device the vendor's guide also wraps the inner optimizer in "
                "npu_distributed_optimizer_wrapper(opt) (it all-reduces the gradients) before "
                "NPULossScaleOptimizer; nothing in this file all-reduces them: add it",
                kind="warning",
            )
        )
    return out
