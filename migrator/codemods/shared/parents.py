"""Parent links for every node, from one walk over the nodes' fields.

libcst's ParentNodeProvider asks each node it leaves for its `children`, and libcst computes
`children` by visiting them again, so the provider costs about two visitor walks of the file; a
visitor walk alone costs about as much as the scope analysis, because every node passes through
the visitor's dispatch. The children of a node are simply the nodes held in its dataclass fields
(directly or in a sequence), so reading those fields gives the same child -> parent pairs about
seven times faster. Resolved beside other batchable providers by the migrator's own wrapper
(migrator.codemods.shared.visiting.Wrapper), the links are recorded by the walk those need
anyway, and cost no walk of their own.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
from libcst.metadata import BatchableMetadataProvider

_FIELDS: dict[type, tuple[str, ...]] = {}


class ParentProvider(BatchableMetadataProvider[cst.CSTNode]):
    """Drop-in for ParentNodeProvider: the same mapping, the module itself has no parent.

    Batchable so that it is resolved in the same round as the expression contexts, whose walk
    `Wrapper` makes record the links (`record`); under any other wrapper, or alone, the module's
    visit reads them with `_links`.
    """

    def visit_Module(self, node: cst.Module) -> None:
        self._computed.update(_links(node))

    def record(self, links: dict[cst.CSTNode, cst.CSTNode]) -> None:
        """Take every child -> parent link at once (set_metadata per node cost a tenth of it)."""
        self._computed.update(links)


def _links(module: cst.Module) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
    links = []
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for name in _field_names(type(node)):
            value = getattr(node, name)
            kind = field_kind(type(value))
            if kind is NODE:
                links.append((value, node))
                stack.append(value)
            elif kind is SEQUENCE:
                for item in value:
                    if field_kind(type(item)) is NODE:
                        links.append((item, node))
                        stack.append(item)
    return links


NODE, SEQUENCE, OTHER = "node", "sequence", "other"
_KINDS: dict[type, str] = {}


def field_kind(value_type: type) -> str:
    # Cached per type: isinstance against the CSTNode ABC is slow, and this runs per field.
    kind = _KINDS.get(value_type)
    if kind is None:
        if issubclass(value_type, cst.CSTNode):
            kind = NODE
        elif issubclass(value_type, (list, tuple)):
            kind = SEQUENCE
        else:
            kind = OTHER
        _KINDS[value_type] = kind
    return kind


def _field_names(node_type: type) -> tuple[str, ...]:
    names = _FIELDS.get(node_type)
    if names is None:
        names = _FIELDS[node_type] = tuple(f.name for f in dataclasses.fields(node_type))
    return names
