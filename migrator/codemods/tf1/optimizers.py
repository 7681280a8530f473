"""The optimizers the TF1 port wraps: tf.contrib's and TF's LossScaleOptimizer, and TF's
enable_mixed_precision_graph_rewrite.

Each call is recorded while walking (how it binds, why it may stay) and decided once the file is
read: its manager linked ('dynamic', a number, a loss-scale object of the file, or the graph
rewrite's default), its inner optimizer checked (a Keras one goes to the Keras port or is left:
the tf.compat.v1 class rejects it), `is_distributed=` added from the file's distribution facts.
A graph rewrite of an optimizer of unseen kind goes to the Keras port unless the file names a
TF 1-only symbol (TF 2's function takes only Keras optimizers).
"""

from __future__ import annotations

import libcst as cst

from migrator import registry
from migrator.codemods.keras.port import KerasPort
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import code
from migrator.codemods.shared.plan import CallEdit, Site
from migrator.codemods.tf1.builders import append_distributed, optimizer_builder
from migrator.codemods.tf1.distribution import Distribution
from migrator.codemods.tf1.keras_facts import KerasFacts
from migrator.codemods.tf1.kinds import OptimizerKinds
from migrator.codemods.tf1.loss_scale_objects import LossScaleObjects
from migrator.codemods.tf1.sites import WrappedOptimizer
from migrator.codemods.tf1.subclass import incompatible_subclass
from migrator.findings import Finding

_TF_OPT_PARAMS = ("opt", "loss_scale")


class Optimizers:
    """Handlers for the optimizers' references; `check_contrib`, `decide_unseen_rewrites`,
    `resolve` and `emit_contrib` run in that order once the file is read."""

    def __init__(
        self,
        file: FileContext,
        *,
        kinds: OptimizerKinds,
        keras_facts: KerasFacts,
        objects: LossScaleObjects,
        distribution: Distribution,
        keras: KerasPort,
    ) -> None:
        self.file = file
        self.kinds = kinds
        self.keras_facts = keras_facts
        self.objects = objects
        self.distribution = distribution
        self.keras = keras
        self._optimizers: list[WrappedOptimizer] = []
        self._contrib_optimizers: list[tuple[cst.Call, int]] = []
        self._unseen_rewrites: list[tuple[cst.CSTNode, cst.Call, dict[str, int]]] = []

    # ----------------------------------------------------------------- collecting
    def contrib_optimizer(self, node: cst.CSTNode, call: cst.Call | None, *_: object) -> None:
        if call is None and incompatible_subclass(self.file, node):
            return
        if call is None:
            self.file.edits.refs[node] = api.OPTIMIZER
            self.file.site(node, node, api.OPTIMIZER)
            self.file.change(node, registry.CONTRIB_OPTIMIZER, f"`{code(node)}` -> {api.OPTIMIZER}")
            return
        self.file.site(call, node, api.OPTIMIZER)
        self._contrib_optimizers.append((call, self.file.line(call)))

    def tf_optimizer(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, _: str) -> None:
        if call is None:
            self.file.warn(
                node, registry.UNPORTED_API, f"`{code(node)}` is used as a value; port it by hand"
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
            flavour = self.kinds.flavour(inner)
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

    # ----------------------------------------------------------------- deciding
    def check_contrib(self) -> bool:
        """Give up on the file where a contrib optimizer wraps a Keras one (nothing can be ported
        around it); warn where its kind is unseen. False: the file was given up."""
        for call, _ in self._contrib_optimizers:
            inner = call.args[0].value if call.args else None
            flavour = self.kinds.flavour(inner) if inner else None
            keras = self._keras_problem(inner, flavour) if inner else None
            if keras is not None:
                self.file.give_up(registry.UNPORTED_API, f"nothing was changed: {keras}", call)
                return False
            if inner is not None and flavour is None:
                self._unknown_kind(inner, Kind.CONTRIB_OPTIMIZER)
        return True

    def decide_unseen_rewrites(self) -> None:
        """TF 2's enable_mixed_precision_graph_rewrite takes only Keras optimizers, TF 1's both
        kinds: where the file names no TF 1-only symbol, an optimizer of unseen kind goes to the
        Keras port (which says what it assumed), else to the TF1 one."""
        for node, call, bound in self._unseen_rewrites:
            if self.keras_facts.uses_v1:
                inner = call.args[bound["opt"]].value
                self._add_optimizer(node, call, Kind.GRAPH_REWRITE, None, bound, unknown=inner)
            else:
                self.keras.graph_rewrite(call, bound)

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
        graph_rewrite = kind is Kind.GRAPH_REWRITE and not self.keras_facts.uses_v1
        if not (self.keras_facts.uses_keras or graph_rewrite):
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
        self.file.warn(inner, registry.OPTIMIZER_KIND_UNKNOWN, message)

    def resolve(self) -> None:
        """Link each TF optimizer to its manager, decide the loss-scale objects, then port or
        leave each optimizer; sites of nothing ported are dropped."""
        for opt in self._optimizers:
            if opt.problem is None:
                self._link_manager(opt)
        self.objects.decide()
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
        ctor = self.objects.ctor_for(value)
        if ctor is None:
            opt.problem = (
                f"its loss scale `{code(value)}` is not a literal or a DynamicLossScale/"
                "FixedLossScale built in the same scope, so its kind is unknown"
            )
            return
        opt.manager = "ctor"
        opt.ctor = ctor
        ctor.consumers.append(opt)

    def _emit_optimizer(self, opt: WrappedOptimizer) -> None:
        rule = (
            registry.GRAPH_REWRITE
            if opt.kind is Kind.GRAPH_REWRITE
            else registry.TF_LOSS_SCALE_OPTIMIZER
        )
        if opt.keras:
            rule = registry.UNPORTED_API
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
        value, why = self.distribution.is_distributed(opt.call)
        targets = [api.OPTIMIZER]
        if opt.manager in ("dynamic", "default"):
            # The manager the port writes inline may sit under tf.control_dependencies(): the
            # library creates its variables outside them, so nothing is said about that.
            targets.append(api.DYNAMIC)
        elif opt.manager == "fixed":
            targets.append(api.FIXED)
        self.file.edits.calls[opt.call] = CallEdit(api.OPTIMIZER, optimizer_builder(opt, value))
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
                    registry.GRAPH_REWRITE,
                    f"{api.PORTED_REWRITE_NOTE}; on the NPU the compute "
                    "precision comes from the session's precision_mode (e.g. allow_mix_precision),"
                    " not from a graph rewrite",
                    "warning",
                )
            )

    def emit_contrib(self) -> None:
        """Port the contrib optimizers, with `is_distributed=` where the file trains distributed."""
        for call, line in self._contrib_optimizers:
            value, why = self.distribution.is_distributed(call)
            self.file.edits.calls[call] = CallEdit(api.OPTIMIZER, append_distributed(value))
            if value is not None:
                extra = f", is_distributed={code(value)} because {why}"
            else:
                extra = f", no is_distributed because {why}" if why else ""
            self.file.findings.append(
                Finding(
                    self.file.path,
                    line,
                    registry.CONTRIB_OPTIMIZER,
                    f"`{code(call.func)}(...)` -> {api.OPTIMIZER}(...){extra}",
                )
            )
