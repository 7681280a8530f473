"""Code that only runs on a torch older than the port needs: the fallback of a version check.

npu_lossscale.torch needs torch 2.4 or later, where `torch.amp.GradScaler` exists. Scripts that
support older torch choose between it and `torch.cuda.amp.GradScaler` with a version test
(`if is_torch_version(">=", "2.3"):`, `if TORCH_VERSION >= (2, 3):`, `hasattr(torch, "GradScaler")`)
or with `try: from torch.amp import GradScaler / except ImportError: ...`. On the torch a ported
script runs, the fallback branch never runs: what is written there needs nothing from the user,
and a name bound in both branches means the new-torch binding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameSource, Scope

from migrator.codemods.shared import arguments as shared_args
from migrator.codemods.shared.nodes import Parent, code, dotted, walk
from migrator.codemods.torch import names
from migrator.codemods.torch.names import Kind

# The oldest torch npu_lossscale.torch runs on.
MINIMUM = (2, 4)
# torch.amp.GradScaler (and torch.GradScaler) arrived in torch 2.3.
_AMP_SCALER = (2, 3)
# `_TORCH_GREATER_EQUAL_2_3`, `TORCH_GE_2_4`, `is_torch_greater_or_equal_than_2_3`, ...
_FLAG = re.compile(r"torch.*(?:greater|_ge|geq|gte|at_least|newer).*?(\d+)_(\d+)", re.IGNORECASE)
_VERSION_TEXT = re.compile(r"^v?(\d+)\.(\d+)")
_NEW_MODULES = ("torch.amp",)  # a `try:` importing from these succeeds on torch 2.3 and later


def _version(node: cst.BaseExpression) -> tuple[int, int] | None:
    """(major, minor) of `"2.3.0"`, `(2, 3)`, `version.parse("2.3")`, `Version("2.3")`."""
    text = shared_args.string_value(node)
    if text is not None:
        match = _VERSION_TEXT.match(text)
        return (int(match.group(1)), int(match.group(2))) if match else None
    if isinstance(node, cst.Tuple) and len(node.elements) >= 2:
        parts = [shared_args.number_value(e.value) for e in node.elements[:2]]
        if all(p is not None and float(p).is_integer() for p in parts):
            return (int(parts[0]), int(parts[1]))  # type: ignore[arg-type]
        return None
    if isinstance(node, cst.Call) and len(node.args) == 1:
        return _version(node.args[0].value)
    return None


def _reads_torch_version(node: cst.BaseExpression) -> bool:
    text = code(node).lower()
    return "__version__" in text or ("torch" in text and "version" in text)


_FLIP = {">=": "<=", ">": "<", "<": ">", "<=": ">=", "==": "==", "!=": "!="}  # x OP y: y FLIP x
_OPS = {
    cst.GreaterThanEqual: ">=",
    cst.GreaterThan: ">",
    cst.LessThan: "<",
    cst.LessThanEqual: "<=",
}


def _new_torch(op: str, bound: tuple[int, int]) -> bool | None:
    """Whether `torch_version OP bound` holds on every torch the port runs on (True), on none
    of them (False), or cannot be told (None)."""
    if op in (">=", ">") and bound <= MINIMUM and not (op == ">" and bound == MINIMUM):
        return True
    if op in ("<", "<=") and bound <= MINIMUM and not (op == "<=" and bound == MINIMUM):
        return False
    return None


def test_is_new_torch(test: cst.BaseExpression) -> bool | None:
    """True: the test holds on every torch the port runs on; False: on none; None: unknown."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = test_is_new_torch(test.expression)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        op = _OPS.get(type(target.operator))
        if op is None:
            return None
        left, right = test.left, target.comparator
        if _reads_torch_version(left) and _version(right) is not None:
            return _new_torch(op, _version(right))  # type: ignore[arg-type]
        if _reads_torch_version(right) and _version(left) is not None:
            return _new_torch(_FLIP[op], _version(left))  # type: ignore[arg-type]
        return None
    if isinstance(test, cst.Call):
        name = dotted(test.func).rpartition(".")[2]
        args = [a.value for a in test.args]
        if name == "hasattr" and len(args) == 2:
            owner, attribute = dotted(args[0]), shared_args.string_value(args[1])
            if owner in ("torch", "torch.amp") and attribute == "GradScaler":
                return _new_torch(">=", _AMP_SCALER)
            return None
        lowered = name.lower()
        if lowered.endswith("torch_version") and len(args) == 2:
            op, bound = shared_args.string_value(args[0]), _version(args[1])
            if op in _FLIP and bound is not None:
                return _new_torch(op, bound)
        if "torch" in lowered and "greater" in lowered and len(args) >= 1:
            bound = _version(args[0])
            return _new_torch(">=", bound) if bound is not None else None
        return None
    if isinstance(test, (cst.Name, cst.Attribute)):
        match = _FLAG.search(dotted(test).rpartition(".")[2])
        if match:
            return _new_torch(">=", (int(match.group(1)), int(match.group(2))))
    return None


def _try_imports_new_torch(statement: cst.Try) -> bool:
    """`try:` whose body imports from torch.amp (or `from torch import GradScaler`), names every
    torch the port runs on has."""
    for line in statement.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None:
                module = dotted(small.module)
                aliases = small.names if isinstance(small.names, (list, tuple)) else ()
                if module in _NEW_MODULES or module.startswith("torch.amp."):
                    return True
                if module == "torch" and any(dotted(a.name) == "GradScaler" for a in aliases):
                    return True
    return False


def old_torch_only(node: cst.CSTNode, parent: Parent) -> bool:
    """Whether `node` sits where only a torch older than the port's minimum runs it."""
    current: cst.CSTNode | None = node
    while current is not None:
        up = parent(current)
        if isinstance(up, cst.ExceptHandler):
            statement = parent(up)
            if isinstance(statement, cst.Try) and _try_imports_new_torch(statement):
                return True
        if isinstance(up, cst.If):
            new = test_is_new_torch(up.test)
            if new is True and current is up.orelse:  # `else:`, or an `elif` under it
                return True
            if new is False and current is up.body:
                return True
        current = up
    return False


def new_torch_choice(resolved: Iterable[QualifiedName]) -> bool:
    """A name bound to torch.amp's scaler and, in the fallback for old torch, torch.cuda.amp's
    (try/except ImportError, a version check): on the torch 2.4+ a port runs, torch.amp's."""
    found = list(resolved)
    if any(q.source is not QualifiedNameSource.IMPORT for q in found):
        return False
    kinds = {names.classify(q.name) for q in found}
    return Kind.AMP in kinds and kinds <= {Kind.AMP, Kind.CUDA}


def choice_statement(
    root: cst.Name, scope: Scope | None, parent: Parent
) -> cst.Try | cst.If | None:
    """The innermost try/except or if/else holding every binding of such a name: the ported
    import goes after it, or replaces it (`collapsible`)."""
    if scope is None or root.value not in scope:
        return None
    chains = []
    for assignment in scope[root.value]:
        chain, current = [], getattr(assignment, "node", None)
        while current is not None:
            if isinstance(current, (cst.Try, cst.If)):
                chain.append(current)
            current = parent(current)
        chains.append(chain)
    if not chains:
        return None
    common = [c for c in chains[0] if all(any(c is o for o in chain) for chain in chains)]
    return common[0] if common else None


def collapsible(statement: cst.BaseStatement, removed: Callable[[cst.CSTNode], bool]) -> bool:
    """A try/except or if/else made only of imports the port drops (`removed`) and `pass`."""
    if isinstance(statement, cst.SimpleStatementLine):
        return False
    for node in walk(statement):
        if isinstance(node, cst.SimpleStatementLine):
            if not all(isinstance(s, cst.Pass) or removed(s) for s in node.body):
                return False
        elif isinstance(node, cst.BaseCompoundStatement) and not isinstance(
            node, (cst.Try, cst.If)
        ):
            return False
    return True
