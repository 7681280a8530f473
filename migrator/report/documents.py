"""Reports of a run: JSON for tools, Markdown for people, HTML for a reviewer's browser.

All three are built from one dictionary (`build_report`) so they can never disagree about what was
changed, warned about or failed. The HTML page (migrator/report/review_page.py) also shows the code,
which it takes from the run's outcomes beside that dictionary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migrator.report.diffing import unified_diff
from migrator.sources.files import write_new_file

if TYPE_CHECKING:
    from migrator.pipeline.outcomes import FileOutcome, RunResult

REPORT_VERSION = 1
REPORT_SUFFIXES = (".json", ".md", ".html")


def _file_entry(outcome: FileOutcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": outcome.path,
        "status": outcome.status,
        "changes": [f.to_dict() for f in outcome.changes],
        "warnings": [f.to_dict() for f in outcome.warnings],
    }
    if outcome.error is not None:
        entry["reason"] = outcome.error
    if outcome.status == "changed" and outcome.old is not None and outcome.new is not None:
        entry["diff"] = unified_diff(outcome.old, outcome.new, outcome.path)
    return entry


def build_report(result: RunResult) -> dict[str, Any]:
    """The machine-readable report; files with nothing to say are counted, not listed."""
    listed = [o for o in result.outcomes if o.status != "unchanged" or o.findings]
    return {
        "tool": "npu-migrate",
        "report_version": REPORT_VERSION,
        "mode": result.mode,
        "summary": {
            "files_scanned": result.scanned,
            "files_changed": result.changed,
            "changes": sum(len(o.changes) for o in result.outcomes),
            "warnings": result.warnings,
            "files_failed": result.failed,
            "seconds": round(result.seconds, 3),
        },
        "files": [_file_entry(o) for o in listed],
        "findings": [f.to_dict() for o in listed for f in o.findings],
        "failed": [
            {"path": o.path, "reason": o.error} for o in result.outcomes if o.status == "failed"
        ],
    }


def _md_failure(path: str, reason: str) -> str:
    """A list item; a reason with the source line and caret below it keeps them in a code block
    (indented under the item) so the caret stays under its column."""
    first, *rest = reason.splitlines()
    item = f"- {_md_code(path)}: {first}"
    if not rest:
        return item
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", reason)), default=0))
    body = "\n".join(f"  {line}" for line in rest)
    return f"{item}\n\n  {fence}\n{body}\n  {fence}"


def _md_code(text: str) -> str:
    """Inline code that survives backticks inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_fence(text: str) -> str:
    """A fence longer than any backtick run in ``text``: a diff line is prefixed by a space or a
    sign, and CommonMark still closes a fence indented by up to three spaces."""
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * (longest + 1)


def render_markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    out = [
        "# npu-migrate report",
        "",
        f"Mode: {_md_code(report['mode'])}. Line numbers refer to the original files.",
        "",
        "| files scanned | files changed | changes | warnings | files failed | seconds |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {s['files_scanned']} | {s['files_changed']} | {s['changes']} | {s['warnings']} "
        f"| {s['files_failed']} | {s['seconds']} |",
    ]
    if report["failed"]:
        out += ["", "## Failed (left untouched)", ""]
        out += [_md_failure(f["path"], f["reason"]) for f in report["failed"]]
    reviewed = [f for f in report["files"] if f["status"] != "failed" or f["warnings"]]
    if reviewed:
        out += ["", "## Files"]
    for entry in reviewed:
        out += ["", f"### {_md_code(entry['path'])} ({entry['status']})"]
        for title, key in (("Changes", "changes"), ("Warnings: review by hand", "warnings")):
            if entry[key]:
                out += ["", f"{title}:", ""]
                out += [
                    f"- line {f['line']}, {_md_code(f['rule'])}: {f['message']}" for f in entry[key]
                ]
        if "diff" in entry:
            fence = _md_fence(entry["diff"])
            out += ["", f"{fence}diff", entry["diff"].rstrip("\n"), fence]
    return "\n".join(out) + "\n"


def write_report(path: Path, result: RunResult) -> None:
    """Write the report in the format named by the file's suffix (.json, .md or .html)."""
    suffix = path.suffix.lower()
    data = build_report(result)
    if suffix == ".json":
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    elif suffix == ".md":
        text = render_markdown(data)
    elif suffix == ".html":
        # Imported here: the page needs Pygments, which JSON and Markdown reports never load.
        from migrator.report.review_page import render_review_page

        text = render_review_page(data, result.outcomes)
    else:
        raise ValueError(f"report path must end in .json, .md or .html, got {str(path)!r}")
    write_new_file(path, text.encode("utf-8"))
