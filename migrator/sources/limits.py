"""Whether libcst can parse a file without crashing the process, decided from its tokens.

libcst's native parser recurses once per level of an expression and has no guard: 3,000 nested
brackets, or a chain of 8,000 `a+a+...` terms (attributes, calls, `and`s likewise) in one
statement, overflow its stack and kill the process with signal 11, no message, no report, and the
other files of a `--write` run never written. A statement of 350,000 list items does not crash but
took 197 s and 1.5 GB. The standard library's tokenizer reads such a file safely and cheaply, so
every file is measured here before libcst sees it, and one past the limits fails alone, with the
line, while the rest of the run goes on. The limits are far above real scripts: CPython itself
refuses more than 200 nested brackets.

The same pass notes the line each statement and clause starts on (`statement_starts`), which
gives the codemods' finding lines without generating the code before them
(migrator.codemods.shared.lines).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import re
import token
import tokenize
from collections.abc import Iterator

from migrator.findings import SourceError

MAX_DEPTH = 1000
"""Expression depth libcst is allowed: measured to crash between 3,000 and 8,000 (a chain of
binary operators) and between 1,000 and 3,000 brackets, which count BRACKET_DEPTH each."""
BRACKET_DEPTH = 3
MAX_STATEMENT_TOKENS = 50_000
"""Tokens in one statement: parse time and memory grow with it (25,000 list items: ~20 s)."""

_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
# Keywords that build one more level of expression, like an operator.
_CHAINING = frozenset({"and", "or", "not", "if", "else", "lambda", "await", "in", "is"})


def check(source: bytes) -> None:
    """Raise SourceError (`LINE:COL: ...`) when a statement is too deep or too long to parse safely.

    A file the tokenizer cannot read is let through: the parser reports its syntax error.
    """
    found = _measured(source).error
    if found is not None:
        raise SourceError(found)


def deepest_line(source: bytes) -> int | None:
    """The line of the deepest expression, for a RecursionError met later (codemods walk trees
    recursively in Python, whose stack ends sooner than the parser's)."""
    best, line = -1, None
    try:
        for tok, depth in _depths(source):
            if depth > best:
                best, line = depth, tok.start[0]
    except (SyntaxError, tokenize.TokenError):
        pass
    return line


@dataclasses.dataclass(frozen=True)
class Starts:
    """Where a module's statements start, as tokenize counts lines (1-based).

    `lines` holds the line of the first token of every statement and clause (`else:`,
    `except:`, `case`: each is a logical line of its own), nested ones included, in source
    order; a decorated definition's is its first `@`. `top[k]` is the index in `lines` of the
    k-th top-level statement, so the statements and clauses inside it are those up to the next.
    """

    lines: tuple[int, ...]
    top: tuple[int, ...]

    def top_level(self) -> tuple[int, ...]:
        """The start line of each top-level statement."""
        return tuple(self.lines[i] for i in self.top)

    def inside(self, k: int) -> tuple[int, ...]:
        """The start lines of the k-th top-level statement and of everything in it."""
        stop = self.top[k + 1] if k + 1 < len(self.top) else len(self.lines)
        return self.lines[self.top[k] : stop]


def statement_starts(source: bytes) -> Starts | None:
    """Where the statements start; None where the tokenizer fails, where a lone `\\r` makes its
    line count differ from libcst's, or where a line holds only a backslash (libcst joins it to
    the next into one blank line)."""
    if source.count(b"\r") != source.count(b"\r\n") or _BACKSLASH_LINE.search(source):
        return None
    return _measured(source).starts


@dataclasses.dataclass(frozen=True)
class _Measure:
    error: str | None
    starts: Starts | None


_BACKSLASH_LINE = re.compile(rb"(?m)^[ \t\f]*\\\r?$")
# Clauses that continue the compound statement before them at the same indentation.
_CLAUSES = frozenset({"else", "elif", "except", "finally"})
_SKIPPED = frozenset({token.NL, token.COMMENT, token.ENCODING})


@functools.lru_cache(maxsize=4)
def _measured(source: bytes) -> _Measure:
    # A file is parsed up to three times (plan, port, global-step move): measured once.
    quick = _scanned(source)
    if quick is not None:
        return quick
    return _tokenized(source)


def _tokenized(source: bytes) -> _Measure:
    lines: list[int] = []
    top: list[int] = []
    indent, line_start, decorated = 0, True, False
    try:
        statement_start, count = 1, 0
        for tok, depth in _depths(source):
            kind = tok.type
            if kind == token.INDENT:
                indent += 1
            elif kind == token.DEDENT:
                indent -= 1
            elif kind not in _SKIPPED and kind != token.ENDMARKER:
                if line_start and kind != token.NEWLINE:
                    # A decorator's line and the next one are the same statement.
                    if not decorated:
                        if indent == 0 and not (kind == token.NAME and tok.string in _CLAUSES):
                            top.append(len(lines))
                        lines.append(tok.start[0])
                    decorated = kind == token.OP and tok.string == "@"
                line_start = kind == token.NEWLINE
            if kind in (token.NEWLINE, token.ENDMARKER):
                statement_start, count = tok.end[0] + 1, 0
                continue
            count += 1
            if count > MAX_STATEMENT_TOKENS:
                return _Measure(
                    f"{statement_start}:1: statement too long for the parser: over "
                    f"{MAX_STATEMENT_TOKENS:,} tokens in one statement (it would take minutes); "
                    "move the data to a file of its own, or port this file by hand",
                    None,
                )
            if depth > MAX_DEPTH:
                line, column = tok.start
                return _Measure(
                    f"{line}:{column + 1}: too deeply nested for the parser: an expression over "
                    f"{MAX_DEPTH} levels deep (brackets inside brackets, or a chain of operators); "
                    "split it, or port this file by hand",
                    None,
                )
    except tokenize.TokenError as error:
        return _Measure(_refused_nesting(error), None)
    except SyntaxError:
        return _Measure(None, None)
    return _Measure(None, Starts(tuple(lines), tuple(top)))


# One match per token that matters here, as the tokenizer splits it: a string (any prefix;
# triple-quoted ones span lines), a bracket, a separator, a newline, a comment, a continuation, an
# operator or a keyword that chains; the names and numbers before it, which change no depth, ride
# along in `words` (a name right before a quote is a string's prefix, so not a word). Anything
# else (a byte outside ASCII, `$`, a string left open) is "odd" and sends the file to the
# tokenizer.
_STRING = (
    rb"[rRbBuUfF]{0,2}(?:\'\'\'(?:[^\'\\]|\\.|\'(?!\'\'))*\'\'\'|\"\"\"(?:[^\"\\]|\\.|\"(?!\"\"))*\"\"\""
    rb"|\'(?:[^\'\\\r\n]|\\.)*\'|\"(?:[^\"\\\r\n]|\\.)*\")"
)
_KEYWORDS = rb"(?:and|or|not|if|else|elif|except|finally|lambda|await|in|is)"
_WORD = rb"(?:(?!" + _KEYWORDS + rb"(?!\w))[A-Za-z_]\w*(?![\w\'\"])|\d[\w.]*|\.\d\w*)[ \t]*"
_TOKEN = re.compile(
    rb"[ \t]*(?P<words>(?:" + _WORD + rb")*)(?:"
    rb"(?P<string>" + _STRING + rb")"
    rb"|(?P<name>[A-Za-z_]\w*)"
    rb"|(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<separator>[,;])"
    rb"|(?P<newline>\r?\n)|(?P<comment>\#[^\r\n]*)|(?P<continued>\\\r?\n)"
    rb"|(?P<operator>\*\*=?|//=?|>>=?|<<=?|->|:=|\.\.\.|[-+*/%&|^~<>=!]=?|@=?|[.:])"
    rb"|(?P<odd>[^ \t])|\Z)",
    re.DOTALL,
)
_BYTES_CHAINING = frozenset(word.encode() for word in _CHAINING)
_BYTES_CLAUSES = frozenset(word.encode() for word in _CLAUSES)
_COOKIE = re.compile(rb"^[ \t]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)
_UTF8 = frozenset({b"utf-8", b"utf8"})
_SIGNATURE = b"\xef\xbb\xbf"  # UTF-8's byte order mark
_LF = ord("\n")
_BLANK = frozenset({"newline", "comment", "continued", "words"})


def _scanned(source: bytes) -> _Measure | None:
    """`_tokenized(source)` for a file far inside the limits, read by one regular expression
    instead of the tokenizer; None where in doubt (then the tokenizer decides).

    The standard library's tokenizer is pure Python before 3.12: on the dense speed tree it was
    8% of the time of the files that reach libcst, three times this scan. The scan gives the
    statement starts the tokenizer gives on every file of the speed trees, the real-code set and
    the test fixtures (tests/migrator/test_limits_scan.py), and leaves to the tokenizer a file it
    might read differently: a byte it does not know (a non-ASCII name), a form feed or lone CR
    (which move columns and lines), a declared encoding other than UTF-8 (whose bytes may look
    like quotes or backslashes), unbalanced brackets, and any file within half of a limit, so
    that a refusal and its message are always the tokenizer's. Its depth errs deep: a string is
    one token, but an f-string, whose fields Python 3.12+ tokenizes, counts as deep as its length
    could make it (the one shallower reading, a keyword glued to a number as in `1if`, is a level
    per keyword, far inside that half).
    """
    if b"\f" in source or source.count(b"\r") != source.count(b"\r\n"):
        return None
    if not _plain_utf8(source):
        return None
    lines: list[int] = []
    top: list[int] = []
    line, line_start, decorated = 1, True, False
    outer: list[tuple[int, int]] = []
    base = chain = deepest = 0
    first = len(_SIGNATURE) if source.startswith(_SIGNATURE) else 0
    statement = first  # where the logical line began: its bytes bound its tokens
    for match in _TOKEN.finditer(source, first):
        kind = match.lastgroup  # "words" at the end of the file: words and no token after them
        if line_start and (kind not in _BLANK or match.group("words")):
            at = match.start("words")
            text = source[at : at + 1]
            if not decorated:
                if (at == first or source[at - 1] == _LF) and not (
                    kind == "name" and not match.group("words") and match[kind] in _BYTES_CLAUSES
                ):
                    top.append(len(lines))
                lines.append(line)
            decorated = text == b"@"
            line_start = False
        if kind == "newline" or kind == "continued":
            line += 1
            if kind == "newline" and not outer and not line_start:
                if match.end() - statement > MAX_STATEMENT_TOKENS // 2:
                    return None
                line_start, base, chain, statement = True, 0, 0, match.end()
        elif kind == "name":
            chain += 1  # a keyword: one that chains, or a clause's (counted too: deeper)
            deepest = max(deepest, base + chain)
        elif kind == "operator":
            chain += 1
            deepest = max(deepest, base + chain)
        elif kind == "open":
            outer.append((base, chain + 1))
            base, chain = base + chain + BRACKET_DEPTH, 0
            deepest = max(deepest, base)
        elif kind == "close":
            if not outer:
                return None
            base, chain = outer.pop()
        elif kind == "separator":
            chain = 0
        elif kind == "string":
            text = match["string"]
            line += text.count(b"\n")
            if b"{" in text and text[:2].lower().strip(b"rbu'\"") == b"f":
                deepest = max(deepest, base + chain + BRACKET_DEPTH * len(text))
        elif kind == "odd":
            return None
    if len(source) - statement > MAX_STATEMENT_TOKENS // 2 or deepest > MAX_DEPTH // 2 or outer:
        return None
    return _Measure(None, Starts(tuple(lines), tuple(top)))


def _plain_utf8(source: bytes) -> bool:
    """Whether the file is UTF-8 that the tokenizer reads without a word about its encoding: no
    declaration other than UTF-8's, none beside a signature (the tokenizer is strict there), and
    bytes that decode."""
    signed = source.startswith(_SIGNATURE)
    cookie = _COOKIE.search(b"\n".join(source[3 if signed else 0 : 400].splitlines()[:2]))
    if cookie is not None and (signed or cookie[1].lower().replace(b"_", b"-") not in _UTF8):
        return False
    if source.isascii():
        return True
    try:
        source.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# The tokenizer's message for the compiler's own limit on nested brackets (Python 3.12+; the
# pure-Python tokenizer of earlier versions reads on, and the depth count above stops the file).
_PYTHON_NESTING_ERROR = "too many nested parentheses"


def _refused_nesting(error: tokenize.TokenError) -> str | None:
    """The too-deep error for brackets nested past Python's own limit, or None (any other
    tokenizer failure is left to the parser, which reports it).

    From Python 3.12 the tokenizer is the compiler's, which stops at 200 nested brackets: the
    depth count never reaches the thousands that crash libcst's parser, so a file refused for
    its nesting must be refused here rather than handed to the parser.
    """
    message, where = (*error.args, None, None)[:2]
    if message != _PYTHON_NESTING_ERROR or not isinstance(where, tuple):
        return None
    line, column = where
    return (
        f"{line}:{column}: too deeply nested for the parser: brackets nested more than the 200 "
        "levels Python itself compiles; split it, or port this file by hand"
    )


def _depths(source: bytes) -> Iterator[tuple[tokenize.TokenInfo, int]]:
    """Each token with the depth of expression it sits at: brackets it is inside (each counting
    BRACKET_DEPTH) plus the operators chained before it at each enclosing level (a bracket is one
    link of its level's chain: `f()()()`), since a comma starts a new item. `x = [-1, -2]` is
    shallow; `a+a+a+...` and `((((...))))` are deep."""
    outer: list[tuple[int, int]] = []  # (depth of the enclosing level, its chain) per bracket
    base, chain = 0, 0
    tokens = tokenize.tokenize(io.BytesIO(source).readline)
    for tok in tokens:
        kind = tok.type
        if kind == token.OP:
            text = tok.string
            if text in _OPEN:
                outer.append((base, chain + 1))
                base, chain = base + chain + BRACKET_DEPTH, 0
            elif text in _CLOSE:
                if outer:
                    base, chain = outer.pop()
            elif text in (",", ";"):
                chain = 0
            else:
                chain += 1
        elif kind == token.NAME and tok.string in _CHAINING:
            chain += 1
        elif kind == token.NEWLINE:
            outer, base, chain = [], 0, 0
        yield tok, base + chain
