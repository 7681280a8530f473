"""LineIndex gives every node exactly the start line PositionProvider gives it."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from cli_runner import MIGRATOR_FIXTURES
from cst_nodes import all_nodes
from libcst.metadata import MetadataWrapper, PositionProvider

from migrator.codemods.shared import lines
from migrator.codemods.shared.lines import LineIndex, LineProvider, count_newlines, start_line
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.trivia import TRIVIA
from migrator.findings import SourceError
from migrator.pipeline import transform
from migrator.sources import limits

FIXTURES = MIGRATOR_FIXTURES

TRICKY = {
    "crlf": (
        "import os\r\n\r\n# lead\r\ndef f(a,\r\n      b):\r\n"
        "    return '''x\r\ny'''\r\n\r\nclass C:\r\n    x = (1,\r\n         2)\r\n"
    ),
    "lone_cr": "x = 1\ry = 2\r\r# c\rdef f():\r    return (3,\r            4)\r",
    "mixed_newlines": "a = 1\r\nb = 2\nc = 3\rd = (1,\r\n 2)\n\r\ne = 4\r\r\n",
    # The first line break is inside the string, so the file's default newline is \r, and
    # libcst counts that \r as a line break although Python does not.
    "cr_in_string": 'x = """a\rb"""\ny = 1\nz = 2\n',
    "header_no_trailing_newline": "#!/usr/bin/env python\n# header\n\n\nimport os\nx = os.sep",
    "comments_and_blank_lines": (
        "\n\n# lead\nx = 1\n\n\n# between\n\ny = 2  # trailing\n"
        "if x:\n\n    # inside\n    z = 3\n\n# dedented comment\n    w = 4\n# footer\n\n"
    ),
    "decorators_and_nesting": (
        "@decorator\n# between decorators\n@other(\n    1,\n)\n\nclass A(Base):\n"
        '    """Doc\n    string."""\n\n    # c\n    @staticmethod\n    def f(x):\n'
        "        def g():\n            class B:\n                pass\n\n"
        "            return B\n        return g\n\n\n@d\nasync def h():\n    await x\n"
    ),
    "backslash_continuations": (
        "x = 1 + \\\n    2\nif a and \\\n   b:\n    pass\nfrom os import \\\n    path\n"
        "x = 1\n\\\n\ny = 2\nassert x, \\\n  'message'\n"
    ),
    "multi_line_strings": (
        'x = """a\nb\n"""\ny = f"""\n{x}\n"""\nz = ("implicit"\n     "concat")\n'
        "def f():\n    '''doc\n\n    more'''\n    return b'''\\r\n'''\n"
    ),
    "clauses_after_comments": (
        "class A:\n    # c\n\n    @d(\n        1)\n    def f(self):\n"
        "        try:\n            x = 1\n"
        "        # before except*\n        except* E as e:\n            pass\n\n"
        "        # before else\n        else:\n            if a: b = (1,\n 2)\n"
        "            # before elif\n            elif c:\n                d()\n"
        "        finally: pass\n    match q:\n        # a case\n        case _: r = [\n1]\n"
    ),
    "tabs_and_semicolons": "if x:\n\ta = 1; b = 2\n\tif y:\n\t\tc = 3\nelse: d = 4\n",
    "compound": (
        "try:\n    pass\nexcept (A,\n        B) as e:\n    raise\nelse:\n    pass\n"
        "finally:\n    pass\nwith a as b, \\\n     c:\n    pass\nwhile x:\n    break\n"
        "for i in (\n    y\n):\n    continue\nmatch p:\n    case [1,\n          2]:\n        pass\n"
    ),
    "empty": "",
    "only_newlines": "\n\n",
    "only_comment": "# c",
    "footer_after_block": "if x:\n    pass\n\\\n\n# c\n",
}


def _mismatches(wrapper: MetadataWrapper) -> list[str]:
    module = wrapper.module
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentProvider)
    index = LineIndex(module)
    nodes = all_nodes(module)
    assert len(nodes) == len(positions)  # the walk saw every node PositionProvider saw
    lines = {n: index.line(n, parents) for n in nodes}
    return [
        f"{type(n).__name__}: {lines[n]} != {positions[n].start.line}"
        for n in nodes
        if lines[n] != positions[n].start.line
    ]


def _real_nodes(root: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes an analyzer may ask the line of: not trivia, which has no parent links (and
    would be answered from a PositionProvider run over the whole file)."""
    return [n for n in all_nodes(root) if type(n) not in TRIVIA]


def _fixture_sources() -> list[Path]:
    return sorted(FIXTURES.rglob("*.py"))


@pytest.mark.parametrize("path", _fixture_sources(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_node_of_every_fixture(path: Path) -> None:
    try:
        module = cst.parse_module(path.read_bytes())
    except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError):
        pytest.skip("libcst cannot parse it")
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_every_node_of_tricky_sources(name: str) -> None:
    module = cst.parse_module(TRICKY[name])
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_every_node_of_tricky_sources_by_partial_code(name: str, monkeypatch) -> None:
    # Every lookup generates the statement's code only up to its node, as the first few do.
    monkeypatch.setattr(lines, "PARTIAL_LOOKUPS", 10**9)
    module = cst.parse_module(TRICKY[name])
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []


@pytest.mark.parametrize("path", _fixture_sources(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_node_of_some_fixtures_by_partial_code(path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lines, "PARTIAL_LOOKUPS", 10**9)
    try:
        module = cst.parse_module(path.read_bytes())
    except (cst.ParserSyntaxError, UnicodeDecodeError, SyntaxError):
        pytest.skip("libcst cannot parse it")
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []


def _parsed(source: bytes) -> cst.Module:
    """Parsed as the migrator parses, which hands the tokenizer's statement starts over."""
    try:
        return transform.parse(source)
    except SourceError:
        pytest.skip("the migrator refuses it")


def _starts_are_used(module: cst.Module) -> bool:
    return LineIndex(module)._starts is not None


def _no_statement_code(monkeypatch) -> list[cst.CSTNode]:
    """Record every statement whose code is generated to find where its parts begin, or up to
    a node inside a statement or clause nested in it: with the tokenizer's lines, a node's code
    is generated from its innermost one only."""
    generated: list[cst.CSTNode] = []
    original_begins, original_start = lines._begins, lines._start_line

    def begins(stmt: cst.BaseStatement, module: cst.Module) -> dict:
        generated.append(stmt)
        return original_begins(stmt, module)

    def start(owner: cst.CSTNode, node: cst.CSTNode, module: cst.Module) -> int | None:
        nested = lines._owners(owner)[1:] if lines._owns_lines(type(owner)) else []
        if any(node in all_nodes(inner) for inner in nested):
            generated.append(owner)
        return original_start(owner, node, module)

    monkeypatch.setattr(lines, "_begins", begins)
    monkeypatch.setattr(lines, "_start_line", start)
    return generated


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_every_node_of_tricky_sources_from_the_tokenizers_starts(name: str, monkeypatch) -> None:
    source = TRICKY[name].encode()
    module = _parsed(source)
    generated = _no_statement_code(monkeypatch)
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []
    # libcst counts a lone CR as a line break, Python does not; and it makes a line holding only
    # a backslash one blank line with the next
    odd = b"\r" in source.replace(b"\r\n", b"") or b"\n\\\n" in source
    assert _starts_are_used(module) is not odd
    assert odd or generated == []


@pytest.mark.parametrize("path", _fixture_sources(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_node_of_every_fixture_from_the_tokenizers_starts(path: Path, monkeypatch) -> None:
    source = path.read_bytes()
    module = _parsed(source)
    generated = _no_statement_code(monkeypatch)
    assert _starts_are_used(module)
    assert _mismatches(MetadataWrapper(module, unsafe_skip_copy=True)) == []
    assert generated == []


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_the_statements_and_clauses_of_a_statement_are_those_its_code_marks(name: str) -> None:
    module = cst.parse_module(TRICKY[name])
    for stmt in module.body:
        assert lines._owners(stmt) == list(lines._begins(stmt, module))


def test_the_tokenizer_sees_every_statement_and_clause_and_a_decorated_definition_as_one() -> None:
    source = b"@a\n# c\n@b(\n  1)\nclass C:\n    pass\nelse_ = 1\nif x:\n  y\nelse:\n  z\n"
    starts = limits.statement_starts(source)
    assert starts is not None
    assert starts.lines == (1, 6, 7, 8, 9, 10, 11)
    assert starts.top_level() == (1, 7, 8)
    assert starts.inside(0) == (1, 6) and starts.inside(2) == (8, 9, 10, 11)


def test_fixtures_were_found() -> None:
    assert len(_fixture_sources()) > 20


class _AddStatements(cst.CSTTransformer):
    """Builds nodes the parser never made: default newlines, new comment lines, new statements,
    and empty blocks (their code is a `pass` and a newline that no node holds)."""

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        (first, *rest) = original_node.body
        if not rest and isinstance(first, cst.SimpleStatementLine):
            if [type(s) for s in first.body] == [cst.Pass]:
                return updated_node.with_changes(body=[])
        extra = cst.parse_statement("added = (1,\n    2)\n").with_changes(
            leading_lines=[cst.EmptyLine(comment=cst.Comment("# added")), cst.EmptyLine()]
        )
        return updated_node.with_changes(body=[extra, *updated_node.body])


@pytest.mark.parametrize("name", ["crlf", "lone_cr", "decorators_and_nesting", "compound"])
def test_every_node_of_a_transformed_tree(name: str) -> None:
    moved = cst.parse_module(TRICKY[name]).visit(_AddStatements())
    assert _mismatches(MetadataWrapper(moved)) == []  # deep copy, as transform.py does


def test_newlines_are_counted_like_libcst() -> None:
    from libcst.metadata.position_provider import NEWLINE_RE

    for text in ["", "a", "\n", "\r", "\r\n", "\n\r", "\r\r\n\n", "a\r\nb\rc\nd\r\n\r"]:
        assert count_newlines(text) == len(NEWLINE_RE.findall(text)), repr(text)


def test_analyzers_never_resolve_positions_of_the_whole_file(monkeypatch) -> None:
    source = TRICKY["decorators_and_nesting"] + TRICKY["compound"]
    sizes: list[int] = []  # statements in each module PositionProvider runs over
    walks: list[int] = []  # batched walks, one per round of libcst's metadata resolution
    marked: list[cst.BaseStatement] = []  # statements whose code was generated with their marks
    original_gen, original_walk = PositionProvider._gen_impl, MetadataWrapper.visit_batched
    original_begins = lines._begins

    def begins(stmt: cst.BaseStatement, module: cst.Module) -> dict:
        marked.append(stmt)
        return original_begins(stmt, module)

    def gen(self: PositionProvider, module: cst.Module) -> None:
        sizes.append(len(module.body))
        original_gen(self, module)

    def walk(self: MetadataWrapper, *args, **kwargs) -> cst.CSTNode:
        walks.append(len(self.module.body))
        return original_walk(self, *args, **kwargs)

    monkeypatch.setattr(PositionProvider, "_gen_impl", gen)
    monkeypatch.setattr(MetadataWrapper, "visit_batched", walk)
    monkeypatch.setattr(lines, "_begins", begins)

    class AskEveryBodyNode(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (ParentProvider, LineProvider)

        def __init__(self) -> None:
            super().__init__()
            self.lines: dict[cst.CSTNode, int] = {}

        def visit_Module(self, node: cst.Module) -> None:
            for stmt in node.body:
                for n in _real_nodes(stmt):
                    self.lines[n] = start_line(self, n)

    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    first, second = AskEveryBodyNode(), AskEveryBodyNode()
    wrapper.visit(first)
    wrapper.visit(second)  # a second analyzer on the same wrapper reuses the index
    # Each statement's first lookups generate its code up to the node; one asked about more
    # often has its code generated once with the lines its parts begin on, which answers the
    # rest. PositionProvider never runs.
    many = [s for s in wrapper.module.body if len(_real_nodes(s)) > lines.PARTIAL_LOOKUPS]
    assert many
    assert marked == many and sizes == []
    # LineProvider is resolved with ParentProvider in one round, and asking adds no walk.
    assert walks == [len(wrapper.module.body)]
    positions = wrapper.resolve(PositionProvider)
    assert first.lines == second.lines == {n: positions[n].start.line for n in first.lines}
