"""What the TF1 analysis records about each loss-scale object and each wrapped optimizer.

A record is filled while the file is walked and completed when the whole file has been read (its
consumers, its manager, whether it is ported); the Keras port reads the loss-scale objects it is
handed inline, so the records live here rather than in either analysis.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
from libcst.metadata import Assignment

from migrator.codemods.shared.api import Kind
from migrator.codemods.shared.plan import Builder


@dataclasses.dataclass
class LossScaleObject:
    """A `DynamicLossScale(...)`/`FixedLossScale(...)` call: how it binds, who uses it."""

    call: cst.Call
    kind: Kind
    line: int
    problem: str | None
    build: Builder | None
    bound: dict[str, int] = dataclasses.field(default_factory=dict)
    variable: Assignment | None = None
    consumers: list[WrappedOptimizer] = dataclasses.field(default_factory=list)
    ported: bool = False
    keras: bool = False  # an inline loss scale the Keras port maps into its optimizer's keywords


@dataclasses.dataclass
class WrappedOptimizer:
    """A TF loss-scale optimizer or graph-rewrite call, and the manager its port passes."""

    call: cst.Call
    kind: Kind
    line: int
    problem: str | None
    bound: dict[str, int]
    manager: str = ""  # "dynamic" | "fixed" | "ctor" | "default"
    ctor: LossScaleObject | None = None
    keras: bool = False  # left because it wraps a Keras optimizer
    unknown: cst.BaseExpression | None = None  # the inner optimizer, where its kind is unseen
