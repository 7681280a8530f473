"""Which lines a port changed, and the whole top-level statements around them.

The checks made on a ported file before it is written (that it parses, that its continuation lines
stay aligned) need only read the top-level statements the port changed: a module is a sequence of
top-level statements, and at the start of each the tokenizer is in the same state (no bracket or
string open, no indentation) in both versions. A port changes a few places of a file (an import at
the top, an optimizer further down), and reading all of the file again was most of the time spent
on a ported file after its port.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# After a difference, the two files are matched up again within RESYNC lines.
RESYNC = 200

# (old_first, old_stop, new_first, new_stop): the old file's lines [old_first, old_stop) became the
# new file's lines [new_first, new_stop), 0-based.
Span = tuple[int, int, int, int]


def differing_runs(old: Sequence[str], new: Sequence[str]) -> list[Span]:
    """The runs of lines that differ, in order; every line outside them is the same in both.

    A port changes a few places of a file, so the two are walked together and, at each
    difference, matched up again at the nearest pair of equal lines (two in a row) within RESYNC
    lines: linear in the file, where difflib is quadratic in its repeated lines (4 s of CPU for
    18,000 lines). Past RESYNC lines without such a pair, the rest of the files is one run."""
    runs: list[Span] = []
    i = j = 0
    while i < len(old) and j < len(new):
        if old[i] == new[j]:
            i, j = i + 1, j + 1
            continue
        step = _resync(old, new, i, j)
        if step is None:
            break
        runs.append((i, i + step[0], j, j + step[1]))
        i, j = i + step[0], j + step[1]
    if i < len(old) or j < len(new):
        runs.append((i, len(old), j, len(new)))
    return runs


def _resync(old: Sequence[str], new: Sequence[str], i: int, j: int) -> tuple[int, int] | None:
    """(a, b): the nearest a + b where old[i + a:] and new[j + b:] start with two equal lines
    (or end together), or None within RESYNC lines."""
    ahead: dict[str, list[int]] = {}
    for b in range(min(RESYNC, len(new) - j)):
        ahead.setdefault(new[j + b], []).append(b)
    best: tuple[int, int] | None = None
    for a in range(min(RESYNC, len(old) - i)):
        if best is not None and a >= sum(best):
            break
        for b in ahead.get(old[i + a], ()):
            if best is not None and a + b >= sum(best):
                break
            x, y = i + a + 1, j + b + 1
            if (x == len(old) and y == len(new)) or (
                x < len(old) and y < len(new) and old[x] == new[y]
            ):
                best = (a, b)
                break
    if best is None and len(old) - i <= RESYNC and len(new) - j <= RESYNC:
        return len(old) - i, len(new) - j  # the rest differs
    return best


def changed_spans(
    old: Sequence[str], new: Sequence[str], starts: Sequence[int]
) -> list[Span] | None:
    """The spans of whole top-level statements of the old file that hold every differing run, in
    order, every line outside them being the same in both files; None where one span is all of
    the old file.

    `starts`: the 0-based lines of the old file at which its top-level statements start, in
    order. Each run is widened to the statements around it, and by one more statement on each
    side: an indented line put first may continue the block of the statement before, and a
    backslash put last may join the line after (`x = \\` then `y = 2` parses).
    """
    runs = differing_runs(old, new)
    widened: list[list[int]] = []  # [old_first, old_stop], overlapping ones merged
    for i1, i2, _, _ in runs:
        before = bisect.bisect_left(starts, i1)
        first = starts[before - 1] if before else 0
        after = bisect.bisect_right(starts, i2)
        stop = starts[after] if after < len(starts) else len(old)
        if widened and widened[-1][1] >= first:
            widened[-1][1] = max(widened[-1][1], stop)
        else:
            widened.append([first, stop])
    if widened and widened[0] == [0, len(old)]:
        return None
    # A span's ends lie between runs (where one fell inside a run, its span and that run's were
    # merged), so a line there moved by what the runs before it added or removed: for a start,
    # the runs ending before it (an insertion at line 0 is in the span starting there); for a
    # stop, those ending at it too.
    ends = [i2 for _, i2, _, _ in runs]
    shifts = [j2 - i2 for _, i2, _, j2 in runs]

    def moved(line: int, runs_before: int) -> int:
        return line + (shifts[runs_before - 1] if runs_before else 0)

    return [
        (
            first,
            stop,
            moved(first, bisect.bisect_left(ends, first)),
            moved(stop, bisect.bisect_right(ends, stop)),
        )
        for first, stop in widened
    ]
