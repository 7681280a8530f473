"""Which nodes count as trivia, and which fields hold nothing else, checked on parsed trees."""

from __future__ import annotations

import dataclasses

import libcst as cst
from cli_runner import MIGRATOR_FIXTURES
from cst_nodes import all_nodes

from migrator.codemods.shared.trivia import TRIVIA, trivia_fields


def _modules() -> list[cst.Module]:
    found = []
    for path in sorted(MIGRATOR_FIXTURES.rglob("*.py")):
        try:
            found.append(cst.parse_module(path.read_bytes()))
        except cst.ParserSyntaxError:
            continue  # fixtures that do not parse on purpose
    return found


def test_trivia_is_whitespace_comments_and_punctuation() -> None:
    names = {one.__name__ for one in TRIVIA}
    assert {"SimpleWhitespace", "Newline", "Comment", "EmptyLine", "Comma", "Dot"} <= names
    assert {"LeftParen", "RightSquareBracket", "AssignEqual", "Add", "NotIn"} <= names
    assert not names & {"Name", "Attribute", "Call", "Arg", "Param", "Annotation", "Decorator"}
    assert not any(issubclass(one, (cst.BaseExpression, cst.BaseStatement)) for one in TRIVIA)


def test_fields_held_as_trivia_hold_only_trivia_in_real_trees() -> None:
    """Every value met in a field said to hold only trivia is trivia (or a plain value), and
    every node below a trivia node is trivia: skipping those fields skips nothing else."""
    seen = 0
    for module in _modules():
        for node in all_nodes(module):
            skipped = trivia_fields(type(node))
            if type(node) in TRIVIA:
                assert skipped == {f.name for f in dataclasses.fields(node)}
            for name in skipped:
                value = getattr(node, name)
                for item in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(item, cst.CSTNode):
                        assert type(item) in TRIVIA, (type(node).__name__, name)
                        seen += 1
    assert seen > 10_000


def test_fields_that_can_hold_more_than_trivia_are_kept() -> None:
    assert trivia_fields(cst.Name) == {"value", "lpar", "rpar"}
    assert "names" not in trivia_fields(cst.ImportFrom)  # aliases, or a trivia `*`
    assert {"func", "args"}.isdisjoint(trivia_fields(cst.Call))
    assert {"body", "leading_lines"} & trivia_fields(cst.SimpleStatementLine) == {"leading_lines"}
