"""Where a step function applies its optimizer, and which classes that optimizer is made of.

Every `apply_gradients`/`minimize` call must receive the step (or be able to: the name bound
before the call); the optimizer is followed back through `opt = Wrapper(opt, ...)` to the
classes it is built from, so the plan can check each of them takes the increment.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ScopeProvider

from migrator.codemods.global_step.exprs import argument, name_of, positional
from migrator.codemods.global_step.model import CallSite, StepFunction
from migrator.codemods.global_step.names import is_optimizer_wrapper
from migrator.codemods.global_step.reading import StepProblem, StepReader
from migrator.codemods.global_step.tree import collect

_APPLY_METHODS = {"apply_gradients": 1, "minimize": 1}  # method -> global_step position


class OptimizerTracing:
    """Reads one function at a time with the analysis's `reader`."""

    def __init__(self, reader: StepReader) -> None:
        self.reader = reader

    def call_sites(self, fn: cst.FunctionDef, info: StepFunction) -> None:
        for call in collect(fn.body, cst.Call, enter_defs=True):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in _APPLY_METHODS:
                continue
            passed = argument(call, _APPLY_METHODS[func.attr.value], "global_step")
            if passed is not None and name_of(passed) != info.step:
                raise StepProblem(
                    f"`{func.attr.value}` receives `{self.reader.code(passed)}` as "
                    f"global_step, not `{info.step}`",
                    self.reader.line(call),
                )
            if passed is None and self._bound_only_after(call, info.step):
                raise StepProblem(
                    f"`{info.step}` is assigned only after `{func.attr.value}` is called, so it "
                    "cannot be passed there",
                    self.reader.line(call),
                )
            info.call_sites.append(CallSite(call, passed is not None, self.reader.line(call)))
        if not info.call_sites:
            raise StepProblem("cannot find the apply_gradients/minimize call it builds", info.line)

    def _bound_only_after(self, call: cst.Call, name: str) -> bool:
        """Whether `name` is local where `call` runs and bound only further down: passing it
        there would raise UnboundLocalError. (A global, or a local bound earlier, is fine.)"""
        scope = self.reader.get_metadata(ScopeProvider, call.func, None)
        if scope is None:
            return False
        local = list(scope.assignments[name])
        line = self.reader.line(call)
        return bool(local) and all(self.reader.line(a.node) >= line for a in local)

    def optimizers(self, info: StepFunction, fn: cst.FunctionDef, assigns: dict) -> None:
        seen: set[str] = set()
        for site in info.call_sites:
            receiver = site.call.func.value  # type: ignore[attr-defined]
            if isinstance(receiver, cst.Call):  # `MyOptimizer(...).minimize(loss)`
                self._trace_value(receiver, "", assigns, seen, info)
                continue
            if not isinstance(receiver, cst.Name):
                raise StepProblem(
                    f"cannot tell which optimizer `{self.reader.code(receiver)}` is",
                    site.line,
                )
            self._trace(receiver.value, assigns, seen, info, site.line)

    def _trace(
        self, name: str, assigns: dict, seen: set[str], info: StepFunction, line: int
    ) -> None:
        """Follow `opt = Wrapper(opt, ...)` back to the classes the optimizer is made from."""
        if name in seen:
            return
        seen.add(name)
        values = assigns.get(name, [])
        if not values or any(v is None for v in values):
            raise StepProblem(
                f"the optimizer `{name}` comes from outside the function, so its class is unknown",
                line,
            )
        for value in values:
            self._trace_value(value, name, assigns, seen, info)

    def _trace_value(
        self,
        value: cst.BaseExpression,
        name: str,
        assigns: dict,
        seen: set[str],
        info: StepFunction,
    ) -> None:
        if not isinstance(value, cst.Call):
            raise StepProblem(
                f"cannot tell the class of `{self.reader.code(value)}`",
                self.reader.line(value),
            )
        inner = positional(value)[:1]
        if inner and (
            name_of(inner[0]) == name or is_optimizer_wrapper(self.reader.qnames(value.func))
        ):
            if isinstance(inner[0], cst.Name):
                self._trace(inner[0].value, assigns, seen, info, self.reader.line(value))
            else:
                self._trace_value(inner[0], name, assigns, seen, info)
            return
        info.optimizers.append(self.reader.ref(value.func))
