"""The table benchmarks/realcode.py prints and writes to REPORT.md (rows are its Row objects)."""

from __future__ import annotations


def _tally(cells: list[str]) -> str:
    """ok / FAIL / n/a counts of one column's cells (a '-' is a file that column did not run)."""
    counts = {"ok": 0, "fail": 0, "n/a": 0}
    for cell in cells:
        key = "fail" if cell.startswith("FAIL") else "n/a" if cell.startswith("n/a") else "ok"
        counts[key] += cell.startswith(("ok", "FAIL", "n/a"))
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def render(
    rows: list,
    stacks: list[str] | None = None,
    compilers: list[str] | None = None,
    target: str = "npulossscale",
    bridge_note: str = "",
) -> str:
    """The Markdown table, one row per manifest row, and its summary: expectations met, and
    ok/fail/n/a per column (compiles, import and train on each stack)."""
    stacks, compilers = stacks or [], compilers or []
    extra = "".join(f" import on {s} | train on {s} |" for s in stacks)
    compiled = "".join(f" compiles on {c} |" for c in compilers)
    lines = [
        f"| repository | file | kind | style | expectations |{compiled} import | train |{extra}"
        " why it fails |",
        "|---|---|---|---|---|" + "---|" * (len(compilers) + 2 + 2 * len(stacks)) + "---|",
    ]
    met = total = skipped = 0
    for row in rows:
        checked = len(row.expect) - len(row.options) - row.skipped
        passed = checked - sum(f.startswith("expected") for f in row.failures)
        met, total, skipped = met + passed, total + checked, skipped + row.skipped
        shown = f"{passed}/{checked}" + (f" ({row.skipped} not checked)" if row.skipped else "")
        cells = "".join(" {} | {} |".format(*row.stacks.get(s, ("-", "-"))) for s in stacks)
        compiles = "".join(f" {row.compiled.get(c, '-')} |" for c in compilers)
        why = "; ".join(row.failures) or row.note
        lines.append(
            f"| {row.repo} | {row.path} | {row.kind} | {row.style} | {shown} |{compiles} "
            f"{row.imported} | {row.trained} |{cells} {why} |"
        )
    bad = sum(1 for r in rows if r.failures)
    repos = len({r.repo for r in rows})
    lines.append("")
    lines.append(f"{len(rows)} files from {repos} repositories: {len(rows) - bad} pass, {bad} fail")
    lines.append(f"target: {target}" + (bridge_note if target == "npu-bridge" else ""))
    lines.append(
        f"expectations met: {met}/{total}"
        + (f" ({skipped} on the default target's spelling not checked)" if skipped else "")
    )
    for label in compilers:
        lines.append(f"compiles on {label}: {_tally([r.compiled.get(label, '-') for r in rows])}")
    columns = [("this interpreter", lambda r: (r.imported, r.trained))]
    columns += [(s, lambda r, s=s: r.stacks.get(s, ("-", "-"))) for s in stacks]
    for label, cell in columns:
        lines.append(
            f"{label}: import {_tally([cell(r)[0] for r in rows])}; "
            f"train {_tally([cell(r)[1] for r in rows])}"
        )
    return "\n".join(lines)
