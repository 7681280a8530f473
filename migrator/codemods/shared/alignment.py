"""Continuation lines aligned with an opening bracket stay aligned when the code before it changes.

libcst keeps each line's whitespace as it was, so shortening what precedes a bracket
(`tf.contrib.mixed_precision.LossScaleOptimizer(opt,` -> `NPULossScaleOptimizer(opt,`) leaves the
next lines of the call aligned with where the bracket used to be. This pass runs over the final
text of a rewritten file: a line that was aligned with the first token after its innermost open
bracket (PEP 8's visual indent) is moved to where that token now is, and so are the lines below it
that were aligned inside it. Hanging indents, tab-indented lines and lines inside strings are never
touched; only leading spaces change, so the code means what it meant.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import tokenize
from collections.abc import Sequence

from migrator.sources.spans import changed_spans, differing_runs

OPENERS, CLOSERS = "([{", ")]}"
# A replaced line is paired with one of the next PAIRING_WINDOW old lines at least SIMILAR alike.
PAIRING_WINDOW, SIMILAR = 4, 0.6
FSTRING_START = getattr(tokenize, "FSTRING_START", -1)
FSTRING_END = getattr(tokenize, "FSTRING_END", -1)


@dataclasses.dataclass
class _Bracket:
    char: str
    row: int  # 1-based line of the bracket
    follow: int | None = None  # column of the first token after it on its line (visual indent)


@dataclasses.dataclass
class _Lines:
    """Per line (1-based): the open brackets at its start, and whether it starts in a string."""

    stacks: dict[int, tuple[_Bracket, ...]]
    in_string: set[int]


def _scan(text: str) -> _Lines | None:
    stacks: dict[int, tuple[_Bracket, ...]] = {}
    in_string: set[int] = set()
    stack: list[_Bracket] = []
    fstrings: list[int] = []  # lines where the f-strings being read start
    row = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            (start, col), (end, _) = tok.start, tok.end
            while row < start:
                row += 1
                stacks[row] = tuple(stack)
            if stack and stack[-1].follow is None and stack[-1].row == start:
                if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
                    stack[-1].follow = col
            if end > start:
                in_string.update(range(start + 1, end + 1))
            if tok.type == FSTRING_START:  # Python 3.12+: an f-string is several tokens
                fstrings.append(start)
            elif tok.type == FSTRING_END and fstrings:
                in_string.update(range(fstrings.pop() + 1, end + 1))
            if tok.type == tokenize.OP and tok.string in OPENERS:
                stack.append(_Bracket(tok.string, start))
            elif tok.type == tokenize.OP and tok.string in CLOSERS and stack:
                stack.pop()
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    return _Lines(stacks, in_string)


def _indent(line: str) -> int | None:
    """Leading spaces of a line with code on it; None for tabs or a blank line."""
    stripped = line.lstrip(" ")
    if not stripped.strip() or stripped[0] == "\t":
        return None
    return len(line) - len(stripped)


def _old_rows(old: list[str], new: list[str]) -> dict[int, int] | None:
    """new line -> old line (1-based): lines kept, and each replaced line paired with the next
    similar old line of its run (a renamed call, an argument that gained a comma); the new lines
    left unpaired are what the rewrite added. None when no changed line opens a bracket it does
    not close (by a plain count), so that nothing can need realigning. Linear in the file
    (migrator.sources.spans.differing_runs)."""
    runs = differing_runs(old, new)
    if not any(_opens(line) for _, _, j1, j2 in runs for line in new[j1:j2]):
        return None
    rows: dict[int, int] = {}
    i = j = 0
    for i1, i2, j1, j2 in [*runs, (len(old), len(old), len(new), len(new))]:
        rows.update((j + k + 1, i + k + 1) for k in range(j1 - j))  # the equal lines before
        k = i1
        for n in range(j1, j2):
            for m in range(k, min(i2, k + PAIRING_WINDOW)):
                if _similar(old[m], new[n]):
                    rows[n + 1] = m + 1
                    k = m + 1
                    break
        i, j = i2, j2
    return rows


def _opens(line: str) -> bool:
    return sum(map(line.count, OPENERS)) > sum(map(line.count, CLOSERS))


def _similar(old: str, new: str) -> bool:
    pair = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return pair.real_quick_ratio() >= SIMILAR and pair.ratio() >= SIMILAR


def realign_text(old: str, new: str) -> str:
    """`new` with its visually indented continuation lines aligned again (see the module doc)."""
    if old == new or any(t.count("\r") != t.count("\r\n") for t in (old, new)):
        return new  # lone carriage returns: lines would be counted two ways
    # Lines as the tokenizer reads them (str.splitlines would also split at form feeds).
    old_lines, new_lines = io.StringIO(old).readlines(), io.StringIO(new).readlines()
    rows = _old_rows(old_lines, new_lines)
    if rows is None:
        return new
    before, after = _scan(old), _scan(new)
    if before is None or after is None:
        return new
    shifts: dict[int, int] = {}  # new line -> columns it moved
    out = list(new_lines)
    previous: tuple[int, int] | None = None  # (original indent, shift) of the last moved line
    for row in range(1, len(new_lines) + 1):
        stack = after.stacks.get(row, ())
        indent = _indent(new_lines[row - 1])
        if not stack or indent is None or row in after.in_string or stack[-1].follow is None:
            previous = None
            continue
        top = stack[-1]
        target = top.follow + shifts.get(top.row, 0)
        old_row = rows.get(row)
        if old_row is not None:
            old_stack = before.stacks.get(old_row, ())
            aligned = (
                len(old_stack) == len(stack)
                and [b.char for b in old_stack] == [b.char for b in stack]
                and old_stack[-1].follow == _indent(old_lines[old_row - 1])
                and old_row not in before.in_string
            )
        else:
            # A line the rewrite added (a keyword on its own line) follows the line above it.
            aligned = previous is not None and previous[0] == indent
        if not aligned or target == indent:
            previous = None
            continue
        shifts[row] = target - indent
        previous = (indent, target - indent)
        out[row - 1] = " " * target + new_lines[row - 1][indent:]
    return "".join(out)


def realign(old: bytes, new: bytes, starts: Sequence[int] | None = None) -> bytes:
    """`realign_text` over a file's bytes, in the file's own encoding (untouched when unknown).

    `starts`: the 0-based lines of `old` at which its top-level statements start, where known;
    then only the top-level statements around the changed lines are read (migrator.sources.spans):
    a bracket never spans two of them, so no other line can move.
    """
    if old == new:
        return new
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(new).readline)
        old_text, new_text = old.decode(encoding), new.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return new
    spans = None
    if starts and not any(t.count("\r") != t.count("\r\n") for t in (old_text, new_text)):
        old_lines = io.StringIO(old_text).readlines()
        new_lines = io.StringIO(new_text).readlines()
        spans = changed_spans(old_lines, new_lines, starts)
    if spans is None:
        done = realign_text(old_text, new_text)
    else:
        out, done_to = [], 0  # new lines [0, done_to) are in `out`
        for old_first, old_stop, first, stop in spans:
            out += new_lines[done_to:first]
            out.append(
                realign_text("".join(old_lines[old_first:old_stop]), "".join(new_lines[first:stop]))
            )
            done_to = stop
        done = "".join([*out, *new_lines[done_to:]])
    return new if done == new_text else done.encode(encoding)
