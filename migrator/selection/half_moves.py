"""Global-step moves left half-applied in the tree: the update commented out in one file, the class
that should now advance the step (in another file) without its increment.

A run killed between the two writes of a move, or a file restored by hand, leaves the tree in that
state; the training script then never advances global_step (a warm-up learning rate stays 0) and a
plain re-run sees nothing to port. The note the move leaves above the commented-out update names
the classes: the global-step plan gives each such class its increment again when it can
(`moved_updates`), and each run checks, over what the files will hold after it, that no note is
left pointing at a class that does not advance the step (`half_applied`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from migrator.sources import pytree

# The note (templates/global_step_moved_note.tmpl), possibly wrapped over several comment lines.
_NOTE = re.compile(
    rb"npu-migrate:[\s#]+global_step[\s#]+now[\s#]+advances[\s#]+in"
    rb"((?:[\s#]+\w+\.apply_gradients,?)+)"
)
_CLASS = re.compile(rb"(\w+)\.apply_gradients")
# The comment lines after the note: the original update, commented out.
_COMMENTS = re.compile(rb"[^\n]*(?:\n[ \t]*#[^\n]*)*")
# The op name the original update gave the new step (`tf.identity(step + 1, name="...")`).
_OP_NAME = re.compile(rb"identity\([^\n]*?name\s*=\s*(['\"])(\w+)\1")


def notes(source: bytes) -> list[tuple[int, list[str]]]:
    """(line, class names) of each moved-update note in a file."""
    return [(line, classes) for line, classes, _ in moved_updates(source)]


def moved_updates(source: bytes) -> list[tuple[int, list[str], str | None]]:
    """(line, class names, op name of the commented-out update or None) of each note: what a
    re-run needs to complete a move whose classes did not get their increment."""
    found = []
    for m in _NOTE.finditer(source):
        block = _COMMENTS.match(source, m.end())
        op = _OP_NAME.search(block[0]) if block else None
        found.append(
            (
                source.count(b"\n", 0, m.start()) + 1,
                [c.decode() for c in _CLASS.findall(m[1])],
                op[2].decode() if op else None,
            )
        )
    return found


def _advances(method: ast.FunctionDef) -> bool:
    """Whether apply_gradients assigns its step parameter (`step.assign(...)`, `assign_add`)."""
    params = [a.arg for a in (*method.args.posonlyargs, *method.args.args, *method.args.kwonlyargs)]
    step = next((p for p in params if "step" in p), "global_step")
    for node in ast.walk(method):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.startswith("assign"):
            if isinstance(func.value, ast.Name) and func.value.id == step:
                return True
            if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == step:
                return True
    return False


def _classes(source: bytes) -> dict[str, tuple[int, bool]]:
    """Classes defining apply_gradients: name -> (line, whether it advances the step)."""
    tree = pytree.tree_or_none(source)
    if tree is None:
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "apply_gradients":
                    found[node.name] = (node.lineno, _advances(item))
    return found


def half_applied(files: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """path -> the failure to report, for files whose moved update went to a class (among these
    files) that does not advance the step."""
    files = [(p, d) for p, d in files if b"apply_gradients" in d]
    marked = [(p, n) for p, d in files for n in notes(d)]
    if not marked:
        return {}
    named = sorted({name for _, (_, classes) in marked for name in classes})
    if not named:
        return {}
    # Only a file that declares a named class is parsed: every file of a run that moves a step
    # spells `apply_gradients` (119 of the dense speed tree), few declare the classes.
    declares = re.compile(rb"\bclass[\s\\]+(?:%s)\b" % b"|".join(n.encode() for n in named))
    defined: dict[str, list[tuple[str, int, bool]]] = {}
    for path, data in files:
        if declares.search(data):
            for name, (line, advances) in _classes(data).items():
                defined.setdefault(name, []).append((path, line, advances))
    found: dict[str, str] = {}
    for path, (line, classes) in marked:
        for name in classes:
            places = defined.get(name, [])
            if places and not any(advances for _, _, advances in places):
                where, class_line, _ = places[0]
                found.setdefault(
                    path,
                    f"{line}:1: half-applied global-step move: the update below this line was "
                    f"moved into {name}.apply_gradients, but {name} ({where}:{class_line}) does "
                    "not advance global_step, so nothing does, and npu-migrate cannot add the "
                    "increment there (see that file's findings). Restore the commented-out update "
                    "(or `git checkout` both files) and run npu-migrate again",
                )
    return found
