"""The HTML review page of a run: one self-contained file a reviewer opens in a browser, offline.

The summary comes from the JSON report (`build_report`), so the page and the report count the same
things; the code comes from the run's outcomes, which keep each ported file's bytes, so a warning
on a file that did not change is still shown in its code. Page layout, style and behaviour live in
templates/review.html, review.css and review.js, inlined here.
"""

from __future__ import annotations

import html
import re
import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from migrator import template_files
from migrator.report.diffing import decode_for_display, unified_diff
from migrator.report.review_highlight import Run, highlight, line_html, token_css
from migrator.report.review_inline import changed_ranges, pair_lines
from migrator.report.review_rows import Block, Hunk, enclosing_definition, layout, split_lines

if TYPE_CHECKING:
    from migrator.findings import Finding
    from migrator.pipeline.outcomes import FileOutcome

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_ICONS = {"change": "\u270e", "warning": "\u26a0", "error": "\u2716"}


def _template(name: str) -> str:
    return template_files.read(name)


def message_html(message: str) -> str:
    """A finding's message, its `code` spans (Markdown backticks) as <code>, all text escaped."""
    parts = _CODE_SPAN.split(message)  # odd indexes are the spans' contents
    return "".join(
        f"<code>{html.escape(part)}</code>" if i % 2 else html.escape(part)
        for i, part in enumerate(parts)
    )


def _reason_html(reason: str) -> str:
    """A failed file's reason: the quoted source line and caret (indented) as they are, the
    rest with its `code` spans as <code>, like a finding's message."""
    return "\n".join(
        html.escape(line) if line.startswith("    ") else message_html(line)
        for line in reason.split("\n")
    )


def _rank(outcome: FileOutcome) -> int:
    """Files a person must work on come first: warnings, then failures; then the changed ones."""
    if outcome.warnings:
        return 0
    return 1 if outcome.status == "failed" else 2


class _Source:
    """One side of a file: its lines and their highlighted runs."""

    def __init__(self, data: bytes) -> None:
        self.lines = split_lines(decode_for_display(data))
        self.runs: list[list[Run]] = highlight(self.lines)

    def text(self, index: int) -> str:
        return self.lines[index].rstrip("\n")


class _FileView:
    """What the page shows of one file: its hunks, its notes, and the counts for the file list."""

    def __init__(self, number: int, outcome: FileOutcome) -> None:
        self.number = number
        self.outcome = outcome
        self.anchor = f"file-{number}"
        # A failed file is shown by its reason only: its code did not parse.
        shown = outcome.old is not None and outcome.status != "failed"
        self.old = _Source(outcome.old) if shown else None
        same = outcome.new is None or outcome.new == outcome.old
        self.new = self.old if same else _Source(outcome.new)  # lexed once when unchanged
        self.hunks: list[Hunk] = []
        self.folded_after = 0
        self.notes: dict[int, list[Finding]] = {}
        self.loose: list[Finding] = []  # findings with no line of code to sit beside
        lines = len(self.old.lines) if self.old else 0
        for finding in outcome.findings:
            if 1 <= finding.line <= lines:
                self.notes.setdefault(finding.line, []).append(finding)
            else:
                self.loose.append(finding)
        if self.old and self.new:
            self.hunks, self.folded_after = layout(self.old.lines, self.new.lines, self.notes)
        changed = [b for h in self.hunks for b in h.blocks if not b.equal]
        self.added = sum(len(b.new) for b in changed)
        self.removed = sum(len(b.old) for b in changed)

    # -- the file list ------------------------------------------------------------------------

    def nav_item(self) -> str:
        o = self.outcome
        folder, _, name = o.path.replace("\\", "/").rpartition("/")
        counts = []
        if self.added or self.removed:
            counts.append(f'<span class="plus">+{self.added}</span>')
            counts.append(f'<span class="minus">\u2212{self.removed}</span>')
        if o.warnings:
            counts.append(f'<span class="warn" title="warnings">\u26a0 {len(o.warnings)}</span>')
        folder = html.escape(folder + "/" if folder else "")
        return (
            f'<li class="status-{o.status}"><a href="#{self.anchor}">'
            f'<span class="dot" title="{o.status}"></span>'
            f'<span class="path"><span class="dir">{folder}</span>{html.escape(name)}</span>'
            f'<span class="counts">{"".join(counts)}</span></a></li>'
        )

    # -- the file's section -------------------------------------------------------------------

    def section(self) -> str:
        o = self.outcome
        badges = [f'<span class="badge status-{o.status}">{o.status}</span>']
        if o.changes:
            plural = "s" if len(o.changes) != 1 else ""
            badges.append(f'<span class="badge changes">{len(o.changes)} change{plural}</span>')
        if o.warnings:
            plural = "s" if len(o.warnings) != 1 else ""
            badges.append(f'<span class="badge warnings">{len(o.warnings)} warning{plural}</span>')
        if self.added or self.removed:
            badges.append(
                f'<span class="badge lines"><span class="plus">+{self.added}</span> '
                f'<span class="minus">\u2212{self.removed}</span></span>'
            )
        body: list[str] = []
        if o.error is not None:
            body.append(f'<pre class="reason">{_reason_html(o.error)}</pre>')
        if self.loose:
            body.append(self._loose_notes())
        if self.added or self.removed:
            body.append(self._split_table())
            body.append(self._unified_table())
        elif self.hunks:
            # Nothing changed: both sides are the same lines, shown once in either view.
            body.append(self._unified_table("single"))
        if o.status == "changed" and o.old is not None and o.new is not None:
            body.append(_patch(unified_diff(o.old, o.new, o.path)))
        return (
            f'<details class="file" id="{self.anchor}" data-status="{o.status}" open>'
            f'<summary class="file-head"><span class="chevron" aria-hidden="true"></span>'
            f'<h2 class="file-path">{html.escape(o.path)}</h2>{"".join(badges)}</summary>'
            f'<div class="file-body">{"".join(body)}</div></details>'
        )

    def _loose_notes(self) -> str:
        return '<div class="loose-notes">' + "".join(_note(f) for f in self.loose) + "</div>"

    def _note_row(self, index: int | None, columns: int) -> str:
        if index is None or not self.notes.get(index + 1):
            return ""
        notes = "".join(_note(f) for f in self.notes[index + 1])
        return f'<tr class="notes" data-old="{index + 1}"><td colspan="{columns}">{notes}</td></tr>'

    def _hunk_head(self, hunk: Hunk, columns: int) -> str:
        assert self.old is not None
        folded = ""
        if hunk.folded_before:
            lines = "line" if hunk.folded_before == 1 else "lines"
            folded = f'<span class="folded">{hunk.folded_before} unchanged {lines}</span>'
        scope = html.escape(enclosing_definition(self.old.lines, hunk.old.start))
        if self.added or self.removed:
            header = f"@@ -{_range(hunk.old)} +{_range(hunk.new)} @@"
        else:  # context around a warning in a file the port left as it was: no diff to number
            last = hunk.old.stop if hunk.old.stop > hunk.old.start else hunk.old.start + 1
            header = f"lines {hunk.old.start + 1}\u2013{last}"
        return (
            f'<tr class="hunk"><td colspan="{columns}">{folded}<span class="range">{header}</span>'
            f' <span class="scope">{scope}</span></td></tr>'
        )

    def _tail(self, columns: int) -> str:
        if not self.folded_after:
            return ""
        lines = "line" if self.folded_after == 1 else "lines"
        return (
            f'<tr class="hunk tail"><td colspan="{columns}"><span class="folded">'
            f"{self.folded_after} unchanged {lines}</span></td></tr>"
        )

    def _pairs(self, block: Block) -> list[tuple[int | None, int | None, list, list]]:
        """Side-by-side rows of a block: (old index, new index, old marks, new marks)."""
        assert self.old is not None and self.new is not None
        if block.equal:
            return [(i, j, [], []) for i, j in zip(block.old, block.new)]
        old = [self.old.text(i) for i in block.old]
        new = [self.new.text(j) for j in block.new]
        rows = []
        for a, b, edited in pair_lines(old, new):
            i = None if a is None else block.old[a]
            j = None if b is None else block.new[b]
            marks = changed_ranges(old[a], new[b]) if edited else ([], [])
            rows.append((i, j, *marks))
        return rows

    def _cells(self, side: _Source, index: int | None, kind: str, marks: list, tag: str) -> str:
        if index is None:
            return '<td class="num empty"></td><td class="code empty"></td>'
        code = line_html(side.runs[index], marks, tag)
        return (
            f'<td class="num {kind}" data-n="{index + 1}"></td><td class="code {kind}">{code}</td>'
        )

    def _split_table(self) -> str:
        assert self.old is not None and self.new is not None
        rows: list[str] = []
        for hunk in self.hunks:
            rows.append(self._hunk_head(hunk, 4))
            for block in hunk.blocks:
                for i, j, old_marks, new_marks in self._pairs(block):
                    old_kind, new_kind = ("ctx", "ctx") if block.equal else ("del", "add")
                    rows.append(
                        f'<tr class="{"ctx" if block.equal else "chg"}">'
                        + self._cells(self.old, i, old_kind, old_marks, "del")
                        + self._cells(self.new, j, new_kind, new_marks, "ins")
                        + "</tr>"
                    )
                    rows.append(self._note_row(i, 4))
        rows.append(self._tail(4))
        return f'<table class="diff split"><tbody>{"".join(rows)}</tbody></table>'

    def _unified_row(self, kind: str, i: int | None, j: int | None, code: str) -> str:
        old_n = f' data-n="{i + 1}"' if i is not None else ""
        new_n = f' data-n="{j + 1}"' if j is not None else ""
        return (
            f'<tr class="{kind}"><td class="num {kind}"{old_n}></td>'
            f'<td class="num {kind}"{new_n}></td><td class="code {kind}">{code}</td></tr>'
        )

    def _unified_table(self, css: str = "unified") -> str:
        assert self.old is not None and self.new is not None
        rows: list[str] = []
        for hunk in self.hunks:
            rows.append(self._hunk_head(hunk, 3))
            for block in hunk.blocks:
                pairs = self._pairs(block)
                if block.equal:
                    for i, j, _, _ in pairs:
                        code = line_html(self.old.runs[i])
                        rows.append(self._unified_row("ctx", i, j, code))
                        rows.append(self._note_row(i, 3))
                    continue
                for i, _, marks, _ in pairs:
                    if i is not None:
                        code = line_html(self.old.runs[i], marks, "del")
                        rows.append(self._unified_row("del", i, None, code))
                        rows.append(self._note_row(i, 3))
                for _, j, _, marks in pairs:
                    if j is not None:
                        code = line_html(self.new.runs[j], marks, "ins")
                        rows.append(self._unified_row("add", None, j, code))
        rows.append(self._tail(3))
        return f'<table class="diff {css}"><tbody>{"".join(rows)}</tbody></table>'


def _range(lines: range) -> str:
    """A hunk header's range, as unified diffs write it (1-based start, count)."""
    start = lines.start + 1 if len(lines) else lines.start
    return str(start) if len(lines) == 1 else f"{start},{len(lines)}"


def _note(finding: Finding) -> str:
    kind = html.escape(finding.kind)
    where = f"line {finding.line}"
    return (
        f'<div class="note {kind}" data-line="{finding.line}">'
        f'<span class="icon" aria-hidden="true">{_ICONS.get(finding.kind, "")}</span>'
        f'<span class="kind">{kind}</span><span class="where">{where}</span>'
        f'<code class="rule">{html.escape(finding.rule)}</code>'
        f'<span class="message">{message_html(finding.message)}</span></div>'
    )


def _patch(diff: str) -> str:
    """The unified diff as text (copyable, for `git apply`), its lines coloured by kind."""
    classes = (("+++ ", "head"), ("--- ", "head"), ("@@", "hunk"), ("+", "add"), ("-", "del"))
    lines = []
    for line in diff.splitlines():
        css = next((c for prefix, c in classes if line.startswith(prefix)), None)
        # The newline stays inside the span so the page's text is the diff, copyable as is.
        text = html.escape(line) + "\n"
        lines.append(f'<span class="{css}">{text}</span>' if css else text)
    return (
        '<details class="patch"><summary>Patch (unified diff, for <code>git apply</code>)'
        f'</summary><pre class="diff">{"".join(lines)}</pre></details>'
    )


def _unchanged(outcomes: Sequence[FileOutcome]) -> str:
    if not outcomes:
        return ""
    items = "".join(f"<li><code>{html.escape(o.path)}</code></li>" for o in outcomes)
    plural = "s" if len(outcomes) != 1 else ""
    return (
        f'<details class="unchanged" id="unchanged"><summary>{len(outcomes)} unchanged '
        f"file{plural}, nothing to review</summary><ul>{items}</ul></details>"
    )


def render_review_page(report: dict[str, Any], outcomes: Sequence[FileOutcome]) -> str:
    """The page for `report` (the JSON report's dictionary) and the run's `outcomes`."""
    listed = [o for o in outcomes if o.status != "unchanged" or o.findings]
    quiet = [o for o in outcomes if o.status == "unchanged" and not o.findings]
    views = [_FileView(n, o) for n, o in enumerate(sorted(listed, key=_rank))]
    nav = "".join(v.nav_item() for v in views)
    if quiet:
        nav += (
            f'<li class="status-unchanged"><a href="#unchanged"><span class="dot"></span>'
            f'<span class="path">{len(quiet)} unchanged</span></a></li>'
        )
    css = _template("review.css") + "\n" + token_css(".code")
    values = {k: html.escape(str(v)) for k, v in report["summary"].items()}
    return string.Template(_template("review.html")).substitute(
        values,
        mode=html.escape(report["mode"]),
        css=css,
        script=_template("review.js"),
        nav=nav,
        files="\n".join(v.section() for v in views),
        unchanged=_unchanged(quiet),
    )
