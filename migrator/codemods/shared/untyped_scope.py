"""libcst's scope analysis in a file that never spells `typing`: its visit_Call and
visit_Subscript without the questions whose answer is then no.

libcst's scope analysis asks, at every call, for the qualified names of what is called (the
arguments of typing's NewType, TypeVar and cast are type hints), and at every subscript of a name
whether it names a typing generic: 50,000 lookups over the dense speed tree's libcst files. A
qualified name is built from the identifiers of the code (an import's module and names, the
classes and functions around a local name) or is a `builtins.` one, so in a file that never spells
`typing` every answer is no, and the two methods only push what they push then.
migrator.codemods.shared.visiting calls these instead while a `Wrapper` given such a file's bytes
resolves metadata, and only while libcst's methods read exactly as below (libcst is pinned).
"""

from __future__ import annotations

import inspect
import textwrap

import libcst as cst
from libcst.metadata.scope_provider import ScopeVisitor

_SCOPE_VISIT_CALL = """def visit_Call(self, node: cst.Call) -> Optional[bool]:
    self.__top_level_attribute_stack.append(None)
    self.__in_type_hint_stack.append(False)
    qnames = {qn.name for qn in self.scope.get_qualified_names_for(node)}
    if "typing.NewType" in qnames or "typing.TypeVar" in qnames:
        node.func.visit(self)
        self.__in_type_hint_stack[-1] = True
        for arg in node.args[1:]:
            arg.visit(self)
        return False
    if "typing.cast" in qnames:
        node.func.visit(self)
        if len(node.args) > 0:
            self.__in_type_hint_stack.append(True)
            node.args[0].visit(self)
            self.__in_type_hint_stack.pop()
            for arg in node.args[1:]:
                arg.visit(self)
        return False
    return True
"""
_SCOPE_VISIT_SUBSCRIPT = """def visit_Subscript(self, node: cst.Subscript) -> Optional[bool]:
    in_type_hint = False
    if isinstance(node.value, cst.Name):
        qnames = {qn.name for qn in self.scope.get_qualified_names_for(node.value)}
        if any(qn.startswith(("typing.", "typing_extensions.")) for qn in qnames):
            in_type_hint = True
        if "typing.Literal" in qnames or "typing_extensions.Literal" in qnames:
            self.__in_ignored_subscript.add(node)

    self.__in_type_hint_stack.append(in_type_hint)
    return True
"""
KNOWN = all(
    textwrap.dedent(inspect.getsource(method)) == known
    for method, known in (
        (ScopeVisitor.visit_Call, _SCOPE_VISIT_CALL),
        (ScopeVisitor.visit_Subscript, _SCOPE_VISIT_SUBSCRIPT),
    )
)


def untyped_visit_call(visitor: ScopeVisitor, node: cst.Call) -> bool:
    visitor._ScopeVisitor__top_level_attribute_stack.append(None)  # type: ignore[attr-defined]
    visitor._ScopeVisitor__in_type_hint_stack.append(False)  # type: ignore[attr-defined]
    return True


def untyped_visit_subscript(visitor: ScopeVisitor, node: cst.Subscript) -> bool:
    visitor._ScopeVisitor__in_type_hint_stack.append(False)  # type: ignore[attr-defined]
    return True


METHODS = {cst.Call: untyped_visit_call, cst.Subscript: untyped_visit_subscript}
