"""Reports of a run: JSON for tools, Markdown for people, HTML for a reviewer's browser.

All three are built from one dictionary (`build_report`) so they can never disagree about what was
changed, warned about or failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migrator.files import write_new_file

if TYPE_CHECKING:
    from migrator.runner import FileOutcome, RunResult

REPORT_VERSION = 1


def _file_entry(outcome: FileOutcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": outcome.path,
        "status": outcome.status,
        "changes": [f.to_dict() for f in outcome.changes],
        "warnings": [f.to_dict() for f in outcome.warnings],
    }
    if outcome.error is not None:
        entry["reason"] = outcome.error
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


def write_report(path: Path, result: RunResult) -> None:
    """Write the report in the format named by the file's suffix (.json, .md or .html)."""
    suffix = path.suffix.lower()
    data = build_report(result)
    if suffix == ".json":
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    else:
        raise ValueError(f"report path must end in .json, .md or .html, got {str(path)!r}")
    write_new_file(path, text.encode("utf-8"))
