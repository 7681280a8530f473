"""Parent links for every node that is not trivia, from one walk over the nodes' fields.

libcst's ParentNodeProvider asks each node it leaves for its `children`, and libcst computes
`children` by visiting them again, so the provider costs about two visitor walks of the file; a
visitor walk alone costs about as much as the scope analysis, because every node passes through
the visitor's dispatch. The children of a node are simply the nodes held in its dataclass fields
(directly or in a sequence), so reading those fields gives the same child -> parent pairs about
seven times faster. The fields that hold only trivia (migrator.codemods.shared.trivia:
whitespace, comments, punctuation, two thirds of the nodes) are not read at all: nothing here
asks for the parent of a comma.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
from libcst.metadata import BatchableMetadataProvider

from .trivia import trivia_fields

_FIELDS: dict[type, tuple[str, ...]] = {}


class ParentProvider(BatchableMetadataProvider[cst.CSTNode]):
    """ParentNodeProvider's mapping less the trivia nodes; the module itself has no parent.

    Batchable so that it is resolved in the same round as the expression contexts: each round
    the wrapper resolves costs a walk of its own (migrator.codemods.shared.visiting).
    """

    def visit_Module(self, node: cst.Module) -> None:
        self._computed.update(_links(node))


def _links(module: cst.Module) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
    links = []
    stack: list[cst.CSTNode] = [module]
    kinds = KINDS
    while stack:
        node = stack.pop()
        for name in _field_names(type(node)):
            value = getattr(node, name)
            kind = kinds.get(type(value)) or field_kind(type(value))
            if kind is NODE:
                links.append((value, node))
                stack.append(value)
            elif kind is SEQUENCE:
                for item in value:
                    if (kinds.get(type(item)) or field_kind(type(item))) is NODE:
                        links.append((item, node))
                        stack.append(item)
    return links


NODE, SEQUENCE, OTHER = "node", "sequence", "other"
# type -> what a field holding a value of it holds; read inline by the hot loops
KINDS: dict[type, str] = {}


def field_kind(value_type: type) -> str:
    # Cached per type: isinstance against the CSTNode ABC is slow, and this runs per field.
    kind = KINDS.get(value_type)
    if kind is None:
        if issubclass(value_type, cst.CSTNode):
            kind = NODE
        elif issubclass(value_type, (list, tuple)):
            kind = SEQUENCE
        else:
            kind = OTHER
        KINDS[value_type] = kind
    return kind


def _field_names(node_type: type) -> tuple[str, ...]:
    """The fields of `node_type` that can hold a node other than trivia."""
    names = _FIELDS.get(node_type)
    if names is None:
        skipped = trivia_fields(node_type)
        names = _FIELDS[node_type] = tuple(
            f.name for f in dataclasses.fields(node_type) if f.name not in skipped
        )
    return names
