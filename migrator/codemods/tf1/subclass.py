"""Subclasses of a tf.contrib loss-scale class that cannot simply be rebased on npu_lossscale."""

from __future__ import annotations

import libcst as cst

from migrator import registry
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.nodes import code, walk


def incompatible_subclass(file: FileContext, base: cst.CSTNode) -> bool:
    """Whether ``base`` is the base of a class that cannot simply be rebased on npu_lossscale.

    The NPU classes keep their state and their step logic elsewhere than tf.contrib's: a
    subclass that overrides the step (apply_gradients, compute_gradients, update_loss_scale,
    get_loss_scale), skips the base __init__, or reads the base's private attributes
    (`self._opt`, `self._loss_scale`...) would fail at graph build, or bypass the overflow
    check, once rebased. Such a class is left as it is, with a warning naming the reason.
    """
    arg = file.parent(base)
    cls = file.parent(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(cls, cst.ClassDef) or arg not in cls.bases:
        return False
    reason = _subclass_problem(cls)
    if reason is None:
        return False
    file.warn(
        cls,
        registry.SUBCLASS_OVERRIDE,
        f"class {cls.name.value} subclasses `{code(base)}` and {reason}; the npu_lossscale "
        "class works differently inside, so the subclass was left unchanged: port it by hand",
    )
    return True


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
