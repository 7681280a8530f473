"""Applies the global-step move to a tree: comment out, pass the step, insert the increment.

The removed update is kept as comments under a note instead of being deleted, so the user's code
is never lost and the diff reads like the vendor's manual procedure. The increment itself comes
from a template file, rendered in the file's own indentation and quote style.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from migrator import template_files
from migrator.codemods.shared.arguments import append_keyword
from migrator.codemods.shared.codegen import code_of
from migrator.codemods.shared.comments import comment_lines, line_limit, width, wrap_statements
from migrator.codemods.shared.visiting import preorder, visit


def template(name: str) -> str:
    return template_files.read(name)


def quote_style(module: cst.Module) -> str:
    """The quote character most of the file's one-line strings use (double on a tie)."""
    counts = {"'": 0, '"': 0}

    class _Count(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            body = node.value.lstrip("rbuRBUfF")
            quote = body[:1]
            if quote in counts and not body.startswith(quote * 3):  # docstrings do not count
                counts[quote] += 1

    visit(module, _Count())
    return "'" if counts["'"] > counts['"'] else '"'


def increment_statements(
    *, step: str, tf: str, updates: str, quote: str, name: str = "step_update", reads: bool = False
) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement]]:
    """The statements opening and closing apply_gradients once the step advances there.

    Without reads of the step in the method, everything goes at the end. With them, the opening
    computes the advanced step that those reads are renamed to, and the end assigns it: the reads
    see the step being made, the assignment still follows the updates."""
    fields = {"step": step, "tf": tf, "updates": updates, "q": quote, "name": name}
    if not reads:
        return [], _statements("global_step_increment.py.tmpl", fields)
    return (
        _statements("global_step_read.py.tmpl", fields),
        _statements("global_step_assign.py.tmpl", fields),
    )


def _statements(name: str, fields: dict[str, str]) -> list[cst.BaseStatement]:
    parsed = cst.parse_module(template(name).format(**fields))
    # A comment opening the snippet parses as the module header; it belongs to the first statement.
    first, *rest = parsed.body
    return [first.with_changes(leading_lines=[*parsed.header, *first.leading_lines]), *rest]


@dataclasses.dataclass
class Edits:
    """What to change, keyed by the identity of nodes in the tree being transformed."""

    removals: dict[int, tuple[str | None, cst.BaseStatement | None]] = dataclasses.field(
        default_factory=dict
    )  # statement -> (note comment above it, statement replacing it)
    step_arguments: dict[int, str] = dataclasses.field(default_factory=dict)  # call -> step name
    insertions: dict[int, list[cst.BaseStatement]] = dataclasses.field(default_factory=dict)
    openings: dict[int, list[cst.BaseStatement]] = dataclasses.field(default_factory=dict)
    renames: dict[int, str] = dataclasses.field(default_factory=dict)  # Name node -> new name

    def __bool__(self) -> bool:
        return bool(self.removals or self.step_arguments or self.insertions)

    def targets(self) -> set[int]:
        """The identities of every node an edit names."""
        return {
            *self.removals,
            *self.step_arguments,
            *self.insertions,
            *self.openings,
            *self.renames,
        }


def apply_edits(module: cst.Module, edits: Edits) -> cst.Module:
    """`module` with `edits` made, by an `Editor` over the top-level statements that hold a node
    an edit names; the others stay the very nodes parsed.

    The move edits one class or function of a file, and a transform of the whole module rebuilt
    every node, so the port that follows could not copy a single statement's bytes from the file
    (migrator.codemods.shared.splice): the rebuild and the code generation of the whole module
    were half the time of a file the move edits."""
    editor = Editor(module, edits)
    targets = edits.targets()
    body = []
    for statement in module.body:
        if any(id(node) in targets for node in preorder(statement)[0]):
            edited = statement.visit(editor)
            assert isinstance(edited, cst.BaseStatement)  # the editor never removes one
            statement = edited
        body.append(statement)
    return module.with_changes(body=body)


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(indent=True, comment=cst.Comment(text.rstrip()))


class Editor(cst.CSTTransformer):
    """Applies `Edits`; the comments it writes (the note, the inserted increment's) are wrapped to
    the file's own line length (migrator.codemods.shared.comments)."""

    def __init__(self, module: cst.Module, edits: Edits) -> None:
        super().__init__()
        self.module = module
        self.edits = edits
        self.limit = line_limit(code_of(module))
        self.indents: list[str] = []  # the enclosing blocks' indentation, outermost first

    def _indent(self, block: cst.IndentedBlock) -> str:
        return block.indent if block.indent is not None else self.module.default_indent

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.indents.append(self._indent(node))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        indent = width("".join(self.indents))
        self.indents.pop()
        if not any(id(s) in self.edits.removals for s in original_node.body):
            return updated_node
        body: list[cst.BaseStatement] = []
        pending: list[cst.EmptyLine] = []
        for original, updated in zip(original_node.body, updated_node.body):
            removal = self.edits.removals.get(id(original))
            if removal is None:
                body.append(updated.with_changes(leading_lines=[*pending, *updated.leading_lines]))
                pending = []
                continue
            note, replacement = removal
            pending.extend(original.leading_lines)
            if note is not None:
                pending.extend(comment_lines(note, indent, self.limit))
            code = self.module.code_for_node(original.with_changes(leading_lines=()))
            pending.extend(
                _comment(f"# {line}" if line.strip() else "#") for line in code.splitlines()
            )
            if replacement is not None:
                # `T = first` is built from the original `first`, which may itself be a call
                # that gets `global_step=` (`T = tf.group(opt.minimize(loss), incr)`).
                replacement = replacement.visit(self)
                body.append(replacement.with_changes(leading_lines=pending))
                pending = []
        footer = list(updated_node.footer)
        if pending and not body:
            body.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=pending))
        elif pending:
            footer[:0] = pending
        return updated_node.with_changes(body=body, footer=footer)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        step = self.edits.step_arguments.get(id(original_node))
        if step is None:
            return updated_node
        args = append_keyword(updated_node.args, "global_step", cst.Name(step))
        return updated_node.with_changes(args=args)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        inserted = self.edits.insertions.get(id(original_node))
        if inserted is None or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        indent = width("".join(self.indents) + self._indent(updated_node.body))
        unit = width(self.module.default_indent)
        body = list(updated_node.body.body)
        body[-1:-1] = wrap_statements(inserted, indent, unit, self.limit)
        opening = wrap_statements(
            self.edits.openings.get(id(original_node), []), indent, unit, self.limit
        )
        body[_docstring_length(body) : _docstring_length(body)] = opening
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.edits.renames.get(id(original_node))
        return updated_node if new is None else updated_node.with_changes(value=new)


def _docstring_length(body: list[cst.BaseStatement]) -> int:
    """1 where the block opens with a docstring (the opening goes after it), else 0."""
    first = body[0] if body else None
    if (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    ):
        return 1
    return 0
