"""Port Keras's loss-scale wrappers to `npu_lossscale.keras.LossScaleOptimizer`.

Three spellings wrap a Keras optimizer in a loss-scale optimizer, and each maps onto the one
signature `LossScaleOptimizer(inner_optimizer, initial_scale, dynamic_growth_steps, *, dynamic,
incr_ratio, decr_ratio, is_distributed, ...)`:

- `keras.mixed_precision.LossScaleOptimizer` (TF 2.4+, tf_keras, Keras 3): its arguments keep
  their names. Only the positional order differs between Keras 2 (`dynamic` second) and Keras 3
  (`initial_scale` second); a positional Keras 2 argument is passed by keyword.
- TF 2.1-2.3's `keras.mixed_precision.experimental.LossScaleOptimizer(optimizer, loss_scale)` and
  TF 2's `enable_mixed_precision_graph_rewrite(keras_optimizer, loss_scale="dynamic")`: the
  `loss_scale` becomes keywords -- "dynamic" is the default rule, a number N a fixed scale
  (`initial_scale=N, dynamic=False`), an inline `DynamicLossScale(initial_loss_scale,
  increment_period, multiplier)` its three values (a multiplier m other than 2 as
  `incr_ratio=m, decr_ratio=1/m`, which is TF's rule), an inline `FixedLossScale(v)` a fixed v.

Keras 2 scripts (tf_keras, `optimizers.legacy`, TensorFlow Addons, the experimental wrapper, a
TF_USE_LEGACY_KERAS the file sets) are ported like the others; `version.py` decides which Keras
the file runs and so which class it names, and the report says which it assumed and why.
Whatever cannot be mapped exactly is left as written, with a warning that says why. Sites are
collected while the TF1 analysis walks the file and decided in `finish`, once every loss-scale
object of the file has been seen; `is_distributed=` is the TF1 port's decision for the same call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import libcst as cst

from migrator import registry, template_files
from migrator.codemods.keras import version
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.comments import line_limit, width
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import Parent, walk
from migrator.codemods.shared.plan import Builder
from migrator.codemods.tf1.sites import LossScaleObject
from migrator.selection.keras_helpers import KerasHelper

RULE = registry.KERAS_LOSS_SCALE_OPTIMIZER
_CHOICE_TEMPLATE = "keras_loss_scale_choice.py.tmpl"
_KEYWORDS = ("inner_optimizer", "dynamic", "initial_scale", "dynamic_growth_steps", "name")
# The inner optimizer's parameter name in each spelling.
_INNER = {"keras": "inner_optimizer", "experimental": "optimizer", "graph-rewrite": "opt"}
# Keras 2 read None as "the default" for these; ours takes the default when they are left out.
_NONE_MEANS_DEFAULT = ("initial_scale", "dynamic_growth_steps")


@dataclasses.dataclass
class KerasSite:
    """One Keras wrapper call: how its arguments bind, and why it stays if it does."""

    call: cst.Call
    spelling: str  # "keras" | "experimental" | "graph-rewrite"
    line: int
    bound: dict[str, int]
    problem: str | None
    keras_2_order: bool = False  # positional arguments in tf_keras's order
    either_order: bool = False  # `tf.keras`/`keras` with an ambiguous second positional argument
    keras_3_name: bool = False  # a name only Keras 3 has (`keras.optimizers.LossScaleOptimizer`)


@dataclasses.dataclass(frozen=True)
class LossScale:
    """What a `loss_scale` argument maps to; the keywords themselves are built from the
    transformed call (the argument itself, or the arguments of the inline loss-scale object at
    the indexes in `ctor_bound`)."""

    kind: str  # "default" | "dynamic" | "fixed" | "ctor-dynamic" | "ctor-fixed" | "runtime"
    ctor_bound: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # a run-time choice too long for the file's lines: the indentation of its continuation lines
    wrap: str | None = None


@dataclasses.dataclass(frozen=True)
class Tf1Facts:
    """What the Keras port asks of the TF1 analysis of the same file, and nothing more: the kind of
    an optimizer expression, the loss-scale object an argument names, `is_distributed=` for a
    call (the TF1 port's decision, asked with keras=True), and where the file pins Keras 2
    (its tf_keras use, its TF_USE_LEGACY_KERAS settings and its calls of other files' functions
    that set it, known once the file has been read)."""

    optimizer_flavour: Callable[[cst.BaseExpression], str | None]
    loss_scale_object: Callable[[cst.BaseExpression], LossScaleObject | None]
    is_distributed: Callable[..., tuple[cst.BaseExpression | None, str]]
    keras_pins: Callable[
        [],
        tuple[
            cst.CSTNode | None,
            tuple[tuple[cst.CSTNode, bool | None], ...],
            tuple[tuple[cst.CSTNode, KerasHelper], ...],
        ],
    ]


class KerasPort:
    """The Keras half of the loss-scale analysis: fed the Keras references the walk resolves,
    deciding them in `finish` into the shared plan and findings."""

    def __init__(self, file: FileContext, tf1: Tf1Facts) -> None:
        self.file = file
        self.tf1 = tf1
        self.sites: list[KerasSite] = []

    # ----------------------------------------------------------------- collecting
    def reference(self, node: cst.CSTNode, call: cst.Call | None, kind: Kind, name: str) -> None:
        """A resolved reference to a Keras LossScaleOptimizer class."""
        a = self.file
        if call is None:
            self._value_use(node, kind, name)
            return
        if kind is Kind.KERAS_EXPERIMENTAL:
            bound = args_.bind(call, ("optimizer", "loss_scale"))
            self._add(call, "experimental", bound)
            return
        order = api.keras_order(name) or _order_from_literals(call)
        if isinstance(order, str):
            site = KerasSite(call, "keras", a.line(call), {}, order, either_order=True)
            self.sites.append(site)
            return
        bound = args_.bind(call, ("inner_optimizer", *order), _KEYWORDS)
        keras_2, keras_3 = order == api.KERAS_2_ORDER, api.keras_order(name) == api.KERAS_3_ORDER
        self._add(call, "keras", bound, keras_2_order=keras_2, keras_3_name=keras_3)

    def graph_rewrite(self, call: cst.Call, bound: dict[str, int]) -> None:
        """`enable_mixed_precision_graph_rewrite(opt, loss_scale)` whose `opt` is Keras."""
        self._add(call, "graph-rewrite", bound)

    def _add(
        self, call: cst.Call, spelling: str, bound: dict[str, int] | str, **extra: bool
    ) -> None:
        problem = bound if isinstance(bound, str) else None
        bound = {} if isinstance(bound, str) else bound
        if problem is None and _INNER[spelling] not in bound:
            problem = "the optimizer argument is missing"
        site = KerasSite(call, spelling, self.file.line(call), bound, problem, **extra)
        self.sites.append(site)

    def _value_use(self, node: cst.CSTNode, kind: Kind, name: str) -> None:
        a = self.file
        if kind is Kind.KERAS_OPTIMIZER and (
            _isinstance_class(node, a.parent) or _in_annotation(node, a.parent)
        ):
            # npu_lossscale.keras's classes subclass Keras's own (2's or 3's): a type test is
            # still true, an annotation still right.
            return
        what = a.code(node)
        if _isinstance_class(node, a.parent):
            reason = (
                "npu_lossscale.keras's LossScaleOptimizer subclasses Keras's "
                f"mixed_precision.LossScaleOptimizer (Keras 2's or 3's), not `{what}`, so this "
                "isinstance() test is false for it; test against "
                "keras.mixed_precision.LossScaleOptimizer"
            )
        else:
            reason = (
                f"`{what}` is used as a value (subclassed, stored or passed), not constructed; "
                "port this use to npu_lossscale.keras.LossScaleOptimizer by hand"
            )
        a.warn(node, registry.UNPORTED_API, reason)

    # ----------------------------------------------------------------- deciding
    def finish(self) -> None:
        if not self.sites:
            return
        tf_keras, settings, helper_calls = self.tf1.keras_pins()
        evidence = version.Evidence(tf_keras, settings, self._keras_2_use(), helper_calls)
        assumed = version.decide(self.file, evidence)
        noted = False
        for site in sorted(self.sites, key=lambda s: s.line):
            if assumed.problem is None and site.either_order and assumed.keras_2:
                site = self._rebound(site)
            ported = self._decide(site, assumed)
            if ported and not noted:
                self.file.report(site.line, registry.KERAS_VERSION, assumed.note)
                noted = True

    def _keras_2_use(self) -> tuple[int, str] | None:
        """The first wrapper call that only Keras 2 runs: the experimental wrapper, tf_keras's
        positional order, a Keras 2 optimizer inside (optimizers.legacy, TensorFlow Addons)."""
        a = self.file
        found = []
        for site in self.sites:
            if site.spelling == "experimental":
                found.append((site.line, f"`{a.code(site.call.func)}`, an API only Keras 2 has"))
            elif site.keras_2_order:
                found.append((site.line, "a bool as second argument (Keras 2's `dynamic`)"))
            inner = _INNER[site.spelling]
            index = 0 if site.either_order else site.bound.get(inner)
            if index is not None and index < len(site.call.args):
                expr = site.call.args[index].value
                if self.tf1.optimizer_flavour(expr) == "keras2":
                    what = _one_line(a.code(expr))
                    found.append((site.line, f"`{what}`, a Keras 2 optimizer"))
        return min(found, default=None)

    def _rebound(self, site: KerasSite) -> KerasSite:
        """An ambiguous positional call bound in Keras 2's order, the file being Keras 2."""
        bound = args_.bind(site.call, ("inner_optimizer", *api.KERAS_2_ORDER), _KEYWORDS)
        if isinstance(bound, str):
            return site
        problem = None if "inner_optimizer" in bound else "the optimizer argument is missing"
        return dataclasses.replace(site, bound=bound, problem=problem, keras_2_order=True)

    def _decide(self, site: KerasSite, assumed: version.KerasVersion) -> bool:
        a = self.file
        what = a.code(site.call.func)
        problem = site.problem or assumed.problem
        if problem is None and site.keras_3_name and assumed.keras_2:
            problem = (
                f"`{what}` exists only in Keras 3, and the rest of the file runs Keras 2 "
                f"({assumed.note.split(';')[0].removeprefix('Keras 2 assumed: ')}); one file "
                "cannot hold both, port it by hand"
            )
        if problem is None:
            problem = _private_state_replaced(site.call, a)
        scale = LossScale("default")
        if problem is None and site.spelling != "keras":
            scale, problem = self._loss_scale(site)
        if problem is not None:
            rule = registry.GRAPH_REWRITE if site.spelling == "graph-rewrite" else RULE
            a.report(site.line, rule, f"`{what}(...)` left unchanged: {problem}", "warning")
            return False
        self._unseen_inner(site, assumed.target)
        if scale.kind == "runtime":
            scale = dataclasses.replace(scale, wrap=self._choice_wrap(site))
        value, why = self.tf1.is_distributed(site.call, keras=True)
        a.port_call(site.call, assumed.target, _builder(site, scale, value))
        if value is not None:
            extra = f", is_distributed={a.code(value)} because {why}"
        else:
            extra = f", no is_distributed because {why}" if why else ""
        rule = registry.GRAPH_REWRITE if site.spelling == "graph-rewrite" else RULE
        target = f"{api.target_module(assumed.target)}.{api.target_class(assumed.target)}"
        message = f"`{what}(...)` -> {target}(...){_detail(site, scale)}{extra}"
        a.report(site.line, rule, message)
        if site.spelling == "graph-rewrite":
            a.report(
                site.line,
                registry.GRAPH_REWRITE,
                f"{api.PORTED_REWRITE_NOTE}; TensorFlow's fp16 graph "
                "rewrite is no longer switched on, so the model computes in float32 unless "
                "the script sets a mixed_float16 dtype policy "
                "(keras.mixed_precision.set_global_policy) or the NPU's precision_mode does",
                "warning",
            )
        return True

    def _choice_wrap(self, site: KerasSite) -> str | None:
        """The indentation of the run-time choice's continuation lines where it would make its
        line longer than the file keeps its lines (migrator.codemods.shared.comments.line_limit),
        else None. The new line is the argument's line with the argument replaced by the choice
        (and the call's name by the class name where it is on that line)."""
        module = self.file.module
        limit = line_limit(module.code) if module is not None else None
        if module is None or limit is None:
            return None
        arg = site.call.args[site.bound["loss_scale"]].value
        row = self.file.line(arg)
        text = module.code.splitlines()[row - 1]
        old = self.file.code(arg)
        grown = width(_choice_text(old)) + len("**") - width(old)
        if self.file.line(site.call) == row:
            grown -= width(self.file.code(site.call.func)) - len("LossScaleOptimizer")
        if width(text) + grown <= limit:
            return None
        indent = text[: len(text) - len(text.lstrip())]
        return indent + module.default_indent

    def _unseen_inner(self, site: KerasSite, target: str) -> None:
        """Warn where the wrapped optimizer's constructor cannot be seen (a parameter, another
        module): one of the other Keras, or a tf.compat.v1 one, fails there."""
        a = self.file
        inner = site.call.args[site.bound[_INNER[site.spelling]]].value
        if self.tf1.optimizer_flavour(inner) is not None:
            return
        if site.spelling != "graph-rewrite" and target != version.KERAS_2_TARGET:
            # Keras's own wrapper, replaced by ours for the same Keras: both take the same
            # optimizers (and reject the same), so the port does not depend on the kind. The
            # graph rewrite is warned: tf.compat.v1's (and TF 1's) also takes v1 optimizers.
            return
        assumed = ""
        if site.spelling == "graph-rewrite":
            assumed = (
                "; taken as a Keras optimizer, the only kind TF 2's "
                "enable_mixed_precision_graph_rewrite takes (the file names no TF 1-only symbol)"
            )
        # Each class raises what its Keras raises for a wrong optimizer: Keras 2 a TypeError,
        # Keras 3 a ValueError (npu_lossscale.keras.checks).
        if target == version.KERAS_2_TARGET:
            takes = (
                "npu_lossscale.keras.keras2.LossScaleOptimizer wraps Keras 2 optimizers only "
                "(tf_keras, tf.keras before TF 2.16 or under TF_USE_LEGACY_KERAS, their "
                "optimizers.legacy, TensorFlow Addons), so it raises TypeError at start-up if "
                "this is a Keras 3 one or a tf.compat.v1 one"
            )
        else:
            takes = (
                "npu_lossscale.keras.LossScaleOptimizer wraps the optimizers of the Keras the "
                "process runs, so it raises at start-up (TypeError under Keras 2, ValueError "
                "under Keras 3) if this is one of the other Keras (tf_keras, optimizers.legacy "
                "or TensorFlow Addons in a Keras 3 process, or the reverse) or a tf.compat.v1 one"
            )
        a.warn(
            inner,
            registry.OPTIMIZER_KIND_UNKNOWN,
            f"cannot see how `{_one_line(a.code(inner))}` is built{assumed}; {takes}",
        )

    def _loss_scale(self, site: KerasSite) -> tuple[LossScale, str | None]:
        """What the `loss_scale` argument maps to, or why it cannot be mapped exactly."""
        index = site.bound.get("loss_scale")
        if index is None:
            if site.spelling == "graph-rewrite":
                return LossScale("default"), None  # its default is "dynamic"
            return LossScale("default"), "the loss_scale argument is missing"
        value = site.call.args[index].value
        text = args_.string_value(value)
        if text is not None:
            if text == "dynamic":
                return LossScale("dynamic"), None
            return LossScale("default"), f"loss_scale={text!r} is not a loss scale TF accepts"
        if args_.is_numeric_literal(value):
            return LossScale("fixed"), None
        a = self.file
        ctor = self.tf1.loss_scale_object(value)
        if ctor is not None and isinstance(value, cst.Name):
            ctor.keras = True  # reported here, with the reason it stays
            what = a.code(ctor.call.func)
            return LossScale("default"), (
                f"its loss scale `{value.value}` is a {what} object bound at line {ctor.line}; "
                "the Keras optimizer keeps the scale itself, so pass its arguments inline, or "
                "port its other uses by hand"
            )
        if ctor is None and not args_.has_call(value) and _is_reference(value):
            return LossScale("runtime"), None
        if ctor is None:
            return LossScale("default"), (
                f"its loss scale `{_one_line(a.code(value))}` is not 'dynamic', a number or a "
                "DynamicLossScale/FixedLossScale built in the call, so what it means is unknown"
            )
        ctor.keras = True  # consumed here: the TF1 port must neither port nor report it
        if ctor.problem is not None:
            return LossScale("default"), f"its `{a.code(ctor.call.func)}(...)`: {ctor.problem}"
        if ctor.kind is Kind.TF_FIXED and "loss_scale_value" not in ctor.bound:
            return LossScale("default"), f"its `{a.code(ctor.call.func)}()` has no value"
        kind = "ctor-dynamic" if ctor.kind is Kind.TF_DYNAMIC else "ctor-fixed"
        return LossScale(kind, dict(ctor.bound)), None


def _private_state_replaced(call: cst.Call, file: FileContext) -> str | None:
    """Why the wrapper built by `call` must stay Keras's: its function (or the module) then
    assigns a private attribute of it (neurst's `opt._loss_scale = RevisedDynamicLossScale(...)`).
    npu_lossscale.keras's class keeps its own state under such names, so the port failed at its
    first step; None where nothing is replaced."""
    statement = file.parent(call)
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return None
    target = statement.targets[0].target
    if not isinstance(target, cst.Name):
        return None
    home: cst.CSTNode | None = statement
    while home is not None and not isinstance(home, (cst.FunctionDef, cst.Module)):
        home = file.parent(home)
    built = file.line(call)
    writes = [
        (file.line(node), file.code(assigned.target))
        for node in (walk(home) if home is not None else ())
        if isinstance(node, cst.Assign)
        for assigned in node.targets
        if isinstance(assigned.target, cst.Attribute)
        and isinstance(assigned.target.value, cst.Name)
        and assigned.target.value.value == target.value
        and assigned.target.attr.value.startswith("_")
        and file.line(node) > built
    ]
    if not writes:
        return None
    line, written = min(writes)
    return (
        f"the script then replaces its private `{written}` (line {line}), where "
        "npu_lossscale.keras's class keeps state of its own, so the port would fail at its "
        "first step; port it by hand, and check what the replacement's overflow test looks "
        "for: if inf/NaN only, it misses the overflows an NPU in saturation mode clamps to 65504"
    )


def _one_line(code: str) -> str:
    return " ".join(code.split())


def _order_from_literals(call: cst.Call) -> tuple[str, ...] | str:
    """Keras 2 or Keras 3 positional order for `tf.keras`/`keras`, which were either: a bool
    second argument is Keras 2's `dynamic`, a number Keras 3's `initial_scale` (Keras 2 refuses
    a number there, Keras 3 a bool)."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if len(positional) < 2:
        return api.KERAS_3_ORDER
    second = positional[1].value
    if isinstance(second, cst.Name) and second.value in ("True", "False"):
        return api.KERAS_2_ORDER
    if args_.is_numeric_literal(second):
        return api.KERAS_3_ORDER
    return (
        "its second positional argument is `dynamic` in Keras 2 and `initial_scale` in Keras 3, "
        "and this one is neither a bool nor a number; pass it by keyword"
    )


def _isinstance_class(node: cst.CSTNode, parent: Parent) -> bool:
    """Whether `node` is the class (or one of a tuple of classes) tested by isinstance(), or by a
    unittest assertion of it (`self.assertIsInstance(x, cls)`)."""
    up = parent(node)
    if isinstance(up, cst.Element):
        up = parent(parent(up))
    call = parent(up) if isinstance(up, cst.Arg) else None
    if not isinstance(call, cst.Call) or len(call.args) < 2 or call.args[1] is not up:
        return False
    func = call.func
    if isinstance(func, cst.Name):
        return func.value in ("isinstance", "issubclass") and len(call.args) == 2
    return isinstance(func, cst.Attribute) and func.attr.value in _TYPE_ASSERTIONS


_TYPE_ASSERTIONS = frozenset({"assertIsInstance", "assertNotIsInstance"})


def _in_annotation(node: cst.CSTNode, parent: Parent) -> bool:
    """Whether `node` is (in) a type annotation (`opt: mixed_precision.LossScaleOptimizer`)."""
    up = parent(node)
    while isinstance(up, cst.BaseExpression) or isinstance(
        up, (cst.SubscriptElement, cst.Index, cst.Element, cst.Arg)
    ):
        up = parent(up)
    return isinstance(up, cst.Annotation)


# The one step a fixed scale runs differently after the port; said wherever a port makes one.
_SKIPPED = (
    "an overflowed step is skipped, as the NPU's FixedLossScaleManager does, where Keras 2's "
    "fixed scale applies it"
)


def _detail(site: KerasSite, scale: LossScale) -> str:
    if site.spelling == "keras":
        notes = [note for note in (_by_keyword(site), _fixed_scale(site)) if note]
        return f" ({'; '.join(notes)})" if notes else ""
    return {
        "default": " (no loss_scale: TF's default 'dynamic' is the default rule)",
        "dynamic": " (loss_scale='dynamic' is the default rule)",
        "fixed": f" (a fixed loss_scale -> initial_scale, dynamic=False; {_SKIPPED})",
        "ctor-dynamic": " (its DynamicLossScale -> initial_scale, dynamic_growth_steps, TF's rule)",
        "ctor-fixed": f" (its FixedLossScale -> initial_scale, dynamic=False; {_SKIPPED})",
        "runtime": (
            " (its loss_scale, 'dynamic' or a number at run time, picks the keywords when the "
            "script runs: 'dynamic' the default rule, a number N initial_scale=N, dynamic=False; "
            f"with a number, {_SKIPPED})"
        ),
    }[scale.kind]


def _by_keyword(site: KerasSite) -> str:
    """Said only where the port moved an argument: a call that passes the optimizer alone, or
    the rest by keyword, is written as it was."""
    inner = _INNER[site.spelling]
    moved = site.keras_2_order and any(
        site.call.args[index].keyword is None
        for param, index in site.bound.items()
        if param != inner
    )
    return "Keras 2 positional arguments now by keyword" if moved else ""


def _fixed_scale(site: KerasSite) -> str:
    """The one step that runs differently after the port: Keras 2's fixed scale applies an
    overflowed step (inf reaches the weights), ours skips it; a reviewer should see it here."""
    index = site.bound.get("dynamic")
    if index is None:
        return ""
    value = site.call.args[index].value
    literal = value.value if isinstance(value, cst.Name) else None
    if literal == "True":
        return ""
    where = "dynamic=False" if literal == "False" else "where `dynamic` is false"
    return f"{where}: {_SKIPPED}"


def _scale_keywords(scale: LossScale, value: cst.BaseExpression) -> list[cst.Arg]:
    """The keywords replacing an experimental `loss_scale=value` (value from the new tree)."""
    if scale.kind in ("default", "dynamic"):
        return []
    if scale.kind == "fixed":
        return [args_.keyword("initial_scale", value), _false("dynamic")]
    if scale.kind == "runtime":
        return [_runtime_choice(value, scale.wrap)]
    assert isinstance(value, cst.Call)
    given = {name: value.args[i].value for name, i in scale.ctor_bound.items()}
    if scale.kind == "ctor-fixed":
        return [args_.keyword("initial_scale", given["loss_scale_value"]), _false("dynamic")]
    out = []
    if "initial_loss_scale" in given:
        out.append(args_.keyword("initial_scale", given["initial_loss_scale"]))
    if "increment_period" in given:
        out.append(args_.keyword("dynamic_growth_steps", given["increment_period"]))
    multiplier = given.get("multiplier")
    if multiplier is not None and args_.number_value(multiplier) != 2.0:
        out.append(args_.keyword("incr_ratio", multiplier))
        out.append(args_.keyword("decr_ratio", args_.reciprocal(multiplier)))
    return out


def _is_reference(node: cst.BaseExpression) -> bool:
    """A name, `a.b.c` or `a[b]` chain: cheap and safe to read twice."""
    if isinstance(node, cst.Name):
        return node.value not in ("None", "True", "False")
    if isinstance(node, cst.Attribute):
        return _is_reference(node.value)
    if isinstance(node, cst.Subscript):
        return _is_reference(node.value)
    return False


def _choice_text(code: str) -> str:
    """The run-time choice for the argument `code`, on one line, without its `**`: from the
    template templates/keras_loss_scale_choice.py.tmpl."""
    text = template_files.read(_CHOICE_TEMPLATE)
    line = next(s for s in text.splitlines() if s.strip() and not s.startswith("#"))
    return line.strip().removeprefix("**").format(value=code, q='"')


def _runtime_choice(value: cst.BaseExpression, wrap: str | None = None) -> cst.Arg:
    """`**({} if v == "dynamic" else {"initial_scale": v, "dynamic": False})`; where `wrap` is
    given, broken after the parenthesis and before `else`, its lines indented by `wrap`."""
    expr = cst.parse_expression(_choice_text(cst.Module([]).code_for_node(value)))
    if wrap is not None and isinstance(expr, cst.IfExp):
        broken = cst.ParenthesizedWhitespace(last_line=cst.SimpleWhitespace(wrap))
        expr = expr.with_changes(
            lpar=[cst.LeftParen(whitespace_after=broken)], whitespace_before_else=broken
        )
    return cst.Arg(value=expr, star="**")


def _false(name: str) -> cst.Arg:
    return args_.keyword(name, cst.Name("False"))


def _builder(site: KerasSite, scale: LossScale, value: cst.BaseExpression | None) -> Builder:
    by_index = {i: name for name, i in site.bound.items()}
    inner = _INNER[site.spelling]

    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        out = list(arguments)
        # Right to left, so that replacing one argument by several keeps the others' indexes.
        for index in sorted(by_index, reverse=True):
            param, arg = by_index[index], out[index]
            if param == inner:
                if arg.keyword is not None:
                    out[index] = args_.renamed(arg, "inner_optimizer")
            elif param == "loss_scale":
                out = args_.replace_argument(out, index, _scale_keywords(scale, arg.value))
            elif param in _NONE_MEANS_DEFAULT and _is_none(arg.value):
                out = args_.replace_argument(out, index, [])
            elif arg.keyword is None and site.keras_2_order:
                out = args_.replace_argument(out, index, [args_.keyword(param, arg.value)])
        if value is not None:
            out = args_.append_keyword(out, "is_distributed", value.deep_clone())
        return out

    return build


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"
