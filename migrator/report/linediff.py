"""Line matching for the printed diff that shows the lines that changed, on any file.

difflib's matcher treats a line that repeats often in a long file as junk (its `autojunk` rule), so
on a generated 5,000-line module where three lines changed its diff replaced every line; without
the rule it is quadratic on such files (17 s on 20,000 lines). A port changes a handful of lines,
so Myers' algorithm, whose cost grows with the number of edits D as O((N + M) * D), is exact and
fast here. Past `MAX_EDITS` (a rewrite, not a port) difflib's heuristic answer is used.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

MAX_EDITS = 1000


class LineMatcher(difflib.SequenceMatcher):
    """A SequenceMatcher whose matching blocks are a shortest edit script's common lines, so its
    `get_grouped_opcodes` gives the hunks a reader expects."""

    def __init__(self, a: Sequence[str], b: Sequence[str]) -> None:
        super().__init__(None, a, b, autojunk=False)
        self._blocks: list[difflib.Match] | None = None

    def get_matching_blocks(self) -> list[difflib.Match]:
        if self._blocks is None:
            self._blocks = _matching_blocks(list(self.a), list(self.b))
        return self._blocks


def _matching_blocks(a: list[str], b: list[str]) -> list[difflib.Match]:
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    middle_a, middle_b = a[head : len(a) - tail], b[head : len(b) - tail]
    pairs = _myers_pairs(middle_a, middle_b)
    if pairs is None:
        inner = difflib.SequenceMatcher(None, middle_a, middle_b).get_matching_blocks()
        pairs = [(m.a + k, m.b + k) for m in inner for k in range(m.size)]
    matches = [(i, i) for i in range(head)]
    matches += [(i + head, j + head) for i, j in pairs]
    matches += [(len(a) - tail + k, len(b) - tail + k) for k in range(tail)]
    blocks: list[difflib.Match] = []
    for i, j in matches:
        last = blocks[-1] if blocks else None
        if last is not None and last.a + last.size == i and last.b + last.size == j:
            blocks[-1] = difflib.Match(last.a, last.b, last.size + 1)
        else:
            blocks.append(difflib.Match(i, j, 1))
    blocks.append(difflib.Match(len(a), len(b), 0))
    return blocks


def _myers_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]] | None:
    """Indexes (i, j) of the lines a shortest edit script keeps, in order; None past MAX_EDITS."""
    n, m = len(a), len(b)
    frontier = {1: 0}  # diagonal k = x - y -> furthest x reached
    trace: list[dict[int, int]] = []
    for d in range(min(n + m, MAX_EDITS) + 1):
        trace.append(dict(frontier))
        for k in range(-d, d + 1, 2):
            down = k == -d or (k != d and frontier[k - 1] < frontier[k + 1])
            x = frontier[k + 1] if down else frontier[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            frontier[k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m)
    return None


def _backtrack(trace: list[dict[int, int]], x: int, y: int) -> list[tuple[int, int]]:
    kept: list[tuple[int, int]] = []
    for d in range(len(trace) - 1, -1, -1):
        frontier = trace[d]
        k = x - y
        down = k == -d or (k != d and frontier[k - 1] < frontier[k + 1])
        previous_k = k + 1 if down else k - 1
        previous_x = frontier[previous_k]
        previous_y = previous_x - previous_k
        while x > previous_x and y > previous_y:
            x, y = x - 1, y - 1
            kept.append((x, y))
        if d > 0:
            x, y = previous_x, previous_y
    kept.reverse()
    return kept


def unified_diff_lines(
    a: Sequence[str], b: Sequence[str], fromfile: str, tofile: str, n: int = 3
) -> list[str]:
    """difflib.unified_diff's output, over LineMatcher's hunks."""
    out: list[str] = []
    for group in LineMatcher(a, b).get_grouped_opcodes(n):
        if not out:
            out += [f"--- {fromfile}\n", f"+++ {tofile}\n"]
        first, last = group[0], group[-1]
        old_range = _range(first[1], last[2])
        new_range = _range(first[3], last[4])
        out.append(f"@@ -{old_range} +{new_range} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            if tag in ("replace", "delete"):
                out += ["-" + line for line in a[i1:i2]]
            if tag in ("replace", "insert"):
                out += ["+" + line for line in b[j1:j2]]
    return out


def _range(start: int, stop: int) -> str:
    """A unified-diff line range, as difflib writes it (`3`, `3,4`, `2,0`)."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return str(beginning)
    if not length:
        beginning -= 1
    return f"{beginning},{length}"
