"""What a file shows of its Keras and TensorFlow generation, and its mixed_float16 policies.

Which port an optimizer of unseen kind goes to depends on the file's generation (Keras names or
model.compile/fit calls; TF 1-only symbols). Which Keras a ported file runs is read here too:
an import of tf_keras, and a TF_USE_LEGACY_KERAS the file sets (with which tf.keras is Keras 2),
also inside a helper function of the file, and the calls of functions other files of the run
define that set it (`migrator.selection.keras_helpers`); `keras.version` decides from them.
A global mixed_float16 policy with no LossScaleOptimizer named anywhere is warned in `finish`:
Keras then wraps the compiled optimizer in its own, whose inf/NaN check misses an NPU's saturated
overflows.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import code, last_name
from migrator.selection.keras_helpers import KerasHelper


class KerasFacts:
    """Collects while the file is walked; `finish` warns about implicit loss scaling."""

    def __init__(
        self,
        file: FileContext,
        helpers: frozenset[KerasHelper] = frozenset(),
        loss_scale_modules: frozenset[str] = frozenset(),
    ) -> None:
        self.file = file
        self._helpers = {(h.module, h.function): h for h in helpers}
        # the run's modules that build a LossScaleOptimizer, and whether this file imports one
        # (the optimizer it trains with may be wrapped there: Dreamer's tools.Optimizer)
        self._loss_scale_modules = loss_scale_modules
        self.imports_loss_scale_module = False
        # model.compile(optimizer) here, its optimizer built by a function of such a module
        # (graphcore's `compile(optimizer=get_optimizer(...))`) or not, and fit() here
        self.wrapped_compiles = 0
        self.unwrapped_compiles = 0
        self.fits = False
        # what the file shows of its TensorFlow generation, for inner optimizers whose kind
        # cannot be seen: Keras names or model.compile/fit calls; TF 1-only symbols
        self.uses_keras = False
        self.uses_v1 = False
        # where the file first names tf_keras, and where it sets TF_USE_LEGACY_KERAS (with the
        # value: True for "1"/"true", False for "0"/"false", None when chosen at run time)
        self.tf_keras: cst.CSTNode | None = None
        self.legacy_settings: list[tuple[cst.CSTNode, bool | None]] = []
        # calls of those functions of other files (the call, the function)
        self.helper_calls: list[tuple[cst.CSTNode, KerasHelper]] = []
        # global mixed_float16 policies set here, and whether any LossScaleOptimizer is named
        # (setter, surely fp16, the Policy's own loss_scale argument)
        self.fp16_policies: list[tuple[cst.Call, bool, cst.BaseExpression | None]] = []
        self.names_lso = False
        # a program of its own (`if __name__ == "__main__"`) that shows no training at all
        # (an evaluation script) never compiles an optimizer for Keras to wrap
        self.entry_script = False
        self.trains = False

    def saw(self, name: str, node: cst.CSTNode) -> None:
        """A reference the walk resolved to the imported qualified `name`."""
        if self.tf_keras is None and (name == "tf_keras" or name.startswith("tf_keras.")):
            self.tf_keras = node
        if api.mentions_keras(name):
            self.uses_keras = True
        if api.is_tf1_signal(name):
            self.uses_v1 = True
        if name.endswith("LossScaleOptimizer"):
            self.names_lso = True
        if ".optimizers." in name or name.endswith(".GradientTape"):
            self.trains = True
        module, _, function = name.rpartition(".")
        helper = self._helpers.get((module.rpartition(".")[2], function))
        call = self.file.parent(node)
        if helper is not None and isinstance(call, cst.Call) and call.func is node:
            self.helper_calls.append((call, helper))

    def visit_Call(self, node: cst.Call) -> None:
        func = self.file.canonical(node.func)
        keras_call = _is_keras_training_call(node, imported=func is not None)
        if keras_call and isinstance(node.func, cst.Attribute):
            if node.func.attr.value != "compile":
                self.fits = True
            elif self._built_by_loss_scale_module(_compiled_optimizer(node)):
                self.wrapped_compiles += 1
            else:
                self.unwrapped_compiles += 1
        if func is None and keras_call:
            self.uses_keras = True
        if keras_call or _is_training_step(node) or _names_training(node):
            self.trains = True
        if func is not None and api.is_policy_setter(func):
            fp16, loss_scale = self._fp16_policy(node)
            if fp16 is not None:
                self.fp16_policies.append((node, fp16, loss_scale))

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._imported(last_name(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None:  # `from pkg.tools import Optimizer`
            self._imported(last_name(node.module))
        if not isinstance(node.names, cst.ImportStar):  # `from pkg import tools`
            for alias in node.names:
                self._imported(last_name(alias.name))

    def _built_by_loss_scale_module(self, value: cst.BaseExpression | None) -> bool:
        """Whether `value` (or the one value a name was given) is a call of a function imported
        from a module of the run that builds a LossScaleOptimizer."""
        if isinstance(value, cst.Name):
            assigned = [self.file.assigned_value(a) for a in self.file.assignments(value)]
            value = assigned[0] if len(assigned) == 1 else None
        if not isinstance(value, cst.Call):
            return False
        name = self.file.canonical(value.func)
        module = name.rpartition(".")[0].rpartition(".")[2] if name else ""
        return module in self._loss_scale_modules

    def _imported(self, module: str | None) -> None:
        if module is not None and module in self._loss_scale_modules:
            self.imports_loss_scale_module = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        raw = node.value
        if "\\" not in raw and "__main__" not in raw and "TF_USE_LEGACY_KERAS" not in raw:
            return  # spelled out as written: no need to evaluate each of the file's strings
        text = args_.string_value(node)
        if text == "__main__":
            self.entry_script = True
        if text == "TF_USE_LEGACY_KERAS":
            setting = _legacy_setting(node, self.file.parent)
            if setting is not None:
                self.legacy_settings.append(setting)

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

    def finish(self) -> None:
        """A global mixed_float16 policy makes Keras wrap the optimizer of model.compile() in its
        own LossScaleOptimizer, whose inf/NaN check cannot see an NPU's saturated overflows;
        nothing in such a file names a loss-scale API to port, so it would pass unremarked. Not
        where the file trains by hand (no compile or fit of its own) with what it imports from a
        module of the run that builds a LossScaleOptimizer (Dreamer's tools.Optimizer): that is
        most likely wrapped there; nor where every compile() here is given an optimizer that a
        function of such a module builds (graphcore's `get_optimizer()`). HanLP's parser also
        imports such a helper, but its fit() compiles other optimizers too, which Keras wraps:
        warned."""
        keras_trains = self.unwrapped_compiles or (self.fits and not self.wrapped_compiles)
        if self.names_lso or (self.imports_loss_scale_module and not keras_trains):
            return
        if self.entry_script and not self.trains:
            return
        for call, surely, loss_scale in self.fp16_policies:
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
                registry.KERAS_IMPLICIT_LOSS_SCALE,
                f"{policy} Keras wrap the optimizer of model.compile() in "
                "its own LossScaleOptimizer, whose inf/NaN check misses an NPU's saturated "
                "overflows (saturation mode); unless it is wrapped elsewhere, wrap it yourself: "
                "`model.compile(optimizer=npu_lossscale.keras.LossScaleOptimizer(opt), ...)` "
                f"with an optimizer object (not a string), which Keras then leaves as it is{keep}",
            )


_TRUE = ("1", "true", "True")  # the spellings TensorFlow reads as "use tf_keras"
_SETTERS = ("setdefault", "putenv", "__setitem__")


def _legacy_setting(
    key: cst.SimpleString, parent: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> tuple[cst.CSTNode, bool | None] | None:
    """(statement, value) where the string "TF_USE_LEGACY_KERAS" is the key of a setting of the
    environment -- `os.environ[KEY] = v`, `os.environ.setdefault(KEY, v)`, `os.putenv(KEY, v)`,
    `os.environ.update({KEY: v})` -- else None (a read, a message)."""
    up = parent(key)
    value: cst.BaseExpression | None = None
    if isinstance(up, cst.Index):
        subscript = parent(parent(up))
        target = parent(subscript)
        assign = parent(target)
        if isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign):
            value, up = assign.value, assign
    elif isinstance(up, cst.Arg):
        call = parent(up)
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in _SETTERS
            and len(call.args) == 2
            and call.args[0] is up
        ):
            value, up = call.args[1].value, call
    elif isinstance(up, cst.DictElement) and up.key is key:
        value = up.value
    if value is None or up is None:
        return None
    text = args_.string_value(value)
    if text is None:
        return up, None
    return up, text in _TRUE


def _is_training_step(call: cst.Call) -> bool:
    """`opt.apply_gradients(...)`, `opt.minimize(...)`: a training step by hand."""
    func = call.func
    return isinstance(func, cst.Attribute) and func.attr.value in ("apply_gradients", "minimize")


def _names_training(call: cst.Call) -> bool:
    """`model_lib.build_and_fit()`, `fit_model()`: an entry script that trains with Keras's fit
    through its project's own function, whose compile() this file cannot see. A project's own
    `train()` is most often a custom loop (CalciumGAN's main.py), which Keras never wraps."""
    name = last_name(call.func)
    return name is not None and "fit" in name.lower().split("_")


def _compiled_optimizer(call: cst.Call) -> cst.BaseExpression | None:
    """The optimizer a `model.compile(...)` call is given."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "optimizer":
            return arg.value
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None else None


def _is_keras_training_call(call: cst.Call, imported: bool) -> bool:
    """`model.compile(optimizer=...)`, `model.compile("adam", "mse")`, `model.fit(...)`: Keras's
    training API on a value. `compile` with no optimizer compiles for metrics only; a positional
    first argument is the optimizer unless the callee is an import's (`re.compile(pattern)`)."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value == "compile":
        first = call.args[0] if call.args else None
        positional = first is not None and first.keyword is None and not first.star
        return (positional and not imported) or any(
            arg.keyword is not None and arg.keyword.value == "optimizer" for arg in call.args
        )
    return func.attr.value in ("fit", "fit_generator", "train_on_batch")
