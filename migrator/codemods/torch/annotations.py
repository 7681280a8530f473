"""Whether an annotated scaler attribute also holds scalers the port does not build.

`self._scaler: Optional[amp.GradScaler] = None` followed by `self._scaler = amp.GradScaler()` in
one branch and `self._scaler = wrapper.init_grad_scaler()` (fairscale's, allennlp) in another: the
annotation describes the library's scaler too, which the port leaves, so it stays as written.
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from migrator.codemods.shared.nodes import code, walk


def holds_other_values(
    statement: cst.AnnAssign, module: cst.Module, ported: Collection[cst.Call]
) -> bool:
    """Whether the file assigns the annotated target anything but a ported call or None."""
    target = code(statement.target)
    for found in walk(module):
        if not isinstance(found, cst.Assign):
            continue
        if not any(code(t.target) == target for t in found.targets):
            continue
        value = found.value
        if isinstance(value, cst.Name) and value.value == "None":
            continue
        if not (isinstance(value, cst.Call) and value in ported):
            return True
    return False
