"""The quick scan of migrator.sources.limits gives what the tokenizer gives, or steps aside.

Every file that reaches libcst is measured (statement starts, depth, statement length); the scan
replaces the standard library's tokenizer there, so wherever it answers it must answer exactly as
the tokenizer does, and where it cannot be sure it must answer None.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from migrator.sources import limits

FIXTURES = Path(__file__).parent / "fixtures"

# Shapes whose statement starts depend on more than line breaks.
READ_ALIKE: dict[str, bytes] = {
    "decorators": b"@a\n# c\n@b(\n  1)\nclass C:\n    @staticmethod\n    def f(): pass\n",
    "clauses_at_top": b"for i in x:\n    y\nelse:\n    z\ntry:\n    a\nexcept E:\n    b\n"
    b"finally:\n    c\nif p:\n    q\nelif r:\n    s\n",
    "clause_words_as_names": b"else_ = 1\nfinally_x = 2\nelif_ = else_\n",
    "strings": b'x = rb"\\"(" + Rb\'[\' + f"{a}" + u"x"\ny = """\n(\n""" + \'\'\'\n\'\'\'\nz = 1\n',
    "escaped_quotes": b's = "a\\"b(" ; t = \'c\\\'[\'\nu = """x\\""""\nv = 2\n',
    "continuation": b"x = 1 + \\\n    2\ny = (1,\n\n  # inside\n  2)\nz = 3\n",
    "string_continuation": b"s = 'a\\\nb('\nt = 1\n",
    "semicolons": b"a = 1; b = 2\nif a: b = 3; c = 4\n",
    "docstring_first": b'"""Module.\n\nMore."""\nimport os\n',
    "blank_and_comment_lines": b"\n\n# a\n   # b\nx = 1\n\n\n    # c\ny = 2\n",
    "no_final_newline": b"x = 1\ny = f(x)",
    "word_at_end": b"x = 1\ny",
    "utf8_signature": b"\xef\xbb\xbfx = 1\ndef f():\n    return 2\n",
    "crlf": b"x = 1\r\nif x:\r\n    y = (1,\r\n  2)\r\n",
    "non_ascii_in_strings": "s = 'é('  # ü [\nt = 1\n".encode(),
    "utf8_cookie": b"# -*- coding: utf-8 -*-\nx = 1\n",
    "numbers": b"x = 1e-5 + .5 + 0x1F + 1_000 + 1j\ny = x if x else 2\n",
    "keywords_chain": b"x = a and not b or c in d is e\ny = lambda: 1\n",
    "tabs": b"if x:\n\ty = 1\n\tif y:\n\t\tz = 2\nw = 3\n",
    "match": b"match x:\n    case 1:\n        y = 2\n    case _:\n        pass\n",
    "async": b"async def f():\n    async with a as b:\n        await c\n",
    "walrus_and_arrow": b"def f(a) -> int:\n    if (n := a):\n        return n\n",
}

# What the scan leaves to the tokenizer.
LEFT_TO_THE_TOKENIZER: dict[str, bytes] = {
    "non_ascii_name": "café = 1\n".encode(),
    "dollar": b"x = $y\n",
    "latin1_cookie": b"# -*- coding: latin-1 -*-\nx = 'caf\xe9'\n",
    "not_utf8": b"x = 'caf\xe9'\n",
    "signature_and_cookie": b"\xef\xbb\xbf# coding: utf8\nx = 1\n",
    "form_feed": b"x = 1\n\x0cy = 2\n",
    "lone_cr": b"x = 1\ry = 2\n",
    "unbalanced": b"x = (1))\n",
    "unclosed": b"x = (1,\n",
    "open_string": b"x = '''abc\ny = 1\n",
    "deep_chain": ("x = " + ".".join(["a"] * (limits.MAX_DEPTH // 2 + 5)) + "\n").encode(),
    "deep_brackets": ("x = " + "(" * 200 + "1" + ")" * 200 + "\n").encode(),
    "long_statement": ("x = [" + ", ".join(["1"] * 13_000) + "]\n").encode(),
    "long_f_string": ('x = f"{a}' + "b" * 200 + '"\n').encode(),
}


@pytest.mark.parametrize("name", sorted(READ_ALIKE))
def test_the_scan_reads_starts_as_the_tokenizer_does(name: str) -> None:
    source = READ_ALIKE[name]
    scanned = limits._scanned(source)
    assert scanned is not None
    assert scanned == limits._tokenized(source)


def test_the_scan_gives_every_start() -> None:
    scanned = limits._scanned(READ_ALIKE["decorators"])
    assert scanned is not None and scanned.starts is not None
    assert scanned.starts.lines == (1, 6)
    assert scanned.starts.top_level() == (1,)


@pytest.mark.parametrize("name", sorted(LEFT_TO_THE_TOKENIZER))
def test_the_scan_leaves_what_it_may_misread_or_what_nears_a_limit(name: str) -> None:
    assert limits._scanned(LEFT_TO_THE_TOKENIZER[name]) is None


def test_every_fixture_is_scanned_as_the_tokenizer_reads_it() -> None:
    sources = [path.read_bytes() for path in sorted(FIXTURES.rglob("*.py"))]
    assert len(sources) > 200
    answered = 0
    for source in sources:
        scanned = limits._scanned(source)
        if scanned is not None:
            answered += 1
            assert scanned == limits._tokenized(source)
    assert answered > 0.95 * len(sources)
