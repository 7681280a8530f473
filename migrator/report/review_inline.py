"""Which lines of a changed block are edits of each other, and what changed inside them.

The line diff says "these old lines became those new ones"; a reviewer reads faster when an edited
line sits beside its new version with the changed words marked (`tf.contrib...LossScaleOptimizer`
became `NPULossScaleOptimizer`). Lines are paired by similarity, in order, so a comment removed
above an edited call is not marked as having turned into that call.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from itertools import zip_longest

# Lines with less in common than this are not read as one line edited: marking most of both
# lines helps nobody.
MIN_SIMILARITY = 0.4
# Past this many candidate pairs in one block (a rewrite, not a port), lines are paired in order.
MAX_PAIRINGS = 2500

_TOKEN = re.compile(r"\w+|\s+|.", re.S)

Row = tuple[int | None, int | None, bool]  # (old index, new index, edited pair)


def similarity(old: str, new: str) -> float:
    """The share of the two lines' characters that match, indentation left out (counted in
    characters, not words, so a call that gained arguments still reads as the same call)."""
    return difflib.SequenceMatcher(None, old.strip(), new.strip(), autojunk=False).ratio()


def pair_lines(old: Sequence[str], new: Sequence[str]) -> list[Row]:
    """Rows for a block where `old` lines were replaced by `new` ones, in order on both sides.

    Edited pairs are the most similar order-keeping matching (each at least MIN_SIMILARITY);
    the unpaired lines between them share rows, not marked as edits of each other.
    """
    pairs = _best_pairs(old, new) if len(old) * len(new) <= MAX_PAIRINGS else _in_order(old, new)
    rows: list[Row] = []
    i = j = 0
    for pi, pj in [*pairs, (len(old), len(new))]:
        rows += [(a, b, False) for a, b in zip_longest(range(i, pi), range(j, pj))]
        if pi < len(old):
            rows.append((pi, pj, True))
        i, j = pi + 1, pj + 1
    return rows


def _in_order(old: Sequence[str], new: Sequence[str]) -> list[tuple[int, int]]:
    return [
        (k, k)
        for k in range(min(len(old), len(new)))
        if similarity(old[k], new[k]) >= MIN_SIMILARITY
    ]


def _best_pairs(old: Sequence[str], new: Sequence[str]) -> list[tuple[int, int]]:
    """The order-keeping matching with the largest total similarity (an LCS-like table)."""
    score = [[0.0] * (len(new) + 1) for _ in range(len(old) + 1)]
    for i in range(len(old) - 1, -1, -1):
        for j in range(len(new) - 1, -1, -1):
            best = max(score[i + 1][j], score[i][j + 1])
            s = similarity(old[i], new[j])
            if s >= MIN_SIMILARITY:
                best = max(best, s + score[i + 1][j + 1])
            score[i][j] = best
    pairs = []
    i = j = 0
    while i < len(old) and j < len(new):
        if score[i][j] == score[i + 1][j]:
            i += 1
        elif score[i][j] == score[i][j + 1]:
            j += 1
        else:
            pairs.append((i, j))
            i, j = i + 1, j + 1
    return pairs


def changed_ranges(old: str, new: str) -> tuple[list[range], list[range]]:
    """Character ranges of `old` and `new` that differ, compared word by word (whitespace too, so a
    changed indentation shows)."""
    a = [m.span() for m in _TOKEN.finditer(old)]
    b = [m.span() for m in _TOKEN.finditer(new)]
    matcher = difflib.SequenceMatcher(
        None, [old[i:j] for i, j in a], [new[i:j] for i, j in b], autojunk=False
    )
    old_ranges: list[range] = []
    new_ranges: list[range] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if i1 < i2:
            old_ranges.append(range(a[i1][0], a[i2 - 1][1]))
        if j1 < j2:
            new_ranges.append(range(b[j1][0], b[j2 - 1][1]))
    return old_ranges, new_ranges
