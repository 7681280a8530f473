"""--report: the JSON, Markdown and HTML reports describe the same run, and say everything.

Real CLI runs on real files; the reports are parsed (json, html.parser) rather than compared to
a copy of what the code under test produced.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from cli_runner import run_cli

PORTABLE = b"import tensorflow as tf\n\nm = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
# Nothing in the library corresponds to this name, so it must be left for a person.
UNPORTABLE = b"import tensorflow as tf\n\nx = tf.contrib.mixed_precision.NoSuchThing()\n"
BROKEN = b"import tensorflow as tf\ndef f(:\n    tf.contrib.mixed_precision\n"
REASON_WITH_MARKUP = b"# loss_scale <b>&\ndef g(:\n"


def run_with_reports(tmp_path: Path, *extra: str) -> tuple[int, dict, str, str]:
    tree = tmp_path / "tree"
    for name, data in {
        "train.py": PORTABLE,
        "manual.py": UNPORTABLE,
        "bad.py": BROKEN,
        "odd <name>.py": REASON_WITH_MARKUP,
        "plain.py": b"x = 1\n",
    }.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    out = tmp_path / "reports"
    proc = run_cli(
        ".",
        *extra,
        "--report",
        out / "r.json",
        "--report",
        out / "r.md",
        "--report",
        out / "r.html",
        cwd=tree,
    )
    report = json.loads((out / "r.json").read_text(encoding="utf-8"))
    md = (out / "r.md").read_text(encoding="utf-8")
    page = (out / "r.html").read_text(encoding="utf-8")
    return proc.returncode, report, md, page


def test_json_report_lists_changes_warnings_and_failures(tmp_path: Path) -> None:
    code, report, _, _ = run_with_reports(tmp_path)
    assert code == 123
    assert report["tool"] == "npu-migrate"
    assert report["mode"] == "diff"
    summary = report["summary"]
    assert summary["files_scanned"] == 5
    assert summary["files_changed"] == 1
    assert summary["files_failed"] == 2
    assert summary["changes"] >= 1
    assert summary["warnings"] >= 1
    assert isinstance(summary["seconds"], float)

    assert {f["path"] for f in report["failed"]} == {"bad.py", "odd <name>.py"}
    assert all("cannot parse" in f["reason"] for f in report["failed"])

    for finding in report["findings"]:
        assert set(finding) == {"path", "line", "rule", "message", "kind"}
        assert finding["kind"] in ("change", "warning", "error")
        assert isinstance(finding["line"], int) and finding["line"] >= 1
        assert finding["rule"] and finding["message"]
    changes = [f for f in report["findings"] if f["kind"] == "change"]
    warnings = [f for f in report["findings"] if f["kind"] == "warning"]
    assert {f["path"] for f in changes} == {"train.py"}
    assert any(f["path"] == "manual.py" and f["line"] == 3 for f in warnings)
    assert len(changes) == summary["changes"]
    assert len(warnings) == summary["warnings"]

    files = {f["path"]: f for f in report["files"]}
    assert "plain.py" not in files
    assert files["train.py"]["status"] == "changed"
    assert files["train.py"]["diff"].startswith("--- a/train.py\n+++ b/train.py\n")
    assert files["bad.py"]["status"] == "failed"
    assert "diff" not in files["bad.py"]


def test_markdown_report_has_summary_failures_findings_and_diff(tmp_path: Path) -> None:
    _, report, md, _ = run_with_reports(tmp_path)
    s = report["summary"]
    assert md.startswith("# npu-migrate report\n")
    row = (
        f"| {s['files_scanned']} | {s['files_changed']} | {s['changes']} | {s['warnings']} "
        f"| {s['files_failed']} |"
    )
    assert row in md
    assert "## Failed (left untouched)\n\n- `bad.py`: 2:" in md
    assert ": cannot parse: invalid syntax\n\n  ```\n" in md  # the line and caret, kept aligned
    assert "### `train.py` (changed)" in md
    assert "### `manual.py`" in md
    assert "```diff\n--- a/train.py\n" in md
    for finding in report["findings"]:
        assert f"- line {finding['line']}, `{finding['rule']}`: {finding['message']}" in md


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: list[str] = []
        self.unclosed_errors = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in ("meta", "br", "wbr"):  # void elements: never closed
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_report_is_well_formed_escaped_and_complete(tmp_path: Path) -> None:
    _, report, _, page = run_with_reports(tmp_path)
    parser = _Collector()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    text = "".join(parser.text)
    assert "odd <name>.py" in text  # shown as text...
    assert "odd &lt;name&gt;.py" in page  # ...because it was escaped
    assert "<name>" not in page
    for finding in report["findings"]:
        assert finding["message"].replace("`", "") in text  # `code` spans render as <code>
    diff = report["files"][[f["path"] for f in report["files"]].index("train.py")]["diff"]
    assert diff in text  # the page's <pre> holds the diff text itself, copyable
    assert '<span class="del">' in page and '<span class="add">' in page


def test_reports_reflect_the_mode(tmp_path: Path) -> None:
    code, report, md, _ = run_with_reports(tmp_path, "--write")
    assert code == 123
    assert report["mode"] == "write"
    assert "Mode: `write`" in md
    assert b"contrib" not in (tmp_path / "tree" / "train.py").read_bytes()


def test_a_report_under_a_file_is_a_usage_error_naming_that_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes(PORTABLE)
    (tmp_path / "blocker").write_text("a file, not a directory")
    proc = run_cli("train.py", "--report", "blocker/r.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert "blocker is a file, so blocker/r.json cannot be written under it" in proc.stderr
    assert proc.stdout == ""  # refused before any work


def test_missing_folders_on_the_way_to_a_report_are_created(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes(PORTABLE)
    proc = run_cli("train.py", "--report", "reports/today/r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "reports" / "today" / "r.json").read_text(encoding="utf-8"))
    assert [f["path"] for f in report["files"]] == ["train.py"]


def test_unwritable_report_path_is_an_error_after_the_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes(PORTABLE)
    name = "r" * 300 + ".json"  # longer than a file name may be: the write itself fails
    proc = run_cli("train.py", "--report", name, cwd=tmp_path)
    assert proc.returncode == 123
    assert f"{name}: error: cannot write report: File name too long" in proc.stderr
    assert "+++ b/train.py" in proc.stdout


# Each source: where the port puts its import, and the (line, message end) a reviewer must see.
IMPORT_PLACEMENTS = {
    "after_imports.py": (
        b'"""Doc."""\nimport os\nimport tensorflow as tf\n\n'
        b"m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n",
        [(3, "after the statement on this line")],
    ),
    "merged.py": (
        b"import tensorflow as tf\nfrom npu_lossscale import NPULossScaleOptimizer\n\n"
        b"m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n",
        [(2, "adds FixedLossScaleManager to this npu_lossscale import")],
    ),
    "in_functions.py": (
        b"def a():\n    import tensorflow as tf\n"
        b"    return tf.contrib.mixed_precision.FixedLossScaleManager(128)\n\n\n"
        b"def b():\n    x = 1\n    import tensorflow as tf\n"
        b"    return tf.contrib.mixed_precision.FixedLossScaleManager(x)\n",
        [(2, "after the statement on this line"), (8, "after the statement on this line")],
    ),
}


def test_import_change_points_at_where_the_import_goes(tmp_path: Path) -> None:
    for name, (source, _) in IMPORT_PLACEMENTS.items():
        (tmp_path / name).write_bytes(source)
    proc = run_cli(".", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    for name, (_, expected) in IMPORT_PLACEMENTS.items():
        found = sorted(
            (f["line"], f["message"])
            for f in report["findings"]
            if f["path"] == name and f["rule"] == "npu-import"
        )
        assert [line for line, _ in found] == [line for line, _ in expected], name
        for (_, message), (_, end) in zip(found, expected):
            assert message.endswith(end), (name, message)


def test_markdown_diff_fence_outlasts_backticks_in_the_code(tmp_path: Path) -> None:
    # A diff context line ` ```` ` (a fence in a docstring, shifted by the diff's space) closes a
    # three-backtick fence under CommonMark's rule: up to three spaces of indentation, at least
    # as many backticks, nothing else. The rest of the diff would then render as Markdown/HTML.
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "doc.py").write_text(
        'import tensorflow as tf\n"""Usage:\n```\n</pre><b>raw</b>\n````\n"""\n'
        "m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n",
        encoding="utf-8",
    )
    run_cli(".", "--report", tmp_path / "r.md", cwd=tree)
    lines = (tmp_path / "r.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("`") == "diff")
    fence = len(lines[start]) - len("diff")
    body = []
    for line in lines[start + 1 :]:
        indent = len(line) - len(line.lstrip(" "))
        closing = line.strip()
        if indent <= 3 and closing and set(closing) == {"`"} and len(closing) >= fence:
            break
        body.append(line)
    assert body[0] == "--- a/doc.py"
    assert " </pre><b>raw</b>" in body and " ````" in body  # still inside the code block
    assert "+m = FixedLossScaleManager(128)" in body
