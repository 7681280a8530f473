"""The bytes of a ported module, with the statements the ports left alone copied from the file.

The ports hand back the tree they were given with a few top-level statements replaced; the others
are the very objects parsed from the file, so their code is the bytes they were parsed from.
Generating the code of a whole training script was about a tenth of its port; only the replaced
statements need it. Where each statement's bytes begin comes from the tokenizer's pass that
checked the file before parsing (migrator.codemods.shared.lines), so finding them costs no code
generation either. Anything that pass could not pair with the tree falls back to `bytes_of`.
"""

from __future__ import annotations

import codecs
import itertools

import libcst as cst

from migrator.codemods.shared.codegen import bytes_of, node_code
from migrator.codemods.shared.lines import code_starts


def ported_bytes(ported: cst.Module, parsed: cst.Module, source: bytes) -> bytes:
    """`ported.bytes`, where `parsed` is the module just parsed from `source` and `ported` what
    the codemods made of it."""
    found = _spans(parsed, source)
    if found is None or not _same_frame(ported, parsed):
        return bytes_of(ported)
    header_end, footer_start, spans = found
    pieces = [source[:header_end]]
    for stmt in ported.body:
        # `parsed` holds its statements, so no other live node can have one's id.
        span = spans.get(id(stmt))
        if span is not None:
            pieces.append(source[span[0] : span[1]])
        else:
            pieces.append(node_code(stmt, ported).encode(ported.encoding))
    pieces.append(source[footer_start:])
    return b"".join(pieces)


def _spans(parsed: cst.Module, source: bytes) -> tuple[int, int, dict[int, tuple[int, int]]] | None:
    """Where the header ends, where the footer starts, and id(statement) -> its (start, end)
    for each top-level statement, as offsets in `source`; None where the tokenizer's lines are
    missing or do not pair with the tree."""
    firsts = code_starts(parsed)
    if firsts is None or source.startswith(codecs.BOM_UTF8) or not source.endswith(b"\n"):
        return None
    offsets = [0, *itertools.accumulate(len(line) for line in source.splitlines(keepends=True))]
    bounds = [*firsts, len(offsets) - len(parsed.footer)]  # lines each piece begins on
    if bounds[0] != len(parsed.header) + 1 or any(a > b for a, b in zip(bounds, bounds[1:])):
        return None
    spans = {
        id(stmt): (offsets[start - 1], offsets[end - 1])
        for stmt, start, end in zip(parsed.body, bounds, bounds[1:])
    }
    return offsets[bounds[0] - 1], offsets[bounds[-1] - 1], spans


def _same_frame(ported: cst.Module, parsed: cst.Module) -> bool:
    """Whether everything around the body is as parsed (the ports only replace statements)."""
    return (
        len(ported.header) == len(parsed.header)
        and all(a is b for a, b in zip(ported.header, parsed.header))
        and len(ported.footer) == len(parsed.footer)
        and all(a is b for a, b in zip(ported.footer, parsed.footer))
        and (ported.encoding, ported.default_indent, ported.default_newline)
        == (parsed.encoding, parsed.default_indent, parsed.default_newline)
        and ported.has_trailing_newline
    )
