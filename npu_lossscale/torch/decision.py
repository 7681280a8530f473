"""One update's skip-or-apply decision for `GradScaler`: whose overflow flags decide which step.

Stock torch decides per optimizer, and can apply one optimizer of a backward pass while skipping
another. `GradScaler` decides once for the optimizers one backward pass wrote (or per optimizer,
as stock, with ``per_optimizer=True``); this module is that bookkeeping, apart from how a flag is
computed or read (the scaler's overflow mode, devices and ranks), which it is handed as three
callables:

- ``agree(flags) -> bool``: combine flags, sum them over the ranks, read the result (the one
  host sync of a step);
- ``precheck(optimizer) -> tensor | None``: a read-only check of an optimizer's still-scaled
  gradients (None where the chip's float status already covers them);
- ``read_alone(found) -> bool | None``: one optimizer's flags read directly where no reduction
  is needed (one device, one rank), else None.

An update falls into parts: a loss scaled after a step starts a new one (a GAN's G loss after D's
step). A part's first step decides over its own optimizer, every optimizer already ``unscale_``d
in the update and the optimizers that shared this one's part in the previous update (prechecked:
their gradients come from the same backward pass when the loop steps the same optimizers after
one backward every update). If any overflowed, every step of the part is skipped. An optimizer
the decision did not cover (new to the scaler) is checked at its own step and, having overflowed,
skipped with every later one of its part. The update has overflowed when any part did.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

Flags = dict[torch.device, torch.Tensor]
Part = list[weakref.ref]


class UpdateDecision:
    """The decision of one update, from its first step to ``update()``."""

    def __init__(
        self,
        states: dict[int, dict[str, Any]],
        previous: list[Part],
        per_optimizer: bool,
        agree: Callable[[Sequence[torch.Tensor]], bool],
        precheck: Callable[[torch.optim.Optimizer], torch.Tensor | None],
        read_alone: Callable[[Flags], bool | None],
    ) -> None:
        self._states = states  # stock's per-optimizer stages and flags, of this update
        self._previous = previous  # the previous update's parts
        self._per_optimizer = per_optimizer
        self._agree, self._precheck, self._read_alone = agree, precheck, read_alone
        self._overflowed: bool | None = None  # this part's decision; None: not taken yet
        self._earlier: bool | None = None  # whether an earlier part overflowed; None: no part
        self._judged: set[int] = set()  # optimizers whose flags a decision has read
        self._parts: list[Part] = [[]]  # the optimizers stepped, part by part

    def new_part(self) -> bool:
        """A loss is being scaled: after a step of this update it starts a new part (True)."""
        if not self._parts[-1]:
            return False
        self._earlier = bool(self._earlier) or bool(self._overflowed)
        self._overflowed = None
        self._parts.append([])
        return True

    def must_skip(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer``'s step, about to run, must be skipped."""
        if self._per_optimizer:  # stock's decisions: each optimizer on its own gradients
            mine = self._alone(optimizer)
            if mine is None:
                mine = self._agreed([id(optimizer)])
            self._overflowed = bool(self._overflowed) or mine
            return mine
        if self._overflowed is None:
            self._overflowed = self._alone(optimizer)
            if self._overflowed is None:
                keys = self._unjudged()
                if id(optimizer) not in keys:  # one that unscales itself is still READY
                    keys.append(id(optimizer))
                self._overflowed = self._agreed(keys, self._prechecks(optimizer))
        elif not self._overflowed and id(optimizer) not in self._judged:
            self._overflowed = self._agreed([id(optimizer)])
        return self._overflowed

    def stepped(self, optimizer: torch.optim.Optimizer) -> None:
        self._parts[-1].append(weakref.ref(optimizer))

    def so_far(self) -> bool:
        """Whether a step of this update has been skipped for overflow."""
        return bool(self._earlier) or bool(self._overflowed)

    def outcome(self) -> bool:
        """Whether the update overflowed, reading the optimizers unscaled but not stepped too
        (as stock does); AssertionError, as stock's, when nothing was checked."""
        overflowed = self._overflowed
        if self._earlier is not None:  # an earlier part of this update was decided
            overflowed = self._earlier or bool(overflowed)
        # The judged optimizers are a subset of those with a state, so when the counts match
        # there is nothing left to read.
        unjudged = []
        if not overflowed and len(self._judged) < len(self._states):
            unjudged = self._unjudged()
        if overflowed is None and not unjudged:
            raise AssertionError("No inf checks were recorded prior to update.")
        if unjudged:
            overflowed = self._agreed(unjudged)
        return bool(overflowed)

    def parts(self) -> list[Part]:
        """The optimizers stepped, part by part (what the next update's prechecks consult)."""
        return [part for part in self._parts if part]

    def _alone(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """The decision of the usual loop -- one optimizer, stepped alone in this update and the
        last -- read straight from its flag where ``read_alone`` can; None for any other loop.

        The general path decides the same there, but runs right after the unscale kernel has
        streamed every gradient through the caches, where each Python call it makes costs
        microseconds: together, more than stock torch's whole step.
        """
        previous = self._previous
        if len(self._states) != 1 or len(previous) > 1 or len(self._parts) > 1:
            return None
        if previous and (len(previous[0]) > 1 or previous[0][0]() is not optimizer):
            return None
        mine = self._read_alone(self._states[id(optimizer)]["found_inf_per_device"])
        if mine is not None:
            self._judged.add(id(optimizer))
        return mine

    def _unjudged(self) -> list[int]:
        return [
            key
            for key, state in self._states.items()
            if state["stage"] is not OptState.READY and key not in self._judged
        ]

    def _prechecks(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """Read-only checks of the optimizers that shared ``optimizer``'s part of the previous
        update, not yet unscaled in this one. A loop that steps optimizers after separate
        backward passes (a GAN's D, then G, in one update or in two) leaves stale gradients in
        the others, which are not this part's to judge."""
        part = next((p for p in self._previous if any(r() is optimizer for r in p)), [])
        if len(part) < 2:
            return []
        flags = []
        for ref in part:
            other = ref()
            if other is None or other is optimizer:
                continue
            state = self._states.get(id(other))
            if state is not None and state["stage"] is not OptState.READY:
                continue
            flag = self._precheck(other)
            if flag is not None:
                flags.append(flag)
        return flags

    def _agreed(self, keys: list[int], extra: Sequence[torch.Tensor] = ()) -> bool:
        flags = [
            flag for key in keys for flag in self._states[key]["found_inf_per_device"].values()
        ]
        self._judged.update(keys)
        return self._agree([*flags, *extra])
