"""Scalers an earlier run ported: the file builds npu_lossscale.torch's GradScaler itself.

Such a file has nothing left to port, but what the port reminded of on the run that ported it
still holds until the script imports torch-npu's `transfer_to_npu`: its 'cuda' devices and autocast
stay CUDA's. The analysis asks here so that every later run (a `--check` in CI) says it again.
"""

from __future__ import annotations

import libcst as cst
from libcst import MetadataDependent

from migrator.codemods.shared import nodes
from migrator.codemods.shared.qualified import qualified_names
from migrator.codemods.shared.visiting import visit
from migrator.codemods.torch.names import LIBRARY, PORTED


def _imports_library(module: cst.Module) -> bool:
    """Whether any import statement of the module names npu_lossscale.torch (cheap: no metadata)."""
    for node in nodes.small_statements(module):
        if isinstance(node, cst.Import):
            if any(nodes.dotted(a.name).startswith(LIBRARY) for a in node.names):
                return True
        elif isinstance(node, cst.ImportFrom):
            if node.module is not None and nodes.dotted(node.module).startswith(LIBRARY):
                return True
    return False


def first_ported_scaler(module: cst.Module, visitor: MetadataDependent) -> cst.Call | None:
    """The first call that builds npu_lossscale.torch's GradScaler (`from_manager` too), or None;
    `visitor` is the analysis, whose scope metadata names the calls."""
    if not _imports_library(module):
        return None
    calls: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            names = qualified_names(visitor, node.func)
            if any(q.name == PORTED or q.name.startswith(PORTED + ".") for q in names):
                calls.append(node)
            return not calls

    visit(module, _Calls())
    return calls[0] if calls else None
