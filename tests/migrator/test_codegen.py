"""`bytes_of` and `code_of` give exactly libcst's `Module.bytes` and `Module.code`."""

from __future__ import annotations

import libcst as cst
from cli_runner import MIGRATOR_FIXTURES

from migrator.codemods.shared.codegen import bytes_of, code_of

ODD = [
    "# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n".encode("latin-1"),
    b"\xef\xbb\xbfx = 1\r\ny = (1,\r\n     2)\r\n",
    b"def f():\n\tif x:\n\t\treturn [a  for a in b]  # c\n",
    b"",
]


def test_same_code_and_bytes_as_libcst() -> None:
    checked = 0
    sources = [p.read_bytes() for p in sorted(MIGRATOR_FIXTURES.rglob("*.py"))] + ODD
    for source in sources:
        try:
            module = cst.parse_module(source)
        except cst.ParserSyntaxError:
            continue  # fixtures that do not parse on purpose
        assert code_of(module) == module.code
        assert bytes_of(module) == module.bytes
        checked += 1
    assert checked > 100


def test_a_changed_tree_is_printed_as_libcst_prints_it() -> None:
    module = cst.parse_module(b"import a\nx = a.b(1, c=2)\n")
    changed = module.with_changes(
        body=[*module.body, cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name("g")))])]
    )
    assert bytes_of(changed) == changed.bytes == b"import a\nx = a.b(1, c=2)\ng()\n"
