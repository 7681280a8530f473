"""Argument builders of the TF1 port: how each ported call's arguments are rewritten.

Each returns a `Builder`, bound on the original call during the analysis and run by the rewriter
on the transformed call's arguments with the local names the npu_lossscale classes got.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import libcst as cst

from migrator.codemods.shared import api
from migrator.codemods.shared import arguments as args_
from migrator.codemods.shared.plan import Builder
from migrator.codemods.tf1.sites import WrappedOptimizer


def append_distributed(value: cst.BaseExpression | None) -> Builder | None:
    if value is None:
        return None

    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        return args_.append_keyword(arguments, "is_distributed", value.deep_clone())

    return build


def tf_dynamic_builder(bound: dict[str, int]) -> Builder:
    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        return args_.tf_dynamic_arguments({k: arguments[i].value for k, i in bound.items()})

    return build


def tf_fixed_builder(bound: dict[str, int]) -> Builder:
    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        index = bound.get("loss_scale_value")
        if index is None:
            return list(arguments)
        out = list(arguments)
        out[index] = args_.renamed(out[index], "loss_scale")
        return out

    return build


def optimizer_builder(opt: WrappedOptimizer, value: cst.BaseExpression | None) -> Builder:
    bound = dict(opt.bound)
    manager = opt.manager

    def build(arguments: Sequence[cst.Arg], names: Mapping[str, str]) -> list[cst.Arg]:
        out = list(arguments)
        index = bound.get("loss_scale")
        if manager == "default":
            new = cst.Arg(value=args_.dynamic_manager(names[api.DYNAMIC]))
            if any(a.keyword is not None for a in out):
                new = args_.keyword("loss_scale_manager", new.value)
            out = args_.append_argument(out, new)
        else:
            assert index is not None
            arg = out[index]
            if manager == "dynamic":
                arg = arg.with_changes(value=args_.dynamic_manager(names[api.DYNAMIC]))
            elif manager == "fixed":
                arg = arg.with_changes(value=args_.fixed_manager(names[api.FIXED], arg.value))
            out[index] = args_.renamed(arg, "loss_scale_manager")
        if value is not None:
            out = args_.append_keyword(out, "is_distributed", value.deep_clone())
        return out

    return build
