"""What the global-step analysis finds in a module, as plain records the plan and the edit read.

The records keep references to the tree's own nodes (so `rewrite` edits exactly the statements that
were inspected); `plan.scan` projects them onto picklable facts.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst

NEW_STEP = "new_global_step"  # the name the templates give the step being made

RefKind = Literal["local", "import", "builtin", "unknown"]
# "inserted": it advances the step by the increment npu-migrate inserts (its comment says so), so a
# function still advancing the step outside is the other half of a move left half-applied.
ClassState = Literal["insertable", "inserted", "advances", "follows_bases", "unsupported"]


@dataclasses.dataclass(frozen=True)
class OptimizerRef:
    """Where an optimizer (or a base class) comes from, as written in one file."""

    kind: RefKind
    module: str  # dotted module of an import (may start with dots); "" otherwise
    name: str  # class name
    text: str  # the expression as written, for messages
    line: int


@dataclasses.dataclass
class Increment:
    """One hand-made `global_step` update: the statements that compute and assign it."""

    statements: list[cst.BaseStatement]  # source order, all in one block, the group last
    replacement: cst.BaseStatement | None  # `T = first` when `T = tf.group(first, ...)`, T != first
    line: int


@dataclasses.dataclass
class CallSite:
    call: cst.Call
    step_passed: bool
    line: int


@dataclasses.dataclass
class StepFunction:
    key: str
    name: str
    line: int
    step: str = "global_step"
    increments: list[Increment] = dataclasses.field(default_factory=list)
    call_sites: list[CallSite] = dataclasses.field(default_factory=list)
    optimizers: list[OptimizerRef] = dataclasses.field(default_factory=list)
    problem: str | None = None
    problem_line: int = 0
    # False: it builds no loss-scale optimizer, so its update stays; it is traced only so that
    # no class it shares gains an increment (its step would then advance twice).
    scaled: bool = True
    op_name: str | None = None  # `tf.identity(new_step, name="...")` in the removed update


@dataclasses.dataclass
class OptimizerClass:
    name: str
    line: int
    state: ClassState
    reason: str = ""
    bases: list[OptimizerRef] = dataclasses.field(default_factory=list)
    apply: cst.FunctionDef | None = None
    return_line: int = 0
    step_param: str = "global_step"
    list_name: str = ""
    tf_alias: str = ""
    # Loads of the step parameter in apply_gradients (not its `is None` tests): the update reads
    # the step it makes, so these read `new_global_step` once the increment moves in.
    step_reads: list[cst.Name] = dataclasses.field(default_factory=list)
    # A local that shadows the step parameter before any read of it (NEZHA's LAMB rebinds
    # `global_step` to the variable's value + 1): its new name and its Name nodes, renamed so the
    # increment moved in advances the parameter.
    shadow: tuple[str, list[cst.Name]] | None = None


@dataclasses.dataclass
class ModuleAnalysis:
    step_functions: list[StepFunction]
    classes: dict[str, OptimizerClass]
    loss_scale_lines: list[int]  # where the module builds a loss-scale optimizer at all
    unscaled_steps: list[tuple[str, int]]  # functions updating global_step with no loss scaling
