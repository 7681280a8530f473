"""ParentProvider (a field walk) gives libcst's ParentNodeProvider mapping for every node that is
not trivia (whitespace, comments, punctuation), and leaves most trivia out."""

from __future__ import annotations

import libcst as cst
import pytest
from cli_runner import MIGRATOR_FIXTURES
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.trivia import TRIVIA

FIXTURES = MIGRATOR_FIXTURES
TRICKY = '''\
@decorator(arg)
class A(Base, metaclass=M):
    """doc"""
    x: int = 1
    def f(self, *args, y=2, **kw) -> "A":
        with a as b, c:
            return [i async for i in g() if i] or {k: v for k, v in kw.items()}
lambda q, /, r=1: (yield from s)
try:
    pass
except (E1, E2) as e:
    raise X from e
finally:
    del t[1:2, ::3]
match p:
    case {"k": [1, *rest]} | Point(x=0):
        print(f"{rest!r:>{width}}")
'''


def _sources() -> list[tuple[str, bytes]]:
    found = [(str(p.relative_to(FIXTURES)), p.read_bytes()) for p in FIXTURES.rglob("*.py")]
    return [*sorted(found), ("tricky", TRICKY.encode())]


@pytest.mark.parametrize(
    ("name", "source"), _sources(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_same_links_as_libcst(name, source):
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        pytest.skip("fixture that is meant not to parse")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    ours = dict(wrapper.resolve(ParentProvider))
    theirs = dict(wrapper.resolve(ParentNodeProvider))

    def real(links: dict) -> dict:
        return {child: parent for child, parent in links.items() if type(child) not in TRIVIA}

    assert real(ours) == real(theirs)
    assert ours.items() <= theirs.items()  # a trivia node read at all has its own parent
    assert module not in ours
    trivia = len(theirs) - len(real(theirs))
    assert len(theirs) - len(ours) >= trivia * 0.9  # nearly all of it is left out
