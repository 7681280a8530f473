"""What the global-step readers share: the visitor's metadata questions and the problem type.

`StepReader` is the visitor `analysis.Analyzer` runs as; the class, condition, increment and
tracing readers are handed it and ask it for qualified names, lines and code, never resolving
metadata themselves. A `StepProblem` is a shape the move does not know, with the line to report.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameSource, ScopeProvider

from migrator.codemods.global_step.model import OptimizerRef
from migrator.codemods.global_step.names import is_builtin_optimizer, single_name
from migrator.codemods.shared.lines import LineProvider, start_line
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.qualified import qualified_names, without_compat_rebinding


class StepReader(cst.CSTVisitor):
    """The metadata questions of the global-step analysis; `module` is set when the walk starts."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentProvider, LineProvider)

    module: cst.Module

    def qnames(self, node: cst.CSTNode) -> set[QualifiedName]:
        names = qualified_names(self, node)
        if len(names) > 1:  # `tf = tf.compat.v1` after `import tensorflow as tf` (qualified.py)
            scope = self.get_metadata(ScopeProvider, node, None)
            parents = self.metadata[ParentProvider]
            names = without_compat_rebinding(names, node, scope, parents.get)
        return set(names)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def line(self, node: cst.CSTNode) -> int:
        # Not PositionProvider: it costs a position for every node, we need a dozen (lines.py).
        return start_line(self, node)

    def ref(self, expr: cst.BaseExpression) -> OptimizerRef:
        names = self.qnames(expr)
        text = self.module.code_for_node(expr)
        line = self.line(expr)
        if is_builtin_optimizer(names):
            return OptimizerRef("builtin", "", text, text, line)
        qn = single_name(names)
        if qn is not None and qn.source is QualifiedNameSource.LOCAL and "." not in qn.name:
            return OptimizerRef("local", "", qn.name, text, line)
        if (
            qn is not None
            and qn.source is QualifiedNameSource.IMPORT
            and "." in qn.name.lstrip(".")
            and not qn.name.startswith(("tensorflow.", "keras."))
        ):
            module, _, cls = qn.name.rpartition(".")
            return OptimizerRef("import", module, cls, text, line)
        return OptimizerRef("unknown", "", text, text, line)


class StepProblem(Exception):
    """A shape the move does not know: why, and the line to report it at."""

    def __init__(self, reason: str, line: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line
