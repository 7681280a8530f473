"""Which functions of the run's files set TF_USE_LEGACY_KERAS: a project-level fact read per file.

A trainer may choose Keras 2 through a helper another file defines (`from utils import
ensure_keras_v2; ensure_keras_v2()`, utils.py setting `os.environ["TF_USE_LEGACY_KERAS"] = "1"`).
The trainer's own tree cannot show it, and utils.py, having nothing to port, is never parsed by
the codemods. So every file read that names the variable is scanned here (an `ast` parse of those
few files only), and the Keras port of a file calling one of these functions decides from it
(`migrator.codemods.keras.version`). Only a setting every call runs counts as choosing Keras 2:
one inside a branch, or of a value chosen at run time, is reported as not known.
"""

from __future__ import annotations

import ast
import dataclasses

from migrator.selection.reexports import module_name

_KEY = "TF_USE_LEGACY_KERAS"
_TRUE = ("1", "true", "True")  # the spellings TensorFlow reads as "use tf_keras"
_SETTERS = ("setdefault", "putenv", "__setitem__")


@dataclasses.dataclass(frozen=True)
class KerasHelper:
    """A module-level function that sets TF_USE_LEGACY_KERAS: `module` as other files import it
    (migrator.selection.reexports.module_name), where it sets it ("utils.py:5"), and `unsure`:
    why its calls do not surely set it to 1 ("" when they do)."""

    module: str
    function: str
    where: str
    unsure: str = ""


def legacy_keras_helpers(path: str, data: bytes) -> set[KerasHelper]:
    """The functions defined at the top of one file that set TF_USE_LEGACY_KERAS."""
    if _KEY.encode() not in data:
        return set()
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            helper = _helper(module_name(path), path, node)
            if helper is not None:
                found.add(helper)
    return found


def _helper(
    module: str, path: str, function: ast.FunctionDef | ast.AsyncFunctionDef
) -> KerasHelper | None:
    """The function as a helper, or None where it never sets the variable (or only to 0, which
    leaves tf.keras what the TensorFlow ships)."""
    settings = []  # (line, runs on every call, the value: True/False, None at run time)
    for stmt in ast.walk(function):
        if isinstance(stmt, ast.stmt) and stmt is not function:
            value = _setting(stmt)
            if value is not _NONE:
                settings.append((stmt.lineno, any(s is stmt for s in function.body), value))
    if not any(value is not False for _, _, value in settings):
        return None
    line = settings[0][0]
    if any(value is None for _, _, value in settings):
        unsure = "to a value chosen at run time"
    elif not all(direct for _, direct, _ in settings):
        unsure = "only in a branch"
    elif any(value is False for _, _, value in settings):
        unsure = "to 1 and to 0"
    else:
        unsure = ""
    return KerasHelper(module, function.name, f"{path}:{line}", unsure)


_NONE = object()  # the statement sets no TF_USE_LEGACY_KERAS


def _setting(stmt: ast.stmt) -> object:
    """What one statement sets TF_USE_LEGACY_KERAS to (True for "1"/"true", False for another
    literal, None for a value chosen at run time), or _NONE: `os.environ[KEY] = v`,
    `os.environ.setdefault(KEY, v)`, `os.putenv(KEY, v)`, `os.environ.update({KEY: v})`."""
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Subscript) and _is_key(target.slice):
                return _value(stmt.value)
        return _NONE
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return _NONE
    call = stmt.value
    if not isinstance(call.func, ast.Attribute):
        return _NONE
    if call.func.attr in _SETTERS and len(call.args) == 2 and _is_key(call.args[0]):
        return _value(call.args[1])
    if call.func.attr == "update":
        for keyword in call.keywords:
            if keyword.arg == _KEY:
                return _value(keyword.value)
        for arg in call.args:
            if isinstance(arg, ast.Dict):
                for key, value in zip(arg.keys, arg.values):
                    if key is not None and _is_key(key):
                        return _value(value)
    return _NONE


def _is_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == _KEY


def _value(node: ast.expr) -> bool | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in _TRUE
    return None
