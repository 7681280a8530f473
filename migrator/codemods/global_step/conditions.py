"""When the moved increment may advance the step: the update's own condition must be one the
loss-scale optimizer's apply_gradients already holds to (all gradients finite).

`step + 1` always qualifies; `tf.cond(finite, lambda: step + 1, lambda: step)` where `finite` is
a reduction of tf.is_finite over the gradients (also accumulated over micro-batches or summed
with Horovod's allreduce), or that flag and the predicate of the tf.cond applying the optimizer.
"""

from __future__ import annotations

import libcst as cst

from migrator.codemods.global_step.exprs import (
    argument,
    is_plus_one,
    is_true_constant,
    lambda_body,
    name_of,
    positional,
)
from migrator.codemods.global_step.names import is_tf_function
from migrator.codemods.global_step.reading import StepProblem, StepReader

_FINITE_COMBINERS = ("reduce_all", "logical_and", "cast", "identity", "stop_gradient", "stack")


class StepConditions:
    """`update_predicates`: names used as the predicate of a tf.cond in the function being read
    (set by the analysis for each function)."""

    def __init__(self, reader: StepReader) -> None:
        self.reader = reader
        self.update_predicates: set[str] = set()

    def check_new_step(
        self, value: cst.BaseExpression, step: str, assigns: dict[str, list], line: int
    ) -> None:
        """Accept `step + 1`, or `tf.cond(finite, lambda: step + 1, lambda: step)`."""
        if is_plus_one(value, step):
            return
        if isinstance(value, cst.Call) and is_tf_function(self.reader.qnames(value.func), "cond"):
            pred = argument(value, 0, "pred")
            then = lambda_body(argument(value, 1, "true_fn"))
            other = lambda_body(argument(value, 2, "false_fn"))
            if (
                pred is not None
                and then is not None
                and is_plus_one(then, step)
                and (name_of(other) == step)
            ):
                if self.is_finite_flag(pred, assigns, set()):
                    return
                if self._is_update_and_finite(pred, assigns):
                    return
                raise StepProblem(
                    f"the step advances only when `{self.reader.code(pred)}` holds, "
                    "which is not a gradient-finiteness check",
                    line,
                )
        raise StepProblem(
            f"the new step `{self.reader.code(value)}` is neither `{step} + 1` nor "
            f"`tf.cond(<all gradients finite>, lambda: {step} + 1, lambda: {step})`",
            line,
        )

    def _is_update_and_finite(self, pred: cst.BaseExpression, assigns: dict[str, list]) -> bool:
        """`logical_and(update_step, finite)` with gradient accumulation (NVIDIA's BERT): the
        step advances when this micro-batch applies the update and the accumulated gradients
        were finite; `update_step` is the predicate of the tf.cond that applies the optimizer.
        Inside apply_gradients, which the loss-scale optimizer runs only on clean updates, the
        moved increment advances under exactly that condition."""
        if not isinstance(pred, cst.Call) or not is_tf_function(
            self.reader.qnames(pred.func), "logical_and"
        ):
            return False
        inputs = positional(pred)
        if len(inputs) != 2:
            return False
        for update, finite in (inputs, inputs[::-1]):
            if name_of(update) in self.update_predicates and self.is_finite_flag(
                finite, assigns, set()
            ):
                return True
        return False

    def is_finite_flag(self, expr: cst.BaseExpression, assigns: dict[str, list], seen: set) -> bool:
        """True when `expr` is a reduction of `tf.is_finite` over gradients (or constant True).

        Accumulated flags count too: a bool variable that starts True and is re-assigned
        `logical_and(itself, finite)` on every micro-batch (its own earlier value is finite by
        induction), possibly summed over workers with Horovod's allreduce.
        """
        if isinstance(expr, cst.Name):
            if expr.value in seen:
                return True  # the accumulator's previous value, finite by induction
            values = assigns.get(expr.value)
            if not values or any(v is None for v in values):
                return False
            return all(self.is_finite_flag(v, assigns, seen | {expr.value}) for v in values)
        if is_true_constant(expr, self.reader.qnames):
            return True
        if isinstance(expr, cst.IfExp):
            return all(
                is_true_constant(e, self.reader.qnames) or self.is_finite_flag(e, assigns, seen)
                for e in (expr.body, expr.orelse)
            )
        if isinstance(expr, (cst.List, cst.Tuple)):
            return bool(expr.elements) and all(
                self.is_finite_flag(e.value, assigns, seen) for e in expr.elements
            )
        if isinstance(expr, cst.ListComp):
            return self.is_finite_flag(expr.elt, assigns, seen)
        if not isinstance(expr, cst.Call):
            return False
        names = self.reader.qnames(expr.func)
        if is_tf_function(names, "is_finite"):
            return True
        if is_tf_function(names, "cond"):
            branches = [
                lambda_body(argument(expr, i, k)) for i, k in ((1, "true_fn"), (2, "false_fn"))
            ]
            return all(b is not None and self.is_finite_flag(b, assigns, seen) for b in branches)
        if is_tf_function(names, "get_variable", "Variable"):
            initial = argument(expr, 99, "initializer") or argument(expr, 0, "initial_value")
            return initial is not None and (
                is_true_constant(initial, self.reader.qnames)
                or (
                    isinstance(initial, (cst.Name, cst.Attribute, cst.Call))
                    and "ones_initializer" in self.reader.code(initial)
                )
            )
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "assign":
            return name_of(expr.func.value) in seen and self.is_finite_flag(
                argument(expr, 0, "value"), assigns, seen
            )
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "allreduce":
            # Horovod's, often through a parameter (`hvd=None`) that no import resolves
            value = argument(expr, 0, "tensor")
            return value is not None and self.is_finite_flag(value, assigns, seen)
        if not is_tf_function(names, *_FINITE_COMBINERS):
            return False
        inputs = positional(expr)
        if is_tf_function(names, "logical_and"):
            return len(inputs) == 2 and all(self.is_finite_flag(e, assigns, seen) for e in inputs)
        return bool(inputs) and self.is_finite_flag(inputs[0], assigns, seen)
