"""Find every use of a PyTorch gradient scaler in a file and decide, use by use, how it is ported.

The analysis only reads the original tree (with scope metadata) and produces a `TorchPlan` plus
findings; `rewrite.py` applies the plan. A use is ported where the result provably means the same:

- a constructor call, arguments mapped onto npu_lossscale.torch.GradScaler's signature;
- `torch.cuda.amp.GradScaler` (or torch.cpu.amp's) in a type annotation: it follows the port;
- the same as the class tested by isinstance()/issubclass(): it becomes `torch.amp.GradScaler`,
  the base of the ported class and of every torch scaler, so the test stays true for scalers
  the port built and for those a library or an unported call built (a `torch.amp.GradScaler`
  there stays as written).

Anything else (the class passed or stored as a value, subclassed, called with *args, a name
bound to two things) is left as it is and reported. A scaler name that other files of the run
import from this one stays torch's here (they are not ported with it); the calls beside it are.
A file already on torch-npu's own scaler is left byte-identical.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment, QualifiedNameSource, Scope, ScopeProvider

from migrator import registry
from migrator.codemods.shared import arguments as shared_args
from migrator.codemods.shared import nodes
from migrator.codemods.shared.lines import LineProvider, start_line
from migrator.codemods.shared.nodes import code
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.qualified import qualified_names, through_alias
from migrator.codemods.torch import annotations, below_one, branches, messages, names, scan
from migrator.codemods.torch.arguments import builder
from migrator.codemods.torch.foreign import ForeignScaling
from migrator.codemods.torch.imports import Conflict, ImportSite, plan_imports
from migrator.codemods.torch.names import Kind
from migrator.codemods.torch.plan import ImportBinding, TorchPlan
from migrator.codemods.torch.ported import first_ported_scaler
from migrator.findings import Finding
from migrator.selection.reexports import names_imported_from
from migrator.selection.scaler_helpers import ScalerHelper

RULE = registry.TORCH_GRAD_SCALER
NPU_RULE = registry.TORCH_NPU
DEVICE_RULE = registry.TORCH_DEVICE
IMPORT_RULE = registry.TORCH_IMPORT
FOREIGN_RULE = registry.TORCH_FOREIGN_LOSS_SCALE


class TorchScalerAnalyzer(cst.CSTVisitor):
    """Walks the original tree once; `leave_Module` turns what it saw into a plan and findings."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentProvider, LineProvider)

    def __init__(
        self,
        path: str,
        reexports: frozenset[tuple[str, str]] = frozenset(),
        scaler_attrs: frozenset[str] = frozenset(),
        scaler_helpers: frozenset[ScalerHelper] = frozenset(),
    ) -> None:
        super().__init__()
        self._helpers = scaler_helpers  # other files' functions that build a scaler
        self.path = path
        # names other files of the run import from this module (migrator.selection.reexports)
        self._reexported = names_imported_from(reexports, path)
        # self.<attr> names the run assigns other scalers (migrator.selection.scaler_attrs)
        self._other_attrs = scaler_attrs
        self.plan = TorchPlan()
        self.findings: list[Finding] = []
        self._sites: list[ImportSite] = []
        self._consumed: set[int] = set()  # ids of the root names of rewritten references
        self._bindings: list[ImportBinding] = []
        self._npu: list[tuple[cst.CSTNode, str]] = []  # torch-npu scaler uses (node, what)
        self._transfer = False  # the file imports torch-npu's transfer_to_npu
        self._star: str | None = None  # a torch amp module imported with `*`
        self._star_warned = False
        self._roots: set[str] = set()
        self._guard: tuple[cst.CSTNode, str] | None = None  # `get_scale() < 1e-4` somewhere
        self._guard_warned = False
        self._chosen: set[int] = set()  # names bound to torch.amp's scaler or, on old torch, cuda's
        self._annotations: list[cst.Name | cst.Attribute] = []  # CUDA/CPU scalers annotated
        self._left = False  # the file leaves a scaler torch's (sharded, refused, foreign)
        self._plain_torch: list[tuple[cst.Import, int]] = []  # unaliased `import torch[.x.y]`
        self._foreign_scaling = ForeignScaling()

    # ----------------------------------------------------------------- helpers
    def line(self, node: cst.CSTNode) -> int:
        return start_line(self, node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentProvider, node, None)

    def scope(self, node: cst.CSTNode) -> Scope | None:
        return self.get_metadata(ScopeProvider, node, None)

    def _warn(self, node: cst.CSTNode, message: str, rule: str = RULE) -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, "warning"))

    def _hand_port(self, node: cst.CSTNode, message: str, *, leaves: bool = True) -> None:
        """A use the user must port by hand, unless only a torch the port cannot run on (older
        than 2.4) reaches it: the fallback of a version check needs nothing. `leaves`: the use
        keeps a scaler torch's, so annotations of the file's scalers stay as written."""
        if not branches.old_torch_only(node, self.parent):
            self._left |= leaves
            self._warn(node, message)

    def _change(self, node: cst.CSTNode, message: str, rule: str = RULE) -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, "change"))

    # ----------------------------------------------------------------- imports
    def visit_Module(self, node: cst.Module) -> bool:
        self._roots, star = scan.torch_roots(node)
        self._guard = below_one.scale_guard(node) if self._roots or star else None
        return bool(self._roots) or star

    def visit_Import(self, node: cst.Import) -> bool:
        for index, alias in enumerate(node.names):
            dotted = nodes.dotted(alias.name)
            if alias.asname is not None:
                local = nodes.dotted(alias.asname.name)
                self._binding(node, index, local, dotted)
            elif dotted.split(".")[0] == "torch":  # `import torch`, `import torch.cuda.amp`
                self._plain_torch.append((node, index))
            self._transfer |= names.is_transfer_to_npu(dotted)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None:
            return False
        module = nodes.dotted(node.module)
        if isinstance(node.names, cst.ImportStar):
            if module in names.STAR_MODULES:
                self._star = module
            return False
        for index, alias in enumerate(node.names):
            full = f"{module}.{nodes.dotted(alias.name)}"
            local = nodes.dotted(alias.asname.name) if alias.asname else nodes.dotted(alias.name)
            self._binding(node, index, local, full)
            self._transfer |= names.is_transfer_to_npu(full)
        return False

    def _binding(
        self, node: cst.Import | cst.ImportFrom, index: int, local: str, full: str
    ) -> None:
        if names.is_removable_binding(full):
            self._bindings.append(ImportBinding(node, index, local, full))

    # ----------------------------------------------------------------- references
    def visit_Name(self, node: cst.Name) -> bool:
        if self._star is not None and node.value == names.CLASS and not self._star_warned:
            self._star_warned = True
            self._warn(
                node,
                f"`from {self._star} import *` binds `{names.CLASS}` where the tool cannot see "
                f"it; import it explicitly and run again, or port it to {names.PORTED} by hand",
            )
        self._reference(node)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return self._reference(node)

    def _reference(self, node: cst.Name | cst.Attribute) -> bool:
        """Handle a maximal dotted reference; returns whether to look inside it."""
        root = nodes.root(node)
        if root is None:
            return True  # `GradScaler(...).scale`: an attribute of a value, look at the call
        if root.value not in self._roots:
            return False  # not reached through a torch import: cannot be torch's scaler
        resolved = qualified_names(self, node)
        found = [q.name for q in resolved if q.source is QualifiedNameSource.IMPORT]
        aliased = not found and len(resolved) == 1
        if aliased:
            found = through_alias(self, node, self.scope(node), self.parent)
        for name in found:
            self._foreign(node, name)
        related = [n for n in found if names.classify(n) or names.scaler_prefix(n)]
        if not related:
            return False
        if aliased:  # the port's import goes beside the import binding the root: none here
            self._hand_port(
                node,
                f"`{code(node)}` ({related[0]}) is reached through a module alias "
                f"(`{nodes.root(node).value} = ...`); left as it is: port it to {names.PORTED} "
                "by hand",
            )
            return False
        if len(resolved) > 1:
            if branches.new_torch_choice(resolved):
                self._chosen.add(id(node))
                self._use(node, Kind.AMP)
                return False
            bound = sorted({q.name for q in resolved})
            npu = [name for name in bound if names.classify(name) is Kind.NPU]
            self._hand_port(node, messages.ambiguous(code(node), bound, npu, names.PORTED))
            return False
        (name,) = related
        kind = names.classify(name)
        if kind is None:
            self._hand_port(
                node,
                f"`{code(node)}` reaches into torch's {names.scaler_prefix(name)}; left as it "
                f"is, check it still fits {names.PORTED}",
                leaves=False,
            )
        elif kind is Kind.NPU:
            self._npu.append((node, code(node)))
        elif kind is Kind.SHARDED:
            self._left = True
            self._warn(
                node,
                f"`{code(node)}` ({names.left_what(name)}) has no npu_lossscale counterpart; "
                "left as it is: its inf/NaN check misses overflows an NPU in saturation mode "
                "clamps to the fp16 maximum",
            )
        else:
            self._use(node, kind)
        return False

    def _foreign(self, node: cst.Name | cst.Attribute, name: str) -> None:
        call = self.parent(node)
        called = call if isinstance(call, cst.Call) and call.func is node else None
        text = self._foreign_scaling.message(name, code(node), called)
        if text is not None:
            self._warn(node, text, FOREIGN_RULE)

    def _use(self, node: cst.Name | cst.Attribute, kind: Kind) -> None:
        parent = self.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            self._constructor(node, parent, kind)
            return
        subclass = scan.subclass(node, self.parent)
        if subclass is not None:
            self._hand_port(
                subclass,
                f"class {subclass.name.value} subclasses `{code(node)}`; left unchanged: "
                f"rebase it on {names.PORTED} by hand and check what it overrides (the ported "
                "class keeps its own overflow check and state)",
            )
            return
        where = self._type_position(node)
        if where is None and kind is Kind.AMP and scan.used_as_key(node, self.parent):
            return  # a registry keyed by torch.amp.GradScaler finds the ported class (a subclass)
        if where is None:
            self._hand_port(
                node,
                f"`{code(node)}` is used as a value (passed, stored or returned), not "
                "constructed; what it builds elsewhere stays torch's scaler: port it by hand",
            )
        elif kind is Kind.AMP:
            pass  # the ported class is a torch.amp.GradScaler already: still true as written
        elif where == "in a type annotation":
            self._annotations.append(node)  # decided once the file's left scalers are known
        elif self._torch_bound(node):
            root = nodes.root(node)
            assert root is not None
            self._consumed.add(id(root))
            self.plan.refs[node] = names.BASE
            self._change(
                node,
                f"`{code(node)}` {where} -> {names.BASE}, the base of the ported class and of "
                "torch's scalers, so the test holds for scalers built elsewhere too",
            )
        else:
            self._hand_port(
                node,
                f"`{code(node)}` {where} is False for the ported class (a "
                f"{names.BASE}, not a torch.cuda.amp one); left unchanged: test against "
                f"{names.BASE} by hand",
            )

    def _torch_bound(self, node: cst.CSTNode) -> bool:
        """Whether `torch` reads as the torch module where `node` is, at run time."""
        scope = self.scope(node)
        if scope is None or "torch" not in scope:
            return False
        bound = [a for a in scope["torch"] if not scan.type_checking_only(a, self.parent)]
        return bool(bound) and all(
            isinstance(a.node, cst.Import)
            and any(
                alias.asname is None and nodes.dotted(alias.name).split(".")[0] == "torch"
                for alias in a.node.names
            )
            for a in bound
        )

    def _constructor(self, node: cst.Name | cst.Attribute, call: cst.Call, kind: Kind) -> None:
        params = names.AMP_PARAMS if kind is Kind.AMP else names.DEVICE_FREE_PARAMS
        # The CUDA and CPU scalers take no device, so their **kwargs hold only parameters the
        # ported class takes by the same names; torch.amp's may hold the device, which must go,
        # unless the call passes the device itself (a second one would be a TypeError).
        bound = shared_args.bind(call, params, pass_double_star=True)
        if kind is Kind.AMP and not isinstance(bound, str) and "device" not in bound:
            if any(arg.star == "**" for arg in call.args):
                bound = "the call passes **-arguments that may hold the device"
        what = f"`{code(node)}(...)`"
        if isinstance(bound, str):
            self._hand_port(
                call,
                f"{what} left unchanged: {bound}; port it to {names.PORTED} by hand (it takes "
                "torch.amp.GradScaler's parameters, device first)",
            )
            return
        drop, details, device_warning = None, [], None
        if kind is Kind.AMP and "device" in bound:
            value = call.args[bound["device"]].value
            text = shared_args.string_value(value)
            if text is not None and text.split(":")[0] == "npu":
                self._npu.append((call, f"{code(node)}({code(value)})"))
                return
            if text is not None and text.split(":")[0] == "cuda":
                drop = "device"
                details.append(f"device {text!r} dropped: device='auto' picks the NPU")
            else:
                details.append(f"device `{code(value)}` kept")
                if text != "cpu":
                    device_warning = (
                        f"the scaler's device `{code(value)}` was kept: on Ascend it must be "
                        "'npu' (or drop it: device='auto' picks the NPU)"
                    )
        elif kind is Kind.CPU:
            details.append("device='cpu' kept")
        else:
            details.append("device='auto' (the NPU) instead of CUDA")
        by_name = kind is not Kind.AMP or drop is not None
        named = [
            p
            for p, i in sorted(bound.items(), key=lambda item: item[1])
            if call.args[i].keyword is None and p != drop
        ]
        if by_name and named:
            details.append(f"positional arguments passed by name ({', '.join(named)})")
        if any(arg.star == "**" for arg in call.args):
            details.append("**-arguments passed on as written (they cannot hold a device)")
        add_device = "cpu" if kind is Kind.CPU else None
        init = call.args[bound["init_scale"]].value if "init_scale" in bound else None
        below = below_one.literal_below_one(init) if init is not None else None
        floor = below_one.STOCK_FLOOR if below is not None or self._guard is not None else None
        if floor is not None:
            details.append(f"min_loss_scale={floor} added (torch's rule: no floor)")
        self.plan.calls[call] = builder(
            bound, drop=drop, by_name=by_name, add_device=add_device, floor=floor
        )
        self._rewrite(node, call)
        self._change(call, f"{what} -> {names.PORTED}(...), settings kept; {'; '.join(details)}")
        if device_warning is not None:
            self._warn(call, device_warning, DEVICE_RULE)
        if below is not None:
            self._warn(
                call,
                f"init_scale {below} is below 1: the script relies on the scale going below 1, "
                f"as torch allows; {names.PORTED}'s default floor is 1, so min_loss_scale=0 was "
                "added to keep torch's rule (raise init_scale and drop it to keep a floor)",
                below_one.RULE,
            )
        if self._guard is not None and not self._guard_warned:
            self._guard_warned = True
            guard, how = self._guard
            self._warn(
                guard,
                f"the script {how}; {names.PORTED}'s default floor is 1 (torch's scale has "
                "none), so min_loss_scale=0 was added to each ported scaler of this file",
                below_one.RULE,
            )

    def _rewrite(self, node: cst.Name | cst.Attribute, call: cst.Call | None) -> None:
        root = nodes.root(node)
        assert root is not None
        self._consumed.add(id(root))
        provider = self._provider(node, root)
        home = None
        if id(node) in self._chosen:
            home = branches.choice_statement(root, self.scope(root), self.parent)
        self._sites.append(ImportSite(node, call, provider, self.scope(node), home))

    def _provider(self, node: cst.Name | cst.Attribute, root: cst.Name) -> Assignment | None:
        """The import that binds the root name of a reference (the first one where several do:
        `import torch` and `import torch.jit` both bind `torch`).

        Where a dotted import matches the reference (`import torch.cuda.amp` read as
        `torch.cuda.amp.GradScaler`), libcst records the access on that attribute, not on the
        root name, so every prefix of the reference is looked up."""
        scope = self.scope(root)
        if scope is None:
            return None
        chain = set()
        current: cst.BaseExpression = node
        while isinstance(current, cst.Attribute):
            chain.add(id(current))
            current = current.value
        chain.add(id(root))
        for access in scope.accesses:
            if id(access.node) in chain:
                imports = [
                    a
                    for a in access.referents
                    if isinstance(a, Assignment)
                    and isinstance(a.node, (cst.Import, cst.ImportFrom))
                ]
                if len(imports) != len(access.referents):
                    return None
                # A use that runs is bound by an import that runs: one under TYPE_CHECKING
                # (`import torch.cuda.amp` there, `import torch` at the top) is not its home.
                running = [a for a in imports if not scan.type_checking_only(a, self.parent)]
                if not running and root.value in scope:
                    running = [
                        a
                        for a in scope[root.value]
                        if isinstance(a, Assignment)
                        and isinstance(a.node, cst.Import)
                        and not scan.type_checking_only(a, self.parent)
                    ]
                return min(running or imports, key=lambda a: self.line(a.node), default=None)
        return None

    def _type_position(self, node: cst.CSTNode) -> str | None:
        """'in a type annotation' / 'in isinstance()': where the class is only compared."""
        current = node
        while True:
            up = self.parent(current)
            if up is None or isinstance(up, (cst.BaseStatement, cst.BaseSmallStatement)):
                break
            if isinstance(up, cst.Annotation):
                return "in a type annotation"
            current = up
        up = self.parent(node)
        while isinstance(up, cst.Element) and isinstance(self.parent(up), cst.Tuple):
            up = self.parent(self.parent(up))
        call = self.parent(up) if isinstance(up, cst.Arg) else None
        if not isinstance(call, cst.Call) or len(call.args) != 2 or call.args[1] is not up:
            return None
        test = {q.name for q in qualified_names(self, call.func)}
        for builtin in ("isinstance", "issubclass"):
            if test == {f"builtins.{builtin}"}:
                return f"in {builtin}()"
        return None

    # ----------------------------------------------------------------- decisions
    def leave_Module(self, original_node: cst.Module) -> None:
        if self._npu:
            self._leave_npu_file()
            return
        self._unused_imports()
        elsewhere = below_one.built_elsewhere(original_node, self._guard, self._helpers)
        if elsewhere is not None and not self._guard_warned:
            self._warn(elsewhere[0], elsewhere[1], below_one.RULE)
        if not self._left:
            for node in self._annotations:
                if annotations.holds_other_values(
                    node, original_node, self.plan.calls, self.parent, self._other_attrs
                ):
                    continue
                self._rewrite(node, None)
                self._change(node, f"`{code(node)}` in a type annotation -> {names.PORTED}")
        if not self._sites:
            ported = None if self._transfer else first_ported_scaler(original_node, self)
            if ported is not None:  # ported by an earlier run: the reminder still holds
                self._warn(ported, messages.TRANSFER_NOTE, DEVICE_RULE)
            return
        for binding in self._bindings:
            if binding.bound in self._reexported and self._module_level(binding.node):
                self._warn(
                    binding.node,
                    f"`{binding.bound}` stays torch's here: other files import it from this "
                    f"module and are not ported with it; port them to {names.PORTED} by hand",
                )
                continue
            refs = self._references(binding)
            if refs and all(id(r) in self._consumed for r in refs):
                self.plan.removals.setdefault(binding.node, set()).add(binding.index)
        # a reference rewritten to torch.amp.GradScaler reads torch, whatever it read before
        keep = not self._plain_torch or names.BASE in self.plan.refs.values()
        if not keep and scan.only_reads_of(original_node, "torch", self._consumed):
            # npu_lossscale.torch imports torch itself, so nothing is lost with the import
            for statement, index in self._plain_torch:
                self.plan.removals.setdefault(statement, set()).add(index)
        try:
            anchors = plan_imports(self._sites, self.plan, self._removed_names(), self.parent)
        except Conflict as conflict:
            self.findings = [f for f in self.findings if f.kind != "change"]
            self._warn(
                conflict.node, f"nothing was changed: {conflict.reason}", registry.NAME_CONFLICT
            )
            self.plan = TorchPlan()
            return
        self.plan.collapse = {a for a in anchors if branches.collapsible(a, self._all_removed)}
        self._report_imports(anchors)
        self._guarded_imports(anchors)
        if self.plan.calls and not self._transfer:
            first = min(self.line(call) for call in self.plan.calls)
            note = Finding(self.path, first, DEVICE_RULE, messages.TRANSFER_NOTE, "warning")
            self.findings.append(note)

    def _report_imports(self, anchors: list[cst.BaseStatement]) -> None:
        """One change per import statement touched, on its line."""
        replaced: set[cst.CSTNode] = set()
        for statement in anchors:
            lines = " and ".join(f"`{line}`" for line in self.plan.after[statement])
            if statement in self.plan.collapse:
                replaced.add(statement)
                self._change(
                    statement,
                    f"this choice between torch.amp's and torch.cuda.amp's scaler becomes {lines} "
                    "(the port needs torch 2.4 or later, where the first one is always chosen)",
                    IMPORT_RULE,
                )
            elif not isinstance(statement, cst.SimpleStatementLine):
                self._change(statement, f"adds {lines} after this statement", IMPORT_RULE)
            elif all(self._all_removed(small) for small in statement.body):
                replaced.add(statement)
                self._change(statement, f"this import becomes {lines}", IMPORT_RULE)
            else:
                self._change(statement, f"adds {lines} after this statement", IMPORT_RULE)
        for node, gone in self.plan.removals.items():
            if scan.inside(node, replaced, self.parent):
                continue
            if self._all_removed(node):
                self._change(node, "removed this import: every use was ported", IMPORT_RULE)
            else:
                aliases = node.names if isinstance(node.names, (list, tuple)) else ()
                dropped = ", ".join(code(aliases[i].name) for i in sorted(gone))
                self._change(
                    node, f"drops `{dropped}` from this import: every use was ported", IMPORT_RULE
                )

    def _guarded_imports(self, anchors: list[cst.BaseStatement]) -> None:
        """The new import inside `try: ... except ImportError:` is swallowed where npu_lossscale
        is missing, and the script then fails at the scaler's first use, far from the cause."""
        for statement in anchors:
            if scan.swallowed(statement, self.parent):
                self._warn(
                    statement,
                    f"the {names.LIBRARY} import goes inside a try whose except catches "
                    "ImportError: where npu_lossscale is not installed the error is "
                    "swallowed and the scaler's first use fails instead; install it where "
                    "this runs, or move the import out of the guard",
                    IMPORT_RULE,
                )

    def _all_removed(self, small: cst.CSTNode) -> bool:
        aliases = getattr(small, "names", None)
        gone = self.plan.removals.get(small, set())
        return isinstance(aliases, (list, tuple)) and len(gone) == len(aliases)

    def _module_level(self, node: cst.CSTNode) -> bool:
        statement = self.parent(node)
        return statement is not None and isinstance(self.parent(statement), cst.Module)

    def _references(self, binding: ImportBinding) -> list[cst.CSTNode]:
        scope = self.scope(binding.node)
        if scope is None:
            return []
        return [
            r.node
            for a in scope.assignments
            if a.node is binding.node and a.name == binding.bound
            for r in a.references
        ]

    def _unused_imports(self) -> None:
        for binding in self._bindings:
            if names.classify(binding.qualified) is None or self._references(binding):
                continue
            self._warn(
                binding.node,
                f"`{binding.bound}` ({binding.qualified}) is imported here and not used: if "
                f"other modules import it from this one, port them to {names.PORTED} by hand",
            )

    def _removed_names(self) -> set[tuple[int, str]]:
        return {
            (id(b.node), b.bound)
            for b in self._bindings
            if b.index in self.plan.removals.get(b.node, ())
        }

    def _leave_npu_file(self) -> None:
        """A file on torch-npu's scaler runs on Ascend already: say so, change nothing."""
        node, what = self._npu[0]
        # What the port would have changed goes, and so do its words on the devices of scalers
        # it now leaves: each of those is warned below as not ported.
        self.findings = [f for f in self.findings if f.kind != "change" and f.rule != DEVICE_RULE]
        self._warn(
            node,
            f"the file already uses torch-npu's scaler (`{what}`), so it was left unchanged; "
            f"{names.PORTED} can replace it (same methods, plus overflow modes and the "
            "all-reduced overflow decision) if you port it by hand",
            NPU_RULE,
        )
        for site in self._sites:
            if site.call is not None:
                self._warn(
                    site.call,
                    f"`{code(site.node)}(...)` not ported: the file uses torch-npu's scaler "
                    f"(line {self.line(node)}), so it stays as it is; port both by hand if wanted",
                )
        self.plan = TorchPlan()
