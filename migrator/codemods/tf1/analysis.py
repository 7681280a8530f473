"""Find every loss-scale API use in a file and decide, site by site, how it is ported.

The analysis only reads the original tree (with scope metadata) and produces an `Edits` plan plus
findings; `rewriter.py` applies the plan. Deciding first and writing afterwards lets a decision
depend on the whole file: a `DynamicLossScale` object is only ported when every use of it is an
optimizer we port too, a contrib import is only removed when every reference to it was rewritten,
and `is_distributed=` depends on Horovod imports that may come later in the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import libcst as cst
from libcst.metadata import Assignment, Scope

from migrator.codemods.keras.port import KerasPort, Tf1Facts
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import METADATA, FileContext
from migrator.codemods.shared.distributed import (
    DistributedFacts,
    horovod_parameter,
    is_distributed_value,
    size_test_direction,
)
from migrator.codemods.shared.imports import ImportPlan, imported_names, plan_imports
from migrator.codemods.shared.nodes import code, dotted, is_dotted_name, walk
from migrator.codemods.shared.plan import Builder, CallEdit, Edits, Site
from migrator.codemods.tf1.control_deps import control_deps_decision
from migrator.codemods.tf1.sites import LossScaleObject, WrappedOptimizer
from migrator.findings import Finding
from migrator.selection.reexports import module_name

_TF_CTOR_PARAMS = {
    Kind.TF_DYNAMIC: ("initial_loss_scale", "increment_period", "multiplier"),
    Kind.TF_FIXED: ("loss_scale_value",),
}
_TF_OPT_PARAMS = ("opt", "loss_scale")
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
# Local names used when the file already binds an npu_lossscale class name to something else.
_ALIASES = {
    api.FIXED: "NPUFixedLossScaleManager",
    api.DYNAMIC: "NPUExponentialUpdateLossScaleManager",
    api.OPTIMIZER: "NpuLossScaleOptimizer",
    api.KERAS_OPTIMIZER: "NPUKerasLossScaleOptimizer",
}


class LossScaleAnalyzer(cst.CSTVisitor):
    """Walks the original tree once; `finish()` turns what it saw into edits and findings."""

    METADATA_DEPENDENCIES = METADATA

    def __init__(
        self, path: str, distributed: str, reexports: frozenset[tuple[str, str]] = frozenset()
    ) -> None:
        super().__init__()
        self.file = FileContext(path)
        # names other files of the run import from this module (migrator.selection.reexports)
        self._reexported = {name for module, name in reexports if module == module_name(path)}
        self.distributed = distributed
        self.facts = DistributedFacts()
        self.vendor_ported = False
        self.npu_imports: list[cst.ImportFrom] = []
        # dotted names top-level `import npu_lossscale[.keras] [as x]` statements bind
        self._npu_modules: dict[str, str] = {}
        self._contrib_imports: list[tuple[cst.CSTNode, int, str]] = []
        self._keras_imports: list[tuple[cst.CSTNode, int, str]] = []
        self._dunder_all: set[str] = set()
        self.keras = KerasPort(
            self.file,
            Tf1Facts(
                optimizer_flavour=self.optimizer_flavour,
                loss_scale_object=self.ctor_for,
                is_distributed=self.is_distributed,
                legacy_keras=lambda: self.legacy_keras,
            ),
        )
        self._ctors: dict[cst.Call, LossScaleObject] = {}
        self._optimizers: list[WrappedOptimizer] = []
        self._contrib_optimizers: list[tuple[cst.Call, int]] = []
        self._dynamic_calls: list[cst.Call] = []
        self._ported_dynamic: list[cst.Call] = []
        self._skip: set[int] = set()
        self._removed_bindings: set[tuple[int, str]] = set()
        # class names a contrib `import *` binds, which the port's own import must not shadow
        self._star_bound: set[str] = set()
        self._global: Scope | None = None
        # what the file shows of its TensorFlow generation, for inner optimizers whose kind
        # cannot be seen: Keras names or model.compile/fit calls; TF 1-only symbols
        self._uses_keras = False
        self._uses_v1 = False
        # the file names TF_USE_LEGACY_KERAS: its tf.keras may be Keras 2 (tf_keras)
        self.legacy_keras = False
        # global mixed_float16 policies set here, and whether any LossScaleOptimizer is named
        # (setter, surely fp16, the Policy's own loss_scale argument)
        self._fp16_policies: list[tuple[cst.Call, bool, cst.BaseExpression | None]] = []
        self._unseen_rewrites: list[tuple[cst.CSTNode, cst.Call, dict[str, int]]] = []
        self._names_lso = False
        # names any import binds (None: a star import binds unknown ones); only a reference
        # rooted at one of them can be an API the port handles
        self._imported_roots: set[str] | None = None
        self.names: dict[str, str] = {}
        self.imports = ImportPlan()

    # ----------------------------------------------------------------- module
    def visit_Module(self, node: cst.Module) -> None:
        self.file.bind(self.metadata)
        self._global = self.file.scope(node)
        self._imported_roots = _imported_roots(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        # Metadata is only available during the visit, so every decision is taken here.
        self.finish()
        if not self.file.edits:
            return
        names = self._local_names()
        if names is None:
            self.file.give_up(
                "name-conflict",
                "the file binds both npu_lossscale class names and their fallback aliases; "
                "nothing was changed, port it by hand",
            )
            return
        self.names = names
        top_level = [
            i for i in self.npu_imports if self.file.parent(self.file.parent(i)) is original_node
        ]
        self.imports = plan_imports(
            original_node,
            self.file.sites,
            names,
            top_level,
            self.file.parent,
            self._npu_modules.values(),
        )
        self._report_imports(original_node)

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
                self.file.change(anchor, "npu-import", message)
        for existing, pairs in self.imports.merge.items():
            added = imported_names(pairs)
            library = dotted(existing.module) if existing.module else api.LIBRARY
            self.file.change(existing, "npu-import", f"adds {added} to this {library} import")

    def _local_names(self) -> dict[str, str] | None:
        """The name each needed class is used under: its own, else its fallback alias; the Keras
        class through `npu_lossscale.keras` where the file imports the package as a module, or
        where both names are taken."""
        scopes = {
            id(s): s
            for s in [self._global, *(self.file.scope(x.node) for x in self.file.sites)]
            if s
        }
        names: dict[str, str] = {}
        for needed in sorted({t for s in self.file.sites for t in s.targets}):
            module = api.target_module(needed)
            dotted = self._module_reference(needed, scopes.values())
            if dotted is not None and self._npu_modules:
                names[needed] = dotted
                continue
            free = [
                c
                for c in (api.target_class(needed), _ALIASES[needed])
                if c not in self._star_bound
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
        bound = self._npu_modules.get(api.KERAS_MODULE)
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
            if (id(node), name) in self._removed_bindings:
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

    # ----------------------------------------------------------------- imports
    def visit_Import(self, node: cst.Import) -> bool:
        top_level = isinstance(self.file.parent(self.file.parent(node)), cst.Module)
        for index, alias in enumerate(node.names):
            name = api.canonical(dotted(alias.name))
            bound = alias.asname.name.value if alias.asname else dotted(alias.name)
            if top_level and name in (api.LIBRARY, api.KERAS_MODULE):
                self._npu_modules[name] = bound
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
                    self._star_bound.update((api.FIXED, api.DYNAMIC))
                self.file.warn(
                    node,
                    "star-import",
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
            self._contrib_imports.append((node, index, bound))
        elif name == "tensorflow" and "." not in bound:
            self.facts.tensorflow_aliases[bound] = node
        elif api.is_keras_mixed_precision(name):
            self._keras_imports.append((node, index, bound))

    # ----------------------------------------------------------------- references
    def visit_Name(self, node: cst.Name) -> bool:
        self._reference(node)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self._reference(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and node.targets[0].target.value == "__all__"
            and isinstance(node.value, (cst.List, cst.Tuple))
        ):
            values = (args_.string_value(e.value) for e in node.value.elements)
            self._dunder_all.update(v for v in values if v is not None)
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            direction = size_test_direction(node.value, self.file.canonical)
            if direction:
                target = node.targets[0].target
                self.facts.size_tests[target.value] = (target, direction > 0)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if "TF_USE_LEGACY_KERAS" in node.value:
            self.legacy_keras = True

    def visit_Call(self, node: cst.Call) -> None:
        func = self.file.canonical(node.func)
        if func is None and _is_keras_training_call(node):
            self._uses_keras = True
        if func is not None and api.is_policy_setter(func):
            fp16, loss_scale = self._fp16_policy(node)
            if fp16 is not None:
                self._fp16_policies.append((node, fp16, loss_scale))
        if func == "builtins.getattr" or (
            func is None and isinstance(node.func, cst.Name) and node.func.value == "getattr"
        ):
            self._getattr(node)
        elif (func is not None and api.is_distribute_strategy(func)) or _hands_a_strategy(node):
            self.facts.strategy_used = True
        elif (
            func is not None
            and api.is_horovod_module(func)
            and func.endswith(".init")
            and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name)
        ):
            self.facts.initialised.add(node.func.value.value)
            self.facts.init_calls.append(node)
        elif (
            func is not None
            and api.is_horovod_module(func)
            and func.endswith(".DistributedOptimizer")
        ):
            self.facts.wrappers.append(node)

    def _fp16_policy(self, setter: cst.Call) -> tuple[bool | None, cst.BaseExpression | None]:
        """Whether a policy setter sets mixed_float16: True (`"mixed_float16"`, also through
        `Policy(...)` or a name assigned once), None (another literal policy), False (chosen
        at run time: a parameter, a flag, a conditional); and TF 2.1-2.3's `Policy(...,
        loss_scale=...)` argument where one is given."""
        if not setter.args:
            return None, None
        value = setter.args[0].value
        loss_scale = None
        for _ in range(2):  # `p = Policy(name)` then `set_policy(p)`: a name, then a Policy
            if isinstance(value, cst.Name):
                assigned = [self.file.assigned_value(a) for a in self.file.assignments(value)]
                if len(assigned) != 1 or assigned[0] is None:
                    return False, None
                value = assigned[0]
            if isinstance(value, cst.Call):
                name = self.file.canonical(value.func)
                if name is None or not api.is_policy_class(name) or not value.args:
                    return False, None
                bound = args_.bind(value, ("name", "loss_scale"))
                if isinstance(bound, dict) and "loss_scale" in bound:
                    loss_scale = value.args[bound["loss_scale"]].value
                value = value.args[0].value
        text = args_.string_value(value)
        if text is None:
            return False, loss_scale
        return (True if text == "mixed_float16" else None), loss_scale

    def _implicit_loss_scale(self) -> None:
        """A global mixed_float16 policy makes Keras wrap the optimizer of model.compile() in its
        own LossScaleOptimizer, whose inf/NaN check cannot see an NPU's saturated overflows;
        nothing in such a file names a loss-scale API to port, so it would pass unremarked."""
        if self._names_lso:
            return
        for call, surely, loss_scale in self._fp16_policies:
            policy = (
                "the mixed_float16 policy makes"
                if surely
                else ("this policy is chosen at run time; if it is mixed_float16, it makes")
            )
            keep = ""
            if loss_scale is not None:
                keep = (
                    f" (its `loss_scale={code(loss_scale)}` maps onto that class's keywords as "
                    "for the experimental LossScaleOptimizer: a number N is "
                    "`initial_scale=N, dynamic=False`)"
                )
            self.file.warn(
                call,
                "keras-implicit-loss-scale",
                f"{policy} Keras wrap the optimizer of model.compile() in "
                "its own LossScaleOptimizer, whose inf/NaN check misses an NPU's saturated "
                "overflows (saturation mode); unless it is wrapped elsewhere, wrap it yourself: "
                "`model.compile(optimizer=npu_lossscale.keras.LossScaleOptimizer(opt), ...)` "
                f"with an optimizer object (not a string), which Keras then leaves as it is{keep}",
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
                "unresolved-access",
                "getattr() on tf.contrib: the attribute is chosen at run time, so the tool "
                "cannot tell which loss-scale class is used; port it by hand",
            )

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
                    "unresolved-access",
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
                "unresolved-access",
                f"`{code(node)}` is bound to more than one thing in this scope "
                "(e.g. a try/except import); port it by hand",
            )
            return False
        name = self.file.canonical(node)
        if name is not None and api.mentions_keras(name):
            self._uses_keras = True
        if name is not None and api.is_tf1_signal(name):
            self._uses_v1 = True
        if name is not None and name.endswith("LossScaleOptimizer"):
            self._names_lso = True
        kind = api.classify(name) if name is not None else None
        if kind is None:
            return True
        parent = self.file.parent(node)
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        handler = {
            Kind.CONTRIB_FIXED: self._contrib_manager,
            Kind.CONTRIB_DYNAMIC: self._contrib_manager,
            Kind.CONTRIB_OPTIMIZER: self._contrib_optimizer,
            Kind.TF_DYNAMIC: self._tf_ctor,
            Kind.TF_FIXED: self._tf_ctor,
            Kind.TF_OPTIMIZER: self._tf_optimizer,
            Kind.GRAPH_REWRITE: self._tf_optimizer,
            Kind.UNPORTED: self._unported,
            Kind.CONTRIB_MODULE: self._module_access,
            Kind.PORTED_DYNAMIC: self._already_ported,
            Kind.KERAS_OPTIMIZER: self.keras.reference,
            Kind.KERAS_EXPERIMENTAL: self.keras.reference,
        }[kind]
        handler(node, call, kind, name or "")
        return False

    def _may_be_imported(self, node: cst.Name | cst.Attribute) -> bool:
        if self._imported_roots is None:
            return True
        root: cst.BaseExpression = node
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and root.value in self._imported_roots

    # ----------------------------------------------------------------- rule handlers
    def _contrib_manager(
        self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, _: str
    ) -> None:
        target = api.FIXED if kind is Kind.CONTRIB_FIXED else api.DYNAMIC
        if call is None and self._incompatible_subclass(node):
            return
        if call is None:
            self.file.edits.refs[node] = target
            self.file.site(node, node, target)
            self.file.change(node, "contrib-manager", f"`{code(node)}` -> {target}")
            return
        self.file.edits.calls[call] = CallEdit(target)
        self.file.site(call, node, target)
        self.file.change(
            call, "contrib-manager", f"`{code(node)}(...)` -> {target}(...), arguments unchanged"
        )
        if kind is Kind.CONTRIB_DYNAMIC:
            self._dynamic_calls.append(call)

    def _contrib_optimizer(self, node: cst.CSTNode, call: cst.Call | None, *_: object) -> None:
        if call is None and self._incompatible_subclass(node):
            return
        if call is None:
            self.file.edits.refs[node] = api.OPTIMIZER
            self.file.site(node, node, api.OPTIMIZER)
            self.file.change(node, "contrib-optimizer", f"`{code(node)}` -> {api.OPTIMIZER}")
            return
        self.file.site(call, node, api.OPTIMIZER)
        self._contrib_optimizers.append((call, self.file.line(call)))

    def _incompatible_subclass(self, base: cst.CSTNode) -> bool:
        """Whether ``base`` is the base of a class that cannot simply be rebased on npu_lossscale.

        The NPU classes keep their state and their step logic elsewhere than tf.contrib's: a
        subclass that overrides the step (apply_gradients, compute_gradients, update_loss_scale,
        get_loss_scale), skips the base __init__, or reads the base's private attributes
        (`self._opt`, `self._loss_scale`...) would fail at graph build, or bypass the overflow
        check, once rebased. Such a class is left as it is, with a warning naming the reason.
        """
        arg = self.file.parent(base)
        cls = self.file.parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(cls, cst.ClassDef) or arg not in cls.bases:
            return False
        reason = _subclass_problem(cls)
        if reason is None:
            return False
        self.file.warn(
            cls,
            "subclass-override",
            f"class {cls.name.value} subclasses `{code(base)}` and {reason}; the npu_lossscale "
            "class works differently inside, so the subclass was left unchanged: port it by hand",
        )
        return True

    def _tf_ctor(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, name: str) -> None:
        if call is None:
            self.file.warn(
                node,
                "unported-api",
                f"`{code(node)}` is used as a value, not constructed; the NPU managers are a "
                "different type, port this use by hand",
            )
            return
        bound = args_.bind(call, _TF_CTOR_PARAMS[kind])
        problem = bound if isinstance(bound, str) else None
        build: Builder | None = None
        if not isinstance(bound, str):
            if kind is Kind.TF_DYNAMIC:
                multiplier = bound.get("multiplier")
                if multiplier is not None and args_.has_call(call.args[multiplier].value):
                    problem = (
                        "its multiplier is a call; the port needs it twice (incr_ratio and "
                        "decr_ratio=1/multiplier) and will not evaluate it twice"
                    )
                build = _tf_dynamic_builder(bound)
            else:
                build = _tf_fixed_builder(bound)
        fields = {} if isinstance(bound, str) else bound
        self._ctors[call] = LossScaleObject(
            call, kind, self.file.line(call), problem, build, fields
        )

    def _tf_optimizer(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, _: str) -> None:
        if call is None:
            self.file.warn(
                node, "unported-api", f"`{code(node)}` is used as a value; port it by hand"
            )
            return
        bound = args_.bind(call, _TF_OPT_PARAMS)
        problem = bound if isinstance(bound, str) else None
        if not isinstance(bound, str) and "opt" not in bound:
            problem = "the optimizer argument is missing"
        unused = kind is Kind.GRAPH_REWRITE and self._result_unused(call)
        keras, unknown = None, None
        if problem is None:
            assert not isinstance(bound, str)
            inner = call.args[bound["opt"]].value
            flavour = self.optimizer_flavour(inner)
            if flavour in ("keras", "keras2") and kind is Kind.GRAPH_REWRITE and not unused:
                # TF 2 wraps a Keras optimizer in Keras's LossScaleOptimizer: the Keras port's.
                self.keras.graph_rewrite(call, bound)
                return
            if flavour is None and kind is Kind.GRAPH_REWRITE and not unused:
                # Keras's or the TF1 port's: decided once the file's TF generation is known.
                self._unseen_rewrites.append((node, call, bound))
                return
            keras = self._keras_problem(inner, flavour)
            unknown = inner if flavour is None else None
        problem = problem or keras
        if unused:
            problem = (
                "its result is unused, so it only switches on TF's fp16 graph rewrite and no loss "
                "scaling happens here; on the NPU the compute precision comes from the session's "
                "precision_mode, review by hand"
            )
        self._add_optimizer(node, call, kind, problem, bound, keras=keras, unknown=unknown)

    def _result_unused(self, call: cst.Call) -> bool:
        """A bare call, or one assigned to a name nothing reads (BERT's eval-branch
        `dummy_op = enable_mixed_precision_graph_rewrite(...)`, kept only for its effect)."""
        parent = self.file.parent(call)
        if isinstance(parent, cst.Expr):
            return True
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1):
            return False
        target = parent.targets[0].target
        if not isinstance(target, cst.Name):
            return False
        mine = [a for a in self.file.assignments(target) if a.node is target]
        return len(mine) == 1 and not mine[0].references

    def _add_optimizer(
        self,
        node: cst.CSTNode,
        call: cst.Call,
        kind: Kind,
        problem: str | None,
        bound: dict[str, int] | str,
        *,
        keras: str | None = None,
        unknown: cst.BaseExpression | None = None,
    ) -> None:
        self._optimizers.append(
            WrappedOptimizer(
                call,
                kind,
                self.file.line(call),
                problem,
                bound if problem is None and not isinstance(bound, str) else {},
                keras=keras is not None and problem == keras,
                unknown=unknown,
            )
        )
        self.file.consume(node)
        self.file.sites.append(Site(call, (), self.file.provider(node)))

    def _decide_unseen_rewrites(self) -> None:
        """TF 2's enable_mixed_precision_graph_rewrite takes only Keras optimizers, TF 1's both
        kinds: where the file names no TF 1-only symbol, an optimizer of unseen kind goes to the
        Keras port (which says what it assumed), else to the TF1 one."""
        for node, call, bound in self._unseen_rewrites:
            if self._uses_v1:
                inner = call.args[bound["opt"]].value
                self._add_optimizer(node, call, Kind.GRAPH_REWRITE, None, bound, unknown=inner)
            else:
                self.keras.graph_rewrite(call, bound)

    def optimizer_flavour(self, inner: cst.BaseExpression) -> str | None:
        flavour = self._flavour(inner, set())
        return None if flavour == "cycle" else flavour

    def _keras_problem(self, inner: cst.BaseExpression, flavour: str | None) -> str | None:
        """Why the inner optimizer cannot go into the tf.compat.v1 NPULossScaleOptimizer: a Keras
        optimizer there raises ValueError at start-up. Decided by the constructor's qualified
        name; one whose constructor cannot be seen goes to `_unknown_kind` once the whole file
        has been read."""
        if flavour in ("keras", "keras2"):
            return (
                f"`{code(inner)}` is a Keras optimizer, which the tf.compat.v1 "
                f"{api.OPTIMIZER} rejects (ValueError at start-up); port it by hand to "
                "npu_lossscale.keras.LossScaleOptimizer"
            )
        return None

    def _unknown_kind(self, inner: cst.BaseExpression, kind: Kind) -> None:
        """Warn where an optimizer of unseen kind was wrapped in the tf.compat.v1 class and the
        file may hand it a Keras one: it uses Keras (names, model.compile/fit), or it calls the
        graph rewrite without any TF 1-only symbol, where TF 2's function takes only Keras
        optimizers. A TF 1 script's optimizers are v1 ones, so silence there is no guess."""
        graph_rewrite = kind is Kind.GRAPH_REWRITE and not self._uses_v1
        if not (self._uses_keras or graph_rewrite):
            return
        message = (
            f"cannot tell whether `{code(inner)}` is a tf.compat.v1 or a Keras optimizer; "
            f"it was wrapped in the tf.compat.v1 {api.OPTIMIZER}, which raises ValueError at "
            "start-up if it is a Keras one"
        )
        if kind is Kind.GRAPH_REWRITE:
            message += (
                " (TF 2's enable_mixed_precision_graph_rewrite takes only Keras optimizers: for "
                "one, use npu_lossscale.keras.LossScaleOptimizer instead)"
            )
        self.file.warn(inner, "optimizer-kind-unknown", message)

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
                if (flavour is None or keras_wrapper) and api.wraps_optimizer(name) and expr.args:
                    return self._flavour(expr.args[0].value, seen)
                return flavour
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
        stack: list[cst.CSTNode] = [cls.body]
        while stack:
            node = stack.pop()
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
            elif not isinstance(node, (cst.ClassDef, cst.BaseExpression)):
                stack.extend(node.children)
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

    def _unported(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, name: str) -> None:
        self.file.warn(
            node,
            "unported-api",
            f"`{code(node)}` ({name}) has no npu_lossscale counterpart the tool can substitute; "
            "port it by hand",
        )

    def _module_access(self, node: cst.CSTNode, *_: object) -> None:
        self.file.warn(
            node,
            "unresolved-access",
            f"`{code(node)}` is used as a module object (passed, returned or stored); the tool "
            "cannot follow it to the class used, port it by hand",
        )

    def _already_ported(self, node: cst.CSTNode, call: cst.Call | None, *_: object) -> None:
        if call is not None:
            self._ported_dynamic.append(call)

    # ----------------------------------------------------------------- decisions
    def finish(self) -> None:
        """Resolve the cross-site decisions once the whole file has been seen."""
        self._implicit_loss_scale()
        for call, _ in self._contrib_optimizers:
            inner = call.args[0].value if call.args else None
            flavour = self.optimizer_flavour(inner) if inner else None
            keras = self._keras_problem(inner, flavour) if inner else None
            if keras is not None:
                self.file.give_up("unported-api", f"nothing was changed: {keras}", call)
                return
            if inner is not None and flavour is None:
                self._unknown_kind(inner, Kind.CONTRIB_OPTIMIZER)
        self._decide_unseen_rewrites()
        self.keras.finish()
        self._resolve_tf_sites()
        for call, line in self._contrib_optimizers:
            value, why = self.is_distributed(call)
            self.file.edits.calls[call] = CallEdit(api.OPTIMIZER, _append_distributed(value))
            if value is not None:
                extra = f", is_distributed={code(value)} because {why}"
            else:
                extra = f", no is_distributed because {why}" if why else ""
            self.file.findings.append(
                Finding(
                    self.file.path,
                    line,
                    "contrib-optimizer",
                    f"`{code(call.func)}(...)` -> {api.OPTIMIZER}(...){extra}",
                )
            )
        for call in self._dynamic_calls:
            self._control_deps(call, movable=True)
        for call in self._ported_dynamic:
            self._control_deps(call, movable=False)
        if self.vendor_ported:
            self._leave_vendor_file()
            return
        self._plan_import_removals()

    def is_distributed(
        self, call: cst.Call, *, keras: bool = False
    ) -> tuple[cst.BaseExpression | None, str]:
        """`is_distributed=` for an optimizer built by `call` (None: leave it out) and why.

        Horovod is decided alike for both front-ends. A tf.distribute strategy alone is not a
        reason to pass anything to the Keras optimizer: its default (None) already sums the flag
        exactly when a strategy has several replicas, where `has_strategy()` evaluated at
        construction could pass False and be refused under a multi-replica strategy.
        """
        if self.distributed == "never":
            return None, "of --distributed never"
        if self.distributed == "always":
            return cst.Name("True"), "of --distributed always"
        # A function handed Horovod as a parameter decides for itself, whatever the file imports.
        handed = horovod_parameter(
            self.file.scope(call), self.file.parent, self.facts.horovod_aliases
        )
        if handed is not None:
            return handed
        if not self.facts.trains_distributed:
            return None, ""
        if keras and not self.facts.horovod_imported:
            return None, (
                "the file trains under a tf.distribute strategy, over whose replicas the Keras "
                "optimizer's default (None) sums the overflow flag by itself"
            )
        value, why = is_distributed_value(
            call,
            self.facts,
            parent=self.file.parent,
            canonical=self.file.canonical,
            scope=self.file.scope(call),
        )
        if self.facts.horovod_imported and not self.facts.initialised and _is_true(value):
            self.file.warn(
                call,
                "distributed-unverified",
                "is_distributed=True: the file uses Horovod but never calls hvd.init(); the "
                "optimizer raises at graph build unless Horovod is initialised first (e.g. by "
                "the runner). If the script also runs without Horovod, pass the condition it "
                "uses instead",
            )
        return value, why

    def _resolve_tf_sites(self) -> None:
        for opt in self._optimizers:
            if opt.problem is None:
                self._link_manager(opt)
        for ctor in self._ctors.values():
            self._decide_ctor(ctor)
        for opt in self._optimizers:
            if opt.problem is None and opt.ctor is not None and not opt.ctor.ported:
                opt.problem = (
                    f"its loss-scale object is not ported (see the warning at line {opt.ctor.line})"
                )
            self._emit_optimizer(opt)
        self.file.sites = [s for s in self.file.sites if s.targets or self._site_ported(s)]

    def _site_ported(self, site: Site) -> bool:
        return isinstance(site.node, cst.Call) and site.node in self.file.edits.calls

    def _link_manager(self, opt: WrappedOptimizer) -> None:
        index = opt.bound.get("loss_scale")
        if index is None:
            if opt.kind is Kind.GRAPH_REWRITE:
                opt.manager = "default"
            else:
                opt.problem = "the loss_scale argument is missing"
            return
        value = opt.call.args[index].value
        text = args_.string_value(value)
        if text is not None:
            if text == "dynamic":
                opt.manager = "dynamic"
            else:
                opt.problem = f"loss_scale={text!r} is not a loss scale TensorFlow accepts"
            return
        if args_.is_numeric_literal(value):
            opt.manager = "fixed"
            return
        ctor = self.ctor_for(value)
        if ctor is None:
            opt.problem = (
                f"its loss scale `{code(value)}` is not a literal or a DynamicLossScale/"
                "FixedLossScale built in the same scope, so its kind is unknown"
            )
            return
        opt.manager = "ctor"
        opt.ctor = ctor
        ctor.consumers.append(opt)

    def ctor_for(self, value: cst.BaseExpression) -> LossScaleObject | None:
        if isinstance(value, cst.Call):
            return self._ctors.get(value)
        if not isinstance(value, cst.Name):
            return None
        scope = self.file.scope(value)
        if scope is None:
            return None
        access = next((a for a in scope.accesses if a.node is value), None)
        if access is None or len(access.referents) != 1:
            return None
        (assignment,) = access.referents
        if not isinstance(assignment, Assignment) or assignment.scope is not scope:
            return None
        if any(type(a) is not Assignment for a in scope[value.value]):
            return None
        target = assignment.node
        statement = self.file.parent(self.file.parent(target)) if self.file.parent(target) else None
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and statement.targets[0].target is target
            and isinstance(statement.value, cst.Call)
        ):
            return None
        ctor = self._ctors.get(statement.value)
        if ctor is not None:
            ctor.variable = assignment
        return ctor

    def _decide_ctor(self, ctor: LossScaleObject) -> None:
        if ctor.keras:
            return  # mapped into (or left with) the Keras optimizer it is passed to inline
        what = code(ctor.call.func)
        problem = ctor.problem
        if problem is None and not ctor.consumers:
            problem = (
                "it is not passed to an optimizer the tool ports; the NPU managers have another "
                "interface (no update()), so port its uses by hand"
            )
        if problem is None and ctor.variable is not None:
            passed = {id(o.call.args[o.bound["loss_scale"]].value) for o in ctor.consumers}
            # `loss_scaler()` reads the scale, which the NPU managers answer the same way.
            others = [
                r
                for r in ctor.variable.references
                if id(r.node) not in passed and not self._called_bare(r.node)
            ]
            if others:
                problem = (
                    f"`{ctor.variable.name}` is also used at line {self.file.line(others[0].node)} "
                    "where a TensorFlow LossScale object is expected"
                )
        if problem is None and any(o.problem is not None for o in ctor.consumers):
            problem = "the optimizer that uses it cannot be ported (see its warning)"
        if problem is not None:
            self.file.findings.append(
                Finding(
                    self.file.path,
                    ctor.line,
                    _ctor_rule(ctor.kind),
                    f"`{what}(...)` left unchanged: {problem}",
                    "warning",
                )
            )
            return
        ctor.ported = True
        target = api.DYNAMIC if ctor.kind is Kind.TF_DYNAMIC else api.FIXED
        self.file.edits.calls[ctor.call] = CallEdit(target, ctor.build)
        self.file.consume(ctor.call.func)
        self.file.sites.append(Site(ctor.call, (target,), self.file.provider(ctor.call.func)))
        detail = (
            " with TF's semantics (decrease on every overflow by 1/multiplier)"
            if ctor.kind is Kind.TF_DYNAMIC
            else ""
        )
        self.file.findings.append(
            Finding(
                self.file.path,
                ctor.line,
                _ctor_rule(ctor.kind),
                f"`{what}(...)` -> {target}(...){detail}",
            )
        )
        if ctor.kind is Kind.TF_DYNAMIC:
            self._dynamic_calls.append(ctor.call)

    def _called_bare(self, node: cst.CSTNode) -> bool:
        call = self.file.parent(node)
        return isinstance(call, cst.Call) and call.func is node and not call.args

    def _emit_optimizer(self, opt: WrappedOptimizer) -> None:
        rule = "graph-rewrite" if opt.kind is Kind.GRAPH_REWRITE else "tf-loss-scale-optimizer"
        if opt.keras:
            rule = "unported-api"
        what = code(opt.call.func)
        if opt.problem is None and opt.unknown is not None:
            self._unknown_kind(opt.unknown, opt.kind)
        if opt.problem is not None:
            self.file.findings.append(
                Finding(
                    self.file.path,
                    opt.line,
                    rule,
                    f"`{what}(...)` left unchanged: {opt.problem}",
                    "warning",
                )
            )
            return
        value, why = self.is_distributed(opt.call)
        targets = [api.OPTIMIZER]
        if opt.manager in ("dynamic", "default"):
            # The manager the port writes inline may sit under tf.control_dependencies(): the
            # library creates its variables outside them, so nothing is said about that.
            targets.append(api.DYNAMIC)
        elif opt.manager == "fixed":
            targets.append(api.FIXED)
        self.file.edits.calls[opt.call] = CallEdit(api.OPTIMIZER, _optimizer_builder(opt, value))
        site = next(s for s in self.file.sites if s.node is opt.call)
        site.targets = tuple(targets)
        extra = f", is_distributed={code(value)} because {why}" if value is not None else ""
        manager = {
            "dynamic": f"{api.DYNAMIC} equal to loss_scale='dynamic'",
            "default": f"{api.DYNAMIC} equal to the default loss_scale='dynamic'",
            "fixed": api.FIXED,
            "ctor": "the ported loss-scale object",
        }[opt.manager]
        self.file.findings.append(
            Finding(
                self.file.path,
                opt.line,
                rule,
                f"`{what}(...)` -> {api.OPTIMIZER}(opt, {manager}){extra}",
            )
        )
        if opt.kind is Kind.GRAPH_REWRITE:
            self.file.findings.append(
                Finding(
                    self.file.path,
                    opt.line,
                    "graph-rewrite",
                    f"{api.PORTED_REWRITE_NOTE}; on the NPU the compute "
                    "precision comes from the session's precision_mode (e.g. allow_mix_precision),"
                    " not from a graph rewrite",
                    "warning",
                )
            )

    def _control_deps(self, call: cst.Call, *, movable: bool) -> None:
        decision = control_deps_decision(
            call, parent=self.file.parent, canonical=self.file.canonical, scope=self.file.scope
        )
        if decision is None:
            return
        with_node, statement, reason = decision
        if statement is not None and movable:
            self.file.edits.hoists[with_node] = statement
            self.file.change(
                call,
                "manager-in-control-deps",
                f"the dynamic loss-scale manager moved out of the `with` block at line "
                f"{self.file.line(with_node)}: the NPU manager must not be built under "
                "tf.control_dependencies()",
            )
            return
        self.file.warn(
            call,
            "manager-in-control-deps",
            "a dynamic loss-scale manager is built inside tf.control_dependencies() (line "
            f"{self.file.line(with_node)}) and was left there ({reason or 'it is not movable'}): "
            "npu_lossscale's manager runs there as written, the Ascend adapter's does not; move "
            "it out if the script must also run on the adapter",
        )

    def _leave_vendor_file(self) -> None:
        """Files importing npu_bridge were ported already: report what is left, change nothing."""
        changes = [f for f in self.file.findings if f.kind == "change"]
        # Warnings about what a port would bring (the rewrite no longer switched on, the inner
        # optimizer's kind, Horovod's init) concern a port that does not happen here.
        self.file.findings = [
            f
            for f in self.file.findings
            if f.kind != "change"
            and f.rule not in ("optimizer-kind-unknown", "distributed-unverified")
            and not f.message.startswith(api.PORTED_REWRITE_NOTE)
        ]
        for f in changes:
            self.file.findings.append(
                dataclasses.replace(
                    f,
                    rule="npu-bridge",
                    kind="warning",
                    message=f"not changed because the file already uses npu_bridge: {f.message}",
                )
            )
        self.file.edits = Edits()
        self.file.sites = []

    def _keep_reexport(self, node: cst.CSTNode, scope: Scope, bound: str) -> None:
        """Keep `bound` importable from this module when another file of the run imports it
        (`from utils import LossScaleOptimizer`): bound to the npu_lossscale class instead."""
        if bound not in self._reexported or scope is not self._global:
            return
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
            return
        self.file.edits.rebinds.setdefault(node, []).append((target, bound))
        self.file.change(
            node,
            "reexport",
            f"other files import `{bound}` from this module: it stays bound here, to "
            f"{api.LIBRARY}'s {target}",
        )

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

    def _plan_import_removals(self) -> None:
        self._plan_keras_import_removals()
        for node, index, bound in self._contrib_imports:
            scope = self.file.scope(node)
            refs = self._references(node, bound)
            if scope is None or refs is None:
                continue
            if not refs:
                # Nothing here to port, but the file still fails to import without tf.contrib.
                self.file.warn(
                    node,
                    "unported-api",
                    f"`{bound}` is imported from tf.contrib and not used in this file (a "
                    "re-export?); tf.contrib does not exist in TensorFlow 2 or on Ascend: import "
                    f"it from {api.LIBRARY} here, and port the modules importing it from this one",
                )
            elif self.file.edits and all(id(r) in self.file.consumed for r in refs):
                self.file.edits.removals.setdefault(node, set()).add(index)
                self._removed_bindings.add((id(node), bound))
                self.file.change(node, "contrib-import", f"removed the unused import of `{bound}`")
                self._keep_reexport(node, scope, bound)

    def _plan_keras_import_removals(self) -> None:
        """Drop a Keras mixed-precision import whose every use the Keras port rewrote. Kept when
        anything else may still read the name: another use, another file of the run importing
        it from here, or this module's `__all__`."""
        for node, index, bound in self._keras_imports:
            refs = self._references(node, bound)
            if not refs or not all(id(r) in self.file.consumed for r in refs):
                continue
            global_scope = self.file.scope(node) is self._global
            if global_scope and (bound in self._reexported or bound in self._dunder_all):
                continue
            self.file.edits.removals.setdefault(node, set()).add(index)
            self._removed_bindings.add((id(node), bound))
            self.file.change(
                node, "keras-import", f"removed the import of `{bound}`: no use is left"
            )


_STEP_METHODS = ("apply_gradients", "compute_gradients", "update_loss_scale", "get_loss_scale")


def _subclass_problem(cls: cst.ClassDef) -> str | None:
    """Why a subclass of a tf.contrib loss-scale class is not provably compatible, or None."""
    methods = {stmt.name.value: stmt for stmt in cls.body.body if isinstance(stmt, cst.FunctionDef)}
    overridden = [m for m in _STEP_METHODS if m in methods]
    if overridden:
        return f"overrides {', '.join(overridden)}"
    init = methods.get("__init__")
    if init is not None and "__init__" not in {
        a.attr.value for a in walk(init) if isinstance(a, cst.Attribute)
    }:
        return "overrides __init__ without calling the base __init__"
    own = set()  # attributes the subclass assigns itself may be private: they are its own
    for target in (t for t in walk(cls) if isinstance(t, cst.AssignTarget)):
        for attribute in walk(target.target):
            if isinstance(attribute, cst.Attribute) and code(attribute.value) == "self":
                own.add(attribute.attr.value)
    for node in walk(cls):
        if (
            isinstance(node, cst.Attribute)
            and code(node.value) == "self"
            and node.attr.value.startswith("_")
            and not node.attr.value.startswith("__")
            and node.attr.value not in own
        ):
            return f"uses the base class's private `self.{node.attr.value}`"
    return None


def _name_flavour(name: str) -> str | None:
    flavour = api.optimizer_flavour(name)
    return "keras2" if flavour == "keras" and api.is_keras_2_optimizer(name) else flavour


def _is_true(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"


_CONTRIB_TO_NPU = {
    "LossScaleOptimizer": api.OPTIMIZER,
    api.FIXED: api.FIXED,
    api.DYNAMIC: api.DYNAMIC,
}


def _ctor_rule(kind: Kind) -> str:
    return "tf-dynamic-loss-scale" if kind is Kind.TF_DYNAMIC else "tf-fixed-loss-scale"


def _append_distributed(value: cst.BaseExpression | None) -> Builder | None:
    if value is None:
        return None

    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        return args_.append_keyword(arguments, "is_distributed", value.deep_clone())

    return build


def _tf_dynamic_builder(bound: dict[str, int]) -> Builder:
    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        return args_.tf_dynamic_arguments({k: arguments[i].value for k, i in bound.items()})

    return build


def _tf_fixed_builder(bound: dict[str, int]) -> Builder:
    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        index = bound.get("loss_scale_value")
        if index is None:
            return list(arguments)
        out = list(arguments)
        out[index] = args_.renamed(out[index], "loss_scale")
        return out

    return build


def _optimizer_builder(opt: WrappedOptimizer, value: cst.BaseExpression | None) -> Builder:
    bound = dict(opt.bound)
    manager = opt.manager

    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        out = list(arguments)
        index = bound.get("loss_scale")
        if manager == "default":
            new = cst.Arg(value=args_.dynamic_manager(names[api.DYNAMIC]))
            if any(a.keyword is not None for a in out):
                new = args_.keyword("loss_scale_manager", new.value)
            out = args_.without_trailing_comma(out) + [new]
        else:
            assert index is not None
            arg = out[index]
            if manager == "dynamic":
                arg = arg.with_changes(value=args_.dynamic_manager(names[api.DYNAMIC]))
            elif manager == "fixed":
                arg = arg.with_changes(value=args_.fixed_manager(names[api.FIXED], arg.value))
            out[index] = args_.renamed(arg, "loss_scale_manager")
        if value is not None:
            out = args_.append_keyword(out, "is_distributed", value.deep_clone())
        return out

    return build


def _imported_roots(module: cst.Module) -> set[str] | None:
    """Every name an import statement binds, anywhere in the module; None with a star import."""
    names: set[str] = set()
    for node in walk(module):
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
    return names


def _is_keras_training_call(call: cst.Call) -> bool:
    """`model.compile(optimizer=...)`, `model.fit(...)`: Keras's training API on a value."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value == "compile":
        return any(
            arg.keyword is not None and arg.keyword.value == "optimizer" for arg in call.args
        )
    return func.attr.value in ("fit", "fit_generator", "train_on_batch")


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


def _hands_a_strategy(call: cst.Call) -> bool:
    """`RunConfig(train_distribute=strategy)`: an Estimator trains under the strategy, however
    the script built it (a helper such as distribution_utils.get_distribution_strategy)."""
    return any(
        arg.keyword is not None
        and arg.keyword.value in ("train_distribute", "eval_distribute")
        and not (isinstance(arg.value, cst.Name) and arg.value.value == "None")
        for arg in call.args
    )
