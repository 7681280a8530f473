"""The spans a ported file's checks read (migrator.sources.spans): every changed line in them,
whole top-level statements, and realignment over them the same as over the whole file."""

from __future__ import annotations

from test_output_check import LINES, OLD, STARTS

from migrator.codemods.shared.alignment import realign
from migrator.sources.spans import changed_spans, differing_runs

OLD_TEXT = [line.decode() for line in LINES]
# A statement near the top of the module, far from most of the others.
TOP = STARTS[3]


def _edited(*edits: tuple[int, list[str]]) -> list[str]:
    """The module with the line at each index replaced by the given lines."""
    new = list(OLD_TEXT)
    for index, lines in sorted(edits, reverse=True):
        new[index : index + 1] = lines
    return new


def _rebuilt(new: list[str], spans: list[tuple[int, int, int, int]]) -> list[str]:
    out, done = [], 0
    for old_first, old_stop, first, stop in spans:
        out += OLD_TEXT[done:old_first] + new[first:stop]
        done = old_stop
    return out + OLD_TEXT[done:]


def test_spans_hold_every_change_in_whole_statements() -> None:
    edges = {0, *STARTS, len(OLD_TEXT)}
    for start in STARTS[10::7]:
        for lines in ([], ["y = 1\n", OLD_TEXT[start]], ["x = (\n", OLD_TEXT[start]]):
            new = _edited((TOP, ["import os\n", OLD_TEXT[TOP]]), (start, lines))
            spans = changed_spans(OLD_TEXT, new, STARTS)
            assert spans is not None and len(spans) == 2, start  # two places, far apart
            assert _rebuilt(new, spans) == new
            assert all(s[0] in edges and s[1] in edges for s in spans)


def test_runs_are_the_lines_that_differ() -> None:
    new = _edited((TOP, ["import os\n"]), (STARTS[50], []), (STARTS[90], ["a\n", "b\n"]))
    runs = differing_runs(OLD_TEXT, new)
    assert [(i1, i2, j2 - j1) for i1, i2, j1, j2 in runs] == [
        (TOP, TOP + 1, 1),
        (STARTS[50], STARTS[50] + 1, 0),
        (STARTS[90], STARTS[90] + 1, 2),
    ]
    assert changed_spans(OLD_TEXT, OLD_TEXT, STARTS) == []


def test_an_insertion_at_the_top_or_the_end_is_in_a_span() -> None:
    new = ["import os\n", *OLD_TEXT, "x = 1\n"]
    spans = changed_spans(OLD_TEXT, new, STARTS)
    assert spans is not None and _rebuilt(new, spans) == new
    assert spans[0][2] == 0 and spans[-1][3] == len(new)


def test_realigning_the_spans_is_realigning_the_file() -> None:
    """Calls renamed in two places, each with a continuation line aligned with its bracket, and
    a line added above the first: the same bytes whether the whole file is read or only its
    spans."""
    call = "m = tf.contrib.mixed_precision.FixedLossScaleManager(1024,\n"
    tail = " " * call.index("1024") + "enable_overflow_check=True)\n"
    old = OLD_TEXT[:TOP] + [call, tail] + OLD_TEXT[TOP:]
    old += [call, tail]
    short = [call.replace("tf.contrib.mixed_precision.", ""), tail]
    new = OLD_TEXT[:TOP] + ["import os\n", *short] + OLD_TEXT[TOP:] + short  # one line down
    starts = sorted({*(s + 2 if s >= TOP else s for s in STARTS), TOP, len(old) - 2})
    old_bytes, new_bytes = "".join(old).encode(), "".join(new).encode()
    whole = realign(old_bytes, new_bytes)
    aligned = b"\n" + b" " * len("m = FixedLossScaleManager(") + b"enable_overflow_check"
    assert OLD.count(aligned) == 0 and whole.count(aligned) == 2
    assert realign(old_bytes, new_bytes, starts) == whole
