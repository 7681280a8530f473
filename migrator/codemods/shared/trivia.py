"""Trivia: the whitespace, comments and punctuation nodes, which no analysis here looks at.

About two thirds of the nodes libcst parses from a training script are trivia: a third of all
nodes are SimpleWhitespace alone, then newlines, dots, commas, brackets and operators. The scope
and expression-context analyses and our own visitors have no method for any of them, yet a walk
enters each (the parent links and the scope analysis even record one entry per node). A node's
fields that can hold nothing but trivia (by their type annotations: `whitespace_after`, `comma`,
`lpar`, `leading_lines`...) can be skipped by such a walk without any visitor method missing a
call; what goes is the metadata of the trivia nodes themselves, which nothing asks for.

A trivia class here is a concrete class of libcst's whitespace or operator modules, or a
bracket, whose own fields are again trivia or plain values (checked when the set is built: a
libcst release that changed that would shrink the set, never make a walk skip a real node).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

import libcst as cst
from libcst._maybe_sentinel import MaybeSentinel

_SCALARS = (str, bool, int, type(None), MaybeSentinel)
_BRACKETS = (
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
)


@functools.cache
def _concrete_nodes(base: type) -> frozenset[type]:
    """The node classes `base` stands for, as Python knows its subclasses. (That can include a
    stale copy, such as the class libcst replaced by its slotted one: more classes only make a
    field less likely to count as trivia.)"""
    found = set()
    pending = [base]
    while pending:
        one = pending.pop()
        if not inspect.isabstract(one):
            found.add(one)
        pending.extend(one.__subclasses__())
    return frozenset(found)


def _classes(annotation: object) -> set[object]:
    """The classes (and Literal values) a field annotation can stand for."""
    if typing.get_origin(annotation) is None:
        return {annotation}
    return set().union(*map(_classes, typing.get_args(annotation)))


def _holds_only(annotation: object, allowed: set[type]) -> bool:
    """True when any value of the annotation is a plain value or a node of `allowed`."""
    for one in _classes(annotation):
        if isinstance(one, str):  # a Literal's value
            continue
        if not isinstance(one, type):
            return False
        if issubclass(one, _SCALARS):
            continue
        concrete = _concrete_nodes(one) if issubclass(one, cst.CSTNode) else frozenset()
        if not concrete or not concrete <= allowed:  # none known: it may be anything
            return False
    return True


def _hints(node_type: type) -> dict[str, object] | None:
    try:
        return typing.get_type_hints(node_type)
    except Exception:  # noqa: BLE001 - an annotation we cannot read makes the field count
        return None


def _trivia() -> frozenset[type]:
    candidates = {
        one
        for one in _concrete_nodes(cst.CSTNode)
        if one.__module__ in ("libcst._nodes.whitespace", "libcst._nodes.op")
    }
    candidates.update(_BRACKETS)
    while True:  # drop any class with a field that may hold more than trivia, until none does
        kept = {one for one in candidates if _only_trivia_fields(one, candidates)}
        if kept == candidates:
            return frozenset(kept)
        candidates = kept


def _only_trivia_fields(node_type: type, trivia: set[type]) -> bool:
    hints = _hints(node_type)
    return hints is not None and all(
        _holds_only(hints.get(field.name), trivia) for field in dataclasses.fields(node_type)
    )


TRIVIA = _trivia()
_SKIPPED: dict[type, frozenset[str]] = {}


def trivia_fields(node_type: type) -> frozenset[str]:
    """The names of the fields of `node_type` that can hold only trivia or plain values."""
    found = _SKIPPED.get(node_type)
    if found is None:
        hints = _hints(node_type) or {}
        found = _SKIPPED[node_type] = frozenset(
            field.name
            for field in dataclasses.fields(node_type)
            if field.name in hints and _holds_only(hints[field.name], set(TRIVIA))
        )
    return found
