"""`ported_bytes` copies the statements the ports left alone from the file and gives exactly the
bytes libcst would generate for the whole ported module."""

from __future__ import annotations

import libcst as cst
import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.codemods.shared.codegen import bytes_of
from migrator.codemods.shared.splice import _spans, ported_bytes
from migrator.findings import SourceError
from migrator.pipeline import transform

ODD = [
    b"# header\n\n# more\nimport a\n\n\n# before\n@d  # c\n# between\n@e\ndef f():\n    pass\n"
    b"# trailing\n\n",
    b"x = 1\r\ny = (1,\r\n     2)\r\n# c\r\n",
    b"def f():\n\tif x:\n\t\treturn [a  for a in b]  # c\n\n\n\nclass C:\n\tpass\n",
    b"if a:\n    b()\nelse:\n    c()\n# between\ntry:\n    d()\nexcept E:\n    pass\n"
    b"x = 1; y = 2\n",
    b"s = '''\nimport not_here\n'''\nt = 1\n",
    b"# only a comment\n",
    b"\n\n\nx = 1\n\n\n",
    # Where the lines cannot be paired: copied nowhere, generated whole.
    b"\xef\xbb\xbfx = 1\ny = 2\n",
    b"x = 1\ny = 2",
    b"x = 1\ry = 2\r",
    b"x = 1\n\\\ny = 2\n",
    b"",
]


def _sources() -> list[bytes]:
    return [p.read_bytes() for p in sorted(MIGRATOR_FIXTURES.rglob("*.py"))] + ODD


def _edited(module: cst.Module) -> list[cst.Module]:
    """The module with statements replaced by equal new objects, added, and removed."""
    body = list(module.body)
    fresh = [s.deep_clone() if i % 2 else s for i, s in enumerate(body)]
    added = cst.parse_statement("import npu_lossscale\n")
    return [
        module.with_changes(body=fresh),
        module.with_changes(body=[added, *body]),
        module.with_changes(body=body[1:]),
        module.with_changes(body=[*body[:-1], added]),
    ]


def test_same_bytes_as_generating_the_whole_module() -> None:
    copied = 0
    for source in _sources():
        try:
            parsed = transform.parse(source)
        except SourceError:
            continue  # fixtures that do not parse on purpose
        copied += _spans(parsed, source) is not None
        assert ported_bytes(parsed, parsed, source) == bytes_of(parsed)
        for ported in _edited(parsed):
            assert ported_bytes(ported, parsed, source) == bytes_of(ported)
    assert copied > 100


@pytest.mark.parametrize("source", ODD[:7])
def test_odd_layouts_are_copied(source: bytes) -> None:
    assert _spans(transform.parse(source), source) is not None


@pytest.mark.parametrize("source", ODD[7:])
def test_what_cannot_be_paired_is_generated(source: bytes) -> None:
    assert _spans(transform.parse(source), source) is None


def test_a_tree_not_just_parsed_is_generated() -> None:
    source = b"import a\nx = 1\n"
    parsed = transform.parse(source)
    transform.parse(b"y = 2\n")  # only the last parse's lines are remembered
    assert _spans(parsed, source) is None
    changed = parsed.with_changes(body=[parsed.body[0]])
    assert ported_bytes(changed, parsed, source) == b"import a\n"


def test_a_changed_header_is_generated() -> None:
    source = b"# a\nx = 1\n"
    parsed = transform.parse(source)
    changed = parsed.with_changes(header=[cst.EmptyLine(comment=cst.Comment("# b"))])
    assert ported_bytes(changed, parsed, source) == b"# b\nx = 1\n"


def test_the_port_of_every_fixture() -> None:
    """What the pipeline writes is what generating the ported module gives."""
    changed = 0
    for path in sorted(MIGRATOR_FIXTURES.rglob("*.py")):
        source = path.read_bytes()
        try:
            parsed = transform.parse(source)
        except SourceError:
            continue
        wrapper = transform.Wrapper(parsed, unsafe_skip_copy=True)
        wrapper.resolve_many(transform.LOSS_SCALE_METADATA | transform.TORCH_METADATA)
        ported, findings = transform._port(wrapper, source, str(path), transform.MigrateOptions())
        if ported is not parsed:
            changed += 1
            assert ported_bytes(ported, parsed, source) == bytes_of(ported), path
    assert changed > 40


def test_the_global_step_move_keeps_the_statements_it_does_not_edit() -> None:
    """The move rebuilds only the top-level statements holding what it edits: the others stay
    the parsed objects, whose bytes are copied, and the result is what generating it gives."""
    from migrator.codemods import global_step

    moved_files = 0
    for path in sorted(MIGRATOR_FIXTURES.rglob("*.py")):
        source = path.read_bytes()
        if b"global_step" not in source:
            continue
        try:
            parsed = transform.parse(source)
        except SourceError:
            continue
        wrapper = transform.Wrapper(parsed, unsafe_skip_copy=True, source=source)
        moved, _ = global_step.rewrite(wrapper, str(path), None)
        if moved is parsed:
            continue
        moved_files += 1
        same = [a is b for a, b in zip(parsed.body, moved.body)]
        assert any(same) and not all(same), path
        assert all(a is b for a, b in zip(parsed.header, moved.header)), path
        assert ported_bytes(moved, parsed, source) == bytes_of(moved), path
    assert moved_files >= 4
