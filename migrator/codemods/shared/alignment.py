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

OPENERS, CLOSERS = "([{", ")]}"
# A replaced line is paired with one of the next PAIRING_WINDOW old lines at least SIMILAR alike;
# after a difference the two files are matched up again within RESYNC lines.
PAIRING_WINDOW, SIMILAR, RESYNC = 4, 0.6, 200
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
    similar old line of its segment (a renamed call, an argument that gained a comma); the new
    lines left unpaired are what the rewrite added. None when no changed line opens a bracket
    it does not close (by a plain count), so that nothing can need realigning.

    A rewrite changes a few places of a file, so the two are walked together and, at each
    difference, matched up again at the nearest pair of equal lines (two in a row) within
    RESYNC lines: linear in the file, where difflib is quadratic in its repeated lines (4 s of CPU
    for 18,000 lines)."""
    rows: dict[int, int] = {}
    changed: list[tuple[int, int, int, int]] = []  # (i1, i2, j1, j2) segments that differ
    i = j = 0
    while i < len(old) and j < len(new):
        if old[i] == new[j]:
            rows[j + 1] = i + 1
            i, j = i + 1, j + 1
            continue
        step = _resync(old, new, i, j)
        if step is None:
            changed.append((i, len(old), j, len(new)))
            i, j = len(old), len(new)
            break
        changed.append((i, i + step[0], j, j + step[1]))
        i, j = i + step[0], j + step[1]
    if j < len(new):
        changed.append((i, len(old), j, len(new)))
    if not any(_opens(line) for _, _, j1, j2 in changed for line in new[j1:j2]):
        return None
    for i1, i2, j1, j2 in changed:
        k = i1
        for n in range(j1, j2):
            for m in range(k, min(i2, k + PAIRING_WINDOW)):
                if _similar(old[m], new[n]):
                    rows[n + 1] = m + 1
                    k = m + 1
                    break
    return rows


def _resync(old: list[str], new: list[str], i: int, j: int) -> tuple[int, int] | None:
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


def realign(old: bytes, new: bytes) -> bytes:
    """`realign_text` over a file's bytes, in the file's own encoding (untouched when unknown)."""
    if old == new:
        return new
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(new).readline)
        old_text, new_text = old.decode(encoding), new.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return new
    done = realign_text(old_text, new_text)
    return new if done == new_text else done.encode(encoding)
