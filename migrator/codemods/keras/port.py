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

Whatever cannot be mapped exactly is left as written, with a warning that says why. Sites are
collected while the TF1 analysis walks the file and decided in `finish`, once every loss-scale
object of the file has been seen; `is_distributed=` is the TF1 port's decision for the same call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import libcst as cst

from migrator.codemods.shared import api, rules
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import Parent
from migrator.codemods.shared.plan import Builder
from migrator.codemods.tf1.sites import LossScaleObject

RULE = rules.KERAS_LOSS_SCALE_OPTIMIZER
TARGET = f"{api.KERAS_MODULE}.LossScaleOptimizer"
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


@dataclasses.dataclass(frozen=True)
class LossScale:
    """What a `loss_scale` argument maps to; the keywords themselves are built from the
    transformed call (the argument itself, or the arguments of the inline loss-scale object at
    the indexes in `ctor_bound`)."""

    kind: str  # "default" | "dynamic" | "fixed" | "ctor-dynamic" | "ctor-fixed"
    ctor_bound: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Tf1Facts:
    """What the Keras port asks of the TF1 analysis of the same file, and nothing more: the kind of
    an optimizer expression, the loss-scale object an argument names, `is_distributed=` for a
    call (the TF1 port's decision, asked with keras=True), and whether the file names
    TF_USE_LEGACY_KERAS (known once the file has been read)."""

    optimizer_flavour: Callable[[cst.BaseExpression], str | None]
    loss_scale_object: Callable[[cst.BaseExpression], LossScaleObject | None]
    is_distributed: Callable[..., tuple[cst.BaseExpression | None, str]]
    legacy_keras: Callable[[], bool]


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
            self.sites.append(KerasSite(call, "keras", a.line(call), {}, order))
            return
        bound = args_.bind(call, ("inner_optimizer", *order), _KEYWORDS)
        self._add(call, "keras", bound, keras_2_order=order == api.KERAS_2_ORDER)

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
        keras_3 = kind is Kind.KERAS_OPTIMIZER and api.keras_order(name) != api.KERAS_2_ORDER
        if keras_3 and _isinstance_class(node, a.parent):
            # npu_lossscale.keras.LossScaleOptimizer subclasses Keras 3's class: still true.
            return
        what = a.code(node)
        if _isinstance_class(node, a.parent):
            reason = (
                f"npu_lossscale.keras.LossScaleOptimizer subclasses Keras 3's "
                f"keras.mixed_precision.LossScaleOptimizer, not `{what}`, so this isinstance() "
                "test is false for it; test against keras.mixed_precision.LossScaleOptimizer"
            )
        else:
            reason = (
                f"`{what}` is used as a value (subclassed, stored or passed), not constructed; "
                "port this use to npu_lossscale.keras.LossScaleOptimizer by hand"
            )
        a.warn(node, rules.UNPORTED_API, reason)

    # ----------------------------------------------------------------- deciding
    def finish(self) -> None:
        for site in self.sites:
            self._decide(site)

    def _decide(self, site: KerasSite) -> None:
        a = self.file
        what = a.code(site.call.func)
        problem = site.problem
        if problem is None:
            problem = self._inner_problem(site)
        scale = LossScale("default")
        if problem is None and site.spelling != "keras":
            scale, problem = self._loss_scale(site)
        if problem is not None:
            rule = rules.GRAPH_REWRITE if site.spelling == "graph-rewrite" else RULE
            a.report(site.line, rule, f"`{what}(...)` left unchanged: {problem}", "warning")
            return
        self._unseen_inner(site)
        value, why = self.tf1.is_distributed(site.call, keras=True)
        a.port_call(site.call, api.KERAS_OPTIMIZER, _builder(site, scale, value))
        if value is not None:
            extra = f", is_distributed={a.code(value)} because {why}"
        else:
            extra = f", no is_distributed because {why}" if why else ""
        rule = rules.GRAPH_REWRITE if site.spelling == "graph-rewrite" else RULE
        message = f"`{what}(...)` -> {TARGET}(...){_detail(site, scale)}{extra}"
        a.report(site.line, rule, message)
        if site.spelling == "graph-rewrite":
            a.report(
                site.line,
                rules.GRAPH_REWRITE,
                f"{api.PORTED_REWRITE_NOTE}; TensorFlow's fp16 graph "
                "rewrite is no longer switched on, so the model computes in float32 unless "
                "the script sets a mixed_float16 dtype policy "
                "(keras.mixed_precision.set_global_policy) or the NPU's precision_mode does",
                "warning",
            )

    def _unseen_inner(self, site: KerasSite) -> None:
        """Warn where the wrapped optimizer's constructor cannot be seen (a parameter, another
        module): a Keras 2 one (tf_keras, optimizers.legacy, TensorFlow Addons) fails there."""
        a = self.file
        inner = site.call.args[site.bound[_INNER[site.spelling]]].value
        if self.tf1.optimizer_flavour(inner) is not None:
            return
        assumed = ""
        if site.spelling == "graph-rewrite":
            assumed = (
                "; taken as a Keras optimizer, the only kind TF 2's "
                "enable_mixed_precision_graph_rewrite takes (the file names no TF 1-only symbol)"
            )
        a.warn(
            inner,
            rules.OPTIMIZER_KIND_UNKNOWN,
            f"cannot see how `{_one_line(a.code(inner))}` is built{assumed}; "
            "npu_lossscale.keras.LossScaleOptimizer wraps Keras 3 optimizers only, so it raises "
            "ValueError at start-up if this is a Keras 2 one (tf_keras, optimizers.legacy, "
            "TensorFlow Addons) or a tf.compat.v1 one",
        )

    def _inner_problem(self, site: KerasSite) -> str | None:
        """Why the wrapped optimizer cannot go into npu_lossscale.keras.LossScaleOptimizer: a Keras
        2 optimizer there raises ValueError at construction (it subclasses Keras 3's wrapper)."""
        a = self.file
        if self.tf1.legacy_keras():
            return (
                "the file names TF_USE_LEGACY_KERAS, with which tf.keras is Keras 2 (tf_keras), "
                "and npu_lossscale.keras.LossScaleOptimizer wraps Keras 3 optimizers only "
                "(ValueError at start-up); drop that setting and run npu-migrate again, or port "
                "it by hand"
            )
        inner = site.call.args[site.bound[_INNER[site.spelling]]].value
        if self.tf1.optimizer_flavour(inner) != "keras2":
            return None
        return (
            f"`{_one_line(a.code(inner))}` is, or may be, a Keras 2 optimizer (tf_keras, "
            "optimizers.legacy or TensorFlow Addons), and npu_lossscale.keras.LossScaleOptimizer "
            "wraps Keras 3 optimizers only (ValueError at start-up); port the optimizer to "
            "keras.optimizers first, then run npu-migrate again"
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
    """Whether `node` is the class (or one of a tuple of classes) tested by isinstance()."""
    up = parent(node)
    if isinstance(up, cst.Element):
        up = parent(parent(up))
    call = parent(up) if isinstance(up, cst.Arg) else None
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value in ("isinstance", "issubclass")
        and len(call.args) == 2
        and call.args[1] is up
    )


def _detail(site: KerasSite, scale: LossScale) -> str:
    if site.spelling == "keras":
        return " (Keras 2 positional arguments now by keyword)" if site.keras_2_order else ""
    return {
        "default": " (no loss_scale: TF's default 'dynamic' is the default rule)",
        "dynamic": " (loss_scale='dynamic' is the default rule)",
        "fixed": (
            " (a fixed loss_scale -> initial_scale, dynamic=False; an overflowed step is skipped, "
            "as the NPU's FixedLossScaleManager does)"
        ),
        "ctor-dynamic": " (its DynamicLossScale -> initial_scale, dynamic_growth_steps, TF's rule)",
        "ctor-fixed": " (its FixedLossScale -> initial_scale, dynamic=False; overflows skip)",
    }[scale.kind]


def _scale_keywords(scale: LossScale, value: cst.BaseExpression) -> list[cst.Arg]:
    """The keywords replacing an experimental `loss_scale=value` (value from the new tree)."""
    if scale.kind in ("default", "dynamic"):
        return []
    if scale.kind == "fixed":
        return [args_.keyword("initial_scale", value), _false("dynamic")]
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
