"""Lines of Python as HTML for the review page: Pygments' token classes, and marked ranges.

A whole file is lexed at once, so a line inside a docstring or a bracket continued over lines is
coloured as what it is, then cut back into lines. The ranges that changed inside an edited line
(migrator/report/review_inline.py) are wrapped in <del>/<ins> around the coloured tokens.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES

STYLE = "default"

Run = tuple[str, str]  # (Pygments CSS class or "", text)


def token_css(prefix: str) -> str:
    """The style's rules for the token classes only, scoped under `prefix`: the page draws its own
    backgrounds, which the diff colours must not be painted over."""
    return "\n".join(HtmlFormatter(style=STYLE).get_token_style_defs(prefix))


def _css_class(ttype: Any) -> str:
    """The class HtmlFormatter gives a token type: its own short name, else its nearest parent's."""
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def highlight(lines: Sequence[str]) -> list[list[Run]]:
    """Each line's runs (without its line ending), lexed as one Python file."""
    text = "".join(lines)
    # A CR inside a line would end a line for the lexer, and a byte-order mark is an error token to
    # it; a space of the same length keeps the offsets into `text` aligned.
    lexed = text.replace("\r", " ").replace("\ufeff", " ")
    out: list[list[Run]] = [[]]
    for start, ttype, value in PythonLexer().get_tokens_unprocessed(lexed):
        css = _css_class(ttype)
        pieces = text[start : start + len(value)].split("\n")
        for number, piece in enumerate(pieces):
            if number:
                out.append([])
            if piece:
                out[-1].append((css, piece))
    return out[: len(lines)] + [[] for _ in range(len(lines) - len(out))]


# After these, a long line may wrap (a <wbr>, copied as nothing): without them a dotted name with
# its call, `tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(init_loss_scale=2**32,`,
# is one word, which a narrow column broke inside an identifier (`...LossScaleManage|r(`).
_WRAP_AFTER = re.compile(r"([.,(\[{=])(?![\s.,)\]}=])")


def _visible(text: str) -> str:
    """HTML text of a piece of a line: a CR that is not the line ending would be read as a line
    break by the browser, so it is shown as a symbol; long lines may wrap after punctuation."""
    return _WRAP_AFTER.sub(r"\1<wbr>", html.escape(text)).replace("\r", "\u240d")


def line_html(runs: list[Run], marks: Sequence[range] = (), tag: str = "mark") -> str:
    """The runs as <span class=...> elements, with the characters in `marks` inside `<tag>`.

    A trailing CR (a CRLF line) is dropped: the page shows lines, not their endings.
    """
    if runs and runs[-1][1].endswith("\r"):
        css, text = runs[-1]
        runs = runs[:-1] + ([(css, text[:-1])] if text[:-1] else [])
    cuts = sorted({p for r in marks for p in (r.start, r.stop)})
    out: list[str] = []
    position = 0
    inside = False
    for css, text in runs:
        end = position + len(text)
        pieces = [c for c in cuts if position < c < end]
        for piece_start, piece_end in zip([position, *pieces], [*pieces, end]):
            marked = any(piece_start in r for r in marks)
            if marked != inside:
                out.append(f"<{tag}>" if marked else f"</{tag}>")
                inside = marked
            piece = _visible(text[piece_start - position : piece_end - position])
            out.append(f'<span class="{css}">{piece}</span>' if css else piece)
        position = end
    if inside:
        out.append(f"</{tag}>")
    return "".join(out)
