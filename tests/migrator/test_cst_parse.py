"""Parsing without libcst's per-node validation gives libcst's own tree, and leaves validation on
for every node built afterwards, after a failed parse too."""

from __future__ import annotations

import libcst as cst
import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.pipeline import cst_parse


def _sources() -> list[bytes]:
    found = []
    for path in sorted(MIGRATOR_FIXTURES.rglob("*.py")):
        data = path.read_bytes()
        try:
            cst.parse_module(data)
        except cst.ParserSyntaxError:
            continue
        found.append(data)
    return found


def test_the_same_tree_as_libcst_for_every_fixture() -> None:
    sources = _sources()
    assert len(sources) > 100
    assert cst_parse._KNOWN  # the pinned libcst: the unvalidated path is the one tested
    for source in sources:
        ours, theirs = cst_parse.parse_module(source), cst.parse_module(source)
        assert ours.deep_equals(theirs)
        assert ours.bytes == theirs.bytes == source


def test_validation_is_back_on_afterwards() -> None:
    cst_parse.parse_module(b"x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")
    with pytest.raises(cst.ParserSyntaxError):
        cst_parse.parse_module(b"x = (\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Integer("1.5")
