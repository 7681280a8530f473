"""A torch scaler call's arguments, rewritten for npu_lossscale.torch.GradScaler.

The ported class takes torch.amp.GradScaler's parameters in the same order, device first. So a
`torch.cuda.amp.GradScaler(65536.0, 2.0)` call, whose first parameter is init_scale, must pass its
positional arguments by name, and so must a `torch.amp.GradScaler("cuda", 1024.0)` call once its
device is dropped (the rest would shift one place left). Every other argument stays as written.
Binding happens on the original call, building on the transformed one, by position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst

from migrator.codemods.shared.arguments import append_keyword, named

Builder = Callable[[Sequence[cst.Arg]], list[cst.Arg]]


def builder(
    bound: dict[str, int],
    *,
    drop: str | None,
    by_name: bool,
    add_device: str | None = None,
    floor: str | None = None,
) -> Builder:
    """The new argument list from the call's arguments bound to parameter names (every index
    present): `drop` removed, positionals named when `by_name`, `device=add_device` appended
    (torch.cpu.amp's scaler, whose device is implied), and `min_loss_scale=floor` (a script that
    relies on the scale going below 1)."""
    names = {index: name for name, index in bound.items()}
    dropped = bound.get(drop) if drop is not None else None

    def build(arguments: Sequence[cst.Arg]) -> list[cst.Arg]:
        out: list[cst.Arg] = []
        for index, arg in enumerate(arguments):
            if index == dropped:
                continue
            if by_name and arg.keyword is None and not arg.star:
                arg = named(arg, names[index])
            out.append(arg)
        if dropped is not None and dropped == len(arguments) - 1 and out:
            # The last argument went: the one before it takes its comma (or its absence).
            out[-1] = out[-1].with_changes(comma=arguments[dropped].comma)
        if add_device is not None:
            out = append_keyword(out, "device", cst.SimpleString(f'"{add_device}"'))
        if floor is not None:
            out = append_keyword(out, "min_loss_scale", cst.Integer(floor))
        return out

    return build
