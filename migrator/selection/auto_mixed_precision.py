"""NVIDIA TensorFlow's automatic mixed precision switched on through the environment, and where to
say that Ascend's TensorFlow ignores it.

NVIDIA's TensorFlow builds (the NGC containers) rewrite the graph to fp16 and scale the loss
themselves when a script sets `TF_ENABLE_AUTO_MIXED_PRECISION=1` (or `..._GRAPH_REWRITE=1`) before
its session starts: NVIDIA's DeepLearningExamples do it for `--amp` (NCF, ConvNets, GNMT, UNet,
Transformer-XL). No API the port rewrites is named, so such a file passed silently, and on Ascend
the variable does nothing: the model trains in float32, or in fp16 with no loss scaling where the
NPU's own precision mode casts it. The finding is the only thing done here; the file is left.

Read with `ast` from the user's own bytes: a store into `os.environ[NAME]` (`import os [as X]`,
or `environ[NAME]` where the file imports `environ` from os), `environ.setdefault(NAME, value)`,
`environ.update(NAME=value)` (or a dict literal) or `os.putenv(NAME, value)` for either switch.
A literal that turns it off (`"0"`, `"false"`) is not warned, any other literal is, and a value
the file computes is warned with its condition. An inference or export script is warned too: the
switch is as ignored there, and the entry script that sets it is often not the one that builds the
optimizer (GNMT's nmt.py, UNet's setup.py).
"""

from __future__ import annotations

import ast

from migrator import registry
from migrator.findings import Finding
from migrator.sources import pytree

SWITCHES = ("TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE")
_BYTES = b"TF_ENABLE_AUTO_MIXED_PRECISION"
_OFF = frozenset({"0", "false", "off", "no", ""})


def might_use(source: bytes) -> bool:
    """False => `findings` finds nothing (a byte test, before any parse)."""
    return _BYTES in source


def findings(source: bytes, path: str) -> list[Finding]:
    """One warning, at the first store that may switch automatic mixed precision on."""
    if not might_use(source):
        return []
    tree = pytree.tree_or_none(source)
    if tree is None:
        return []
    for node, name, value in _stores(tree):
        if isinstance(value, ast.Constant):
            if str(value.value).strip().lower() in _OFF:
                continue
            when = ""
        else:
            when = f" when `{ast.unparse(value)}` is '1'"
        message = (
            f"`{ast.unparse(node)}` switches on NVIDIA TensorFlow's automatic mixed precision"
            f"{when} (its graph rewrite computes in fp16 and scales the loss itself); {name} is "
            "read only by NVIDIA's builds, so on Ascend the model runs in float32, or in fp16 "
            "with no loss scaling where the NPU's precision_mode casts it. To train in fp16 there, "
            "ask for it and scale the loss with npu_lossscale: NPULossScaleOptimizer around a "
            "tf.compat.v1 optimizer (`npu-migrate --add-loss-scale dynamic` adds it), "
            "npu_lossscale.keras.LossScaleOptimizer with a mixed_float16 policy"
        )
        return [Finding(path, node.lineno, registry.TF_AUTO_MIXED_PRECISION, message, "warning")]
    return []


class _Os:
    """The names through which the file reaches `os` and `os.environ`."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules, self.environs = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules |= {a.asname or a.name for a in node.names if a.name == "os"}
            elif isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level:
                self.environs |= {a.asname or a.name for a in node.names if a.name == "environ"}

    def is_os(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id in self.modules

    def is_environ(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "environ" and self.is_os(node.value)
        return isinstance(node, ast.Name) and node.id in self.environs


def _stores(tree: ast.Module) -> list[tuple[ast.AST, str, ast.expr]]:
    """(the statement or call, the variable, the value stored) for each store of a switch, in
    source order."""
    names = _Os(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and names.is_environ(target.value):
                    switch = _switch(target.slice)
                    if switch is not None:
                        found.append((node, switch, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            found += _call_stores(node, names)
    return sorted(found, key=lambda item: (item[0].lineno, item[0].col_offset))


def _call_stores(call: ast.Call, names: _Os) -> list[tuple[ast.AST, str, ast.expr]]:
    method, owner = call.func.attr, call.func.value  # type: ignore[attr-defined]
    pairs: list[tuple[ast.expr | None, ast.expr]] = []
    sets = method == "setdefault" and names.is_environ(owner)
    if sets or method == "putenv" and names.is_os(owner):
        if len(call.args) == 2:
            pairs.append((call.args[0], call.args[1]))
    elif method == "update" and names.is_environ(owner):
        pairs += [(ast.Constant(k.arg), k.value) for k in call.keywords if k.arg is not None]
        for arg in call.args:
            if isinstance(arg, ast.Dict):
                pairs += list(zip(arg.keys, arg.values))
    return [
        (call, switch, value)
        for key, value in pairs
        if key is not None and (switch := _switch(key)) is not None
    ]


def _switch(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and node.value in SWITCHES:
        return str(node.value)
    return None
