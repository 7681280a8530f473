"""Whether an annotated scaler attribute also holds scalers the port does not build.

`self._scaler: Optional[amp.GradScaler] = None` followed by `self._scaler = amp.GradScaler()` in
one branch and `self._scaler = wrapper.init_grad_scaler()` (fairscale's, allennlp) in another: the
annotation describes the library's scaler too, which the port leaves, so it stays as written. The
same where another file of the run (a subclass) stores one in the attribute (allenai/tango's
fairscale engine: `self.grad_scaler = ShardedGradScaler()`; migrator.selection.scaler_attrs).
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from migrator.codemods.shared.nodes import Parent, code, small_statements


def holds_other_values(
    node: cst.CSTNode,
    module: cst.Module,
    ported: Collection[cst.Call],
    parent: Parent,
    elsewhere: Collection[str] = (),
) -> bool:
    """Whether `node` is in the annotation of `target: X = ...` and the file assigns `target` the
    result of a call the port did not rewrite (`ported`), or `target` is `self.<attr>` with attr
    among those other files assign such a scaler (`elsewhere`). A name assigned to it (a setter's
    parameter) is not counted: its own annotation follows the port."""
    current = parent(node)
    while current is not None and not isinstance(current, cst.Annotation):
        current = parent(current)
    statement = parent(current) if current is not None else None
    if not isinstance(statement, cst.AnnAssign):
        return False
    target = code(statement.target)
    if target.startswith("self.") and target[len("self.") :] in elsewhere:
        return True
    for found in small_statements(module):
        if not isinstance(found, cst.Assign):
            continue
        if not any(code(t.target) == target for t in found.targets):
            continue
        value = found.value
        if isinstance(value, cst.Call) and value not in ported:
            return True  # a factory the port cannot see into (`wrapper.init_grad_scaler()`)
    return False
