"""One file's port as the TF1 and Keras visitors share it: metadata, plan, findings.

libcst's codemods share a `CodemodContext`; ours carries what every visitor of the loss-scale port
asks or adds to. The metadata is resolved once per file (by the wrapper the composing visitor runs
on) and read here through plain lookups, so each visitor asks about the few nodes it cares about
without resolving anything again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import libcst as cst
from libcst.metadata import (
    Assignment,
    ProviderT,
    QualifiedName,
    QualifiedNameSource,
    Scope,
    ScopeProvider,
)

from migrator.codemods.shared import api
from migrator.codemods.shared.lines import LineProvider, start_line
from migrator.codemods.shared.nodes import code, walk
from migrator.codemods.shared.parents import ParentProvider
from migrator.codemods.shared.plan import Builder, CallEdit, Edits, Site
from migrator.codemods.shared.qualified import (
    assign_statement,
    module_alias,
    without_compat_rebinding,
)
from migrator.findings import Finding

# What the composing visitor must declare for the context to answer.
METADATA = (ScopeProvider, ParentProvider, LineProvider)


class FileContext:
    """The metadata lookups, the plan being built (`edits`, `sites`) and the findings of one file.

    `bind` hands it the visitor's resolved metadata at the start of the walk; every lookup is
    valid until the walk ends (the analysis decides in `leave_Module`, still inside it).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.metadata: Mapping[ProviderT, Mapping[cst.CSTNode, object]] = {}
        self.findings: list[Finding] = []
        self.edits = Edits()
        self.sites: list[Site] = []
        # the module walked (set at the start of the walk): its text, where a rewrite must fit
        # the file's line length
        self.module: cst.Module | None = None
        # ids of the nodes inside rewritten expressions: an import every use of which is among
        # them can go
        self.consumed: set[int] = set()
        # several visitors ask about the same callee, and every reference is asked whether it is
        # ambiguous and then what it names: each node's scope is asked once
        self._canonical: dict[cst.CSTNode, str | None] = {}
        self._qualified: dict[cst.CSTNode, Collection[QualifiedName]] = {}

    def bind(self, metadata: Mapping[ProviderT, Mapping[cst.CSTNode, object]]) -> None:
        self.metadata = metadata

    # ----------------------------------------------------------------- metadata
    def line(self, node: cst.CSTNode) -> int:
        # Not PositionProvider: it costs a position for every node, we need a dozen (lines.py).
        return start_line(self, node)  # type: ignore[arg-type]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.metadata[ParentProvider].get(node)  # type: ignore[return-value]

    def scope(self, node: cst.CSTNode) -> Scope | None:
        return self.metadata[ScopeProvider].get(node)  # type: ignore[return-value]

    def qualified_names(self, node: cst.CSTNode) -> Collection[QualifiedName]:
        """What QualifiedNameProvider gives for `node`, asked of its scope (qualified.py)."""
        found = self._qualified.get(node)
        if found is None:
            scope = self.scope(node)
            found = set() if scope is None else scope.get_qualified_names_for(node)
            self._qualified[node] = found
        return found

    def canonical(self, node: cst.CSTNode) -> str | None:
        """The one imported qualified name of an expression, or None (local, ambiguous, unknown)."""
        if node not in self._canonical:
            self._canonical[node] = self._canonical_of(node)
        return self._canonical[node]

    def _canonical_of(self, node: cst.CSTNode) -> str | None:
        names = self.qualified_names(node)
        if len(names) > 1:
            return self._one_module(node, names)
        if not names:
            return None
        (qn,) = names
        if qn.source is QualifiedNameSource.LOCAL:
            return self._through_alias(node)
        if qn.source is not QualifiedNameSource.IMPORT:
            return None
        return api.canonical(qn.name)

    def _through_alias(self, node: cst.CSTNode) -> str | None:
        """`keras.mixed_precision.X` where `keras = tf.keras` (qualified.module_alias). Not
        through tf.contrib, which TF 2 lacks: the alias itself would stay and fail there, so
        that one is still reported as a module object to port by hand."""
        alias = module_alias(node, self.scope(node), self.parent)
        if alias is None:
            return None
        value, parts = alias
        base = self.canonical(value)
        if base is None or base.startswith("tensorflow.contrib"):
            return None
        return api.canonical(".".join([base, *parts]))

    def _one_module(self, node: cst.CSTNode, names: Collection[QualifiedName]) -> str | None:
        """One API where the root name is bound twice to one module, as TF 1 scripts made to run
        on TF 2 bind `tf`: `try: import tensorflow.compat.v1 as tf` / `except ImportError: import
        tensorflow as tf`, or `import tensorflow as tf` and then `tf = tf.compat.v1`
        (qualified.without_compat_rebinding). The bindings spell one canonical name (compat.v1
        dropped), so the port does not depend on which one runs."""
        names = without_compat_rebinding(names, node, self.scope(node), self.parent)
        if any(q.source is not QualifiedNameSource.IMPORT for q in names):
            return None
        canonical = {api.canonical(q.name) for q in names}
        return canonical.pop() if len(canonical) == 1 else None

    def ambiguous(self, node: cst.CSTNode) -> bool:
        """Bound to several things here, one of them a loss-scale API (a try/except import), and
        not all to one module (`_one_module`)."""
        names = self.qualified_names(node)
        return (
            len(names) > 1
            and self.canonical(node) is None
            and any(
                q.source is QualifiedNameSource.IMPORT and api.classify(api.canonical(q.name))
                for q in names
            )
        )

    def assignments(self, name: cst.Name) -> list[Assignment]:
        scope = self.scope(name)
        if scope is None or name.value not in scope:
            return []
        return [a for a in scope[name.value] if isinstance(a, Assignment)]

    def assigned_value(self, assignment: Assignment) -> cst.BaseExpression | None:
        """The value of `name = value` for a plain assignment of the name, else None."""
        statement = assign_statement(assignment, self.parent)
        return statement.value if statement is not None else None

    def provider(self, node: cst.CSTNode) -> Assignment | None:
        """The import that binds the root name of a dotted expression (for import placement)."""
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        scope = self.scope(root)
        if scope is None or not isinstance(root, cst.Name):
            return None
        for access in scope.accesses:
            if access.node is root:
                referents = list(access.referents)
                return referents[0] if len(referents) == 1 else None
        return None

    # ----------------------------------------------------------------- findings
    def warn(self, node: cst.CSTNode, rule: str, message: str) -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, "warning"))

    def change(self, node: cst.CSTNode, rule: str, message: str) -> None:
        self.findings.append(Finding(self.path, self.line(node), rule, message, "change"))

    def report(self, line: int, rule: str, message: str, kind: str = "change") -> None:
        self.findings.append(Finding(self.path, line, rule, message, kind))

    @staticmethod
    def code(node: cst.CSTNode) -> str:
        return code(node)

    # ----------------------------------------------------------------- the plan
    def consume(self, node: cst.CSTNode) -> None:
        for child in walk(node):
            self.consumed.add(id(child))

    def site(self, node: cst.CSTNode, expr: cst.CSTNode, *targets: str) -> None:
        """`node` needs the `targets` classes; `expr` (rewritten) is read no more."""
        self.consume(expr)
        self.sites.append(Site(node, targets, self.provider(expr)))

    def port_call(self, call: cst.Call, target: str, build: Builder | None) -> None:
        """Plan `call` to become a call of the npu_lossscale `target` built by `build`."""
        self.edits.calls[call] = CallEdit(target, build)
        self.consume(call.func)
        self.sites.append(Site(call, (target,), self.provider(call.func)))

    def give_up(self, rule: str, message: str, at: cst.CSTNode | None = None) -> None:
        """Change nothing in the file; one warning says why (at `at`, else the first change)."""
        first = min((f.line for f in self.findings if f.kind == "change"), default=1)
        if at is not None:
            first = self.line(at)
        self.findings = [f for f in self.findings if f.kind != "change"]
        self.findings.append(Finding(self.path, first, rule, message, "warning"))
        self.edits = Edits()
        self.sites = []
