"""--report page.html: the review page of a real port, read as HTML and run in a real browser.

One port of real fixture scripts (a changed file with warnings, a changed BERT optimizer, a file
with warnings only, an unchanged file and one that does not parse) is shared by every test. The
page is parsed with html.parser and compared with the sources, the ported files and the JSON
report of the same run; then Debian's chromium loads it headless (skipped where it is absent),
and a screenshot is left in build/review-page.png for a person to look at.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, REPO_ROOT, run_cli

FIXTURES = MIGRATOR_FIXTURES
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT_COPY = REPO_ROOT / "build" / "review-page.png"
BROKEN = b"import tensorflow as tf\n\ndef f(:\n    tf.contrib.mixed_precision\n"
PORT = {
    "bert/optimization.py": FIXTURES / "bert" / "optimization.py",
    "bert/run_tiny.py": FIXTURES / "bert" / "run_tiny.py",
    "control_deps.py": FIXTURES / "cases" / "control_deps.py",
    "warnings_only.py": FIXTURES / "unchanged" / "warnings_only.py",
}
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "wbr", "source"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def elements(self) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node)]

    def iter(self, tag: str | None = None, cls: str | None = None) -> list[Node]:
        found = []
        for child in self.elements():
            if (tag is None or child.tag == tag) and (cls is None or cls in child.classes):
                found.append(child)
            found += child.iter(tag, cls)
        return found

    def by_id(self, ident: str) -> Node:
        (node,) = [n for n in self.iter() if n.attrs.get("id") == ident]
        return node


class TreeBuilder(HTMLParser):
    """A DOM-like tree; every end tag must close the element open last (well-formed markup)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    builder = TreeBuilder()
    builder.feed(page)
    builder.close()
    assert builder.stack == [builder.root], "unclosed elements"
    return builder.root


@dataclass
class Port:
    root: Path
    page_path: Path
    page: str
    dom: Node
    report: dict
    old: dict[str, list[str]]
    new: dict[str, list[str]]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Port:
    root = tmp_path_factory.mktemp("review")
    tree = root / "tree"
    for name, source in PORT.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tree / name)
    (tree / "broken.py").write_bytes(BROKEN)
    page_path = root / "review.html"
    proc = run_cli(
        ".",
        "--output-dir",
        root / "ported",
        "--report",
        page_path,
        "--report",
        root / "report.json",
        cwd=tree,
    )
    assert proc.returncode == 123, proc.stderr  # broken.py failed; the rest was ported
    page = page_path.read_text(encoding="utf-8")
    names = [*PORT, "broken.py"]
    ported = {n: root / "ported" / n for n in names}
    return Port(
        root=root,
        page_path=page_path,
        page=page,
        dom=parse(page),
        report=json.loads((root / "report.json").read_text(encoding="utf-8")),
        old={n: (tree / n).read_text(encoding="utf-8").split("\n") for n in names},
        new={n: p.read_text(encoding="utf-8").split("\n") for n, p in ported.items() if p.exists()},
    )


def sections(port: Port) -> dict[str, Node]:
    """Each file's section on the page, by path."""
    return {s.iter("h2")[0].text(): s for s in port.dom.iter("details", "file")}


def entries(port: Port) -> dict[str, dict]:
    return {f["path"]: f for f in port.report["files"]}


def cells(row: Node) -> list[Node]:
    return [c for c in row.elements() if c.tag == "td"]


def numbers(row: Node) -> list[int | None]:
    """The row's (old, new) line numbers, None on a side the row has no line of."""
    nums = [c for c in cells(row) if "num" in c.classes]
    return [int(c.attrs["data-n"]) if "data-n" in c.attrs else None for c in nums]


# -- the page as HTML ----------------------------------------------------------------------------


def test_page_is_one_file_that_needs_nothing_from_the_network(port: Port) -> None:
    assert port.dom.iter("link") == []
    for node in port.dom.iter():
        assert "src" not in node.attrs, node.tag
        href = node.attrs.get("href")
        assert href is None or href.startswith("#"), href
    style = "".join(s.text() for s in port.dom.iter("style"))
    script = "".join(s.text() for s in port.dom.iter("script"))
    assert "url(" not in style and "@import" not in style
    assert not re.search(r"https?:|//[a-z]", style + script.replace("// ", ""))
    assert "fetch(" not in script and "XMLHttpRequest" not in script
    assert ".code .k {" in style  # Pygments' token colours, inlined


def test_file_list_puts_work_first_and_links_every_file(port: Port) -> None:
    nav = port.dom.iter("nav", "file-list")[0]
    links = nav.iter("a")
    paths = [a.iter("span", "path")[0].text() for a in links]
    assert paths == [
        "control_deps.py",  # changed, with warnings
        "warnings_only.py",  # warnings only
        "broken.py",  # failed
        "bert/optimization.py",  # changed
        "1 unchanged",
    ]
    by_path = entries(port)
    for a, path in zip(links, paths):
        target = port.dom.by_id(a.attrs["href"][1:])
        if path == "1 unchanged":
            assert target.tag == "details" and "open" not in target.attrs
            continue
        assert target.iter("h2")[0].text() == path
        entry = by_path[path]
        counts = a.iter("span", "counts")[0]
        diff = entry.get("diff", "").splitlines()
        added = sum(line.startswith("+") and not line.startswith("+++") for line in diff)
        removed = sum(line.startswith("-") and not line.startswith("---") for line in diff)
        plus, minus = counts.iter("span", "plus"), counts.iter("span", "minus")
        assert [s.text() for s in plus] == ([f"+{added}"] if added else [])
        assert [s.text() for s in minus] == ([f"\u2212{removed}"] if removed else [])
        warns = counts.iter("span", "warn")
        expected = len(entry["warnings"])
        assert [s.text() for s in warns] == ([f"\u26a0 {expected}"] if expected else [])


def _diff_lines(diff: str) -> tuple[set[int], set[int]]:
    """Old line numbers a unified diff removes and new line numbers it adds."""
    removed, added = set(), set()
    old = new = 0
    for line in diff.splitlines():
        hunk = re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", line)
        if hunk:
            old, new = int(hunk[1]), int(hunk[2])
        elif line.startswith(("---", "+++")):
            continue
        elif line.startswith("-"):
            removed.add(old)
            old += 1
        elif line.startswith("+"):
            added.add(new)
            new += 1
        elif line.startswith(" "):
            old, new = old + 1, new + 1
    return removed, added


def test_both_views_show_each_line_with_its_numbers_on_both_sides(port: Port) -> None:
    for path in ("control_deps.py", "bert/optimization.py"):
        section = sections(port)[path]
        old, new = port.old[path], port.new[path]
        removed, added = _diff_lines(entries(port)[path]["diff"])
        (split,) = section.iter("table", "split")
        seen_del, seen_add = set(), set()
        for row in split.iter("tr"):
            if not row.classes & {"ctx", "chg"}:
                continue
            o_num, o_code, n_num, n_code = cells(row)
            sides = ((o_num, o_code, old, seen_del), (n_num, n_code, new, seen_add))
            for num, code, lines, seen in sides:
                if "data-n" not in num.attrs:
                    assert "ctx" not in row.classes  # context has a number on both sides
                    assert "empty" in code.classes and code.text() == ""
                    continue
                n = int(num.attrs["data-n"])
                assert code.text() == lines[n - 1], (path, n)
                if "chg" in row.classes:
                    seen.add(n)
        assert (seen_del, seen_add) == (removed, added)

        (unified,) = section.iter("table", "unified")
        kinds: dict[str, list[list[int | None]]] = {"ctx": [], "del": [], "add": []}
        for row in unified.iter("tr"):
            kind = next((k for k in kinds if k in row.classes), None)
            if kind:
                o, n = numbers(row)
                code = cells(row)[2].text()
                assert code == (old[o - 1] if o else new[n - 1])
                kinds[kind].append([o, n])
        assert all(o and n for o, n in kinds["ctx"])
        assert {o for o, n in kinds["del"] if n is None} == removed
        assert {n for o, n in kinds["add"] if o is None} == added


def test_code_is_coloured_by_pygments_token_classes(port: Port) -> None:
    section = sections(port)["control_deps.py"]
    code = section.iter("td", "code")
    keywords = {s.text() for td in code for s in td.iter("span", "k")}
    assert {"def", "with", "return"} <= keywords
    assert "import" in {s.text() for td in code for s in td.iter("span", "kn")}
    assert "train" in {s.text() for td in code for s in td.iter("span", "nf")}
    assert any(s.text().startswith("#") for td in code for s in td.iter("span", "c1"))


def _without(cell: Node, tag: str) -> str:
    """The cell's text less what sits inside `tag` elements."""
    return "".join(
        c if isinstance(c, str) else "" if c.tag == tag else _without(c, tag) for c in cell.children
    )


def test_edited_lines_mark_what_changed_inside_them(port: Port) -> None:
    marked = 0
    for section in sections(port).values():
        for table in section.iter("table", "split"):
            for row in table.iter("tr", "chg"):
                old, _, new = cells(row)[1], cells(row)[2], cells(row)[3]
                if not (old.iter("del") or new.iter("ins")):
                    continue
                marked += 1
                # What is left unmarked is the same on both sides: the marks cover every change.
                assert _without(old, "del").strip() == _without(new, "ins").strip()
    assert marked >= 5
    rows = sections(port)["control_deps.py"].iter("table", "split")[0].iter("tr", "chg")
    optimizer = next(r for r in rows if "LossScaleOptimizer(opt, manager)" in cells(r)[1].text())
    assert [d.text() for d in cells(optimizer)[1].iter("del")] == [
        "tf.contrib.mixed_precision.LossScaleOptimizer"
    ]
    assert [i.text() for i in cells(optimizer)[3].iter("ins")] == ["NPULossScaleOptimizer"]


def test_every_finding_sits_under_its_line_in_every_view(port: Port) -> None:
    by_path = sections(port)
    for finding in port.report["findings"]:
        section = by_path[finding["path"]]
        tables = section.iter("table", "split") + section.iter("table", "unified")
        tables += section.iter("table", "single")
        assert tables, finding["path"]
        for table in tables:
            rows = [r for r in table.iter("tr")]
            under = [
                (above, row)
                for above, row in zip(rows, rows[1:])
                if "notes" in row.classes
                and any(
                    n.attrs["data-line"] == str(finding["line"])
                    and n.iter("code", "rule")[0].text() == finding["rule"]
                    and finding["kind"] in n.classes
                    for n in row.iter("div", "note")
                )
            ]
            assert len(under) == 1, (finding, table.attrs["class"])
            above, _ = under[0]
            assert numbers(above)[0] == finding["line"], finding


def test_warning_only_file_shows_its_code_once_around_each_warning(port: Port) -> None:
    section = sections(port)["warnings_only.py"]
    assert section.iter("table", "split") == section.iter("table", "unified") == []
    (table,) = section.iter("table", "single")
    lines = port.old["warnings_only.py"]
    for row in table.iter("tr", "ctx"):
        o, n = numbers(row)
        assert o == n and cells(row)[2].text() == lines[o - 1]
    warned = {f["line"] for f in entries(port)["warnings_only.py"]["warnings"]}
    shown = {numbers(r)[0] for r in table.iter("tr", "ctx")}
    for line in warned:  # each with context on both sides, where the file has it
        assert set(range(max(1, line - 3), min(len(lines) - 1, line + 3) + 1)) <= shown
    # no diff to number: each block of context is headed by the lines it shows
    labels = [
        span.text() for head in table.iter("tr", "hunk") for span in head.iter("span", "range")
    ]
    assert labels
    for label in labels:
        first, last = map(int, re.fullmatch(r"lines (\d+)\u2013(\d+)", label).groups())
        assert first <= last


def test_messages_show_code_spans_as_code_not_backticks(port: Port) -> None:
    checked = 0
    notes = [n for n in port.dom.iter("div", "note")]
    for finding in port.report["findings"]:
        spans = re.findall(r"`([^`]+)`", finding["message"])
        for note in notes:
            if note.attrs["data-line"] != str(finding["line"]):
                continue
            (message,) = note.iter("span", "message")
            if message.text() != finding["message"].replace("`", ""):
                continue
            assert [c.text() for c in message.iter("code")] == spans
            checked += bool(spans)
    assert checked >= 10
    assert "`" not in "".join(n.text() for n in notes)


def test_failed_file_shows_its_reason_with_the_caret_in_place(port: Port) -> None:
    section = sections(port)["broken.py"]
    (reason,) = section.iter("pre", "reason")
    (failed,) = port.report["failed"]
    assert reason.text() == failed["reason"]
    assert reason.text().splitlines()[1:] == ["    def f(:", "          ^"]


def test_unchanged_files_are_listed_folded(port: Port) -> None:
    unchanged = port.dom.by_id("unchanged")
    assert unchanged.tag == "details" and "open" not in unchanged.attrs
    assert [c.text() for c in unchanged.iter("code")] == ["bert/run_tiny.py"]
    assert "bert/run_tiny.py" not in sections(port)


def test_patch_is_the_reports_diff_to_copy(port: Port) -> None:
    for path, entry in entries(port).items():
        patches = sections(port)[path].iter("details", "patch")
        assert [p.iter("pre")[0].text() for p in patches] == (
            [entry["diff"]] if "diff" in entry else []
        )


# -- the page in a browser -----------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no /usr/bin/chromium (Debian's chromium package): browser checks of the page skipped",
)


def chromium(port: Port, url_tail: str, *mode: str) -> tuple[Node, str]:
    """Run headless chromium on the page; the DOM it dumps (if asked) and its log."""
    profile = port.root / "chromium-profile"
    proc = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--window-size=1400,1000",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            *mode,
            port.page_path.as_uri() + url_tail,
        ],
        capture_output=True,
        timeout=120,
    )
    log = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, log
    dom = parse(proc.stdout.decode("utf-8")) if "--dump-dom" in mode else Node("#none", {})
    return dom, log


def assert_ran_cleanly(dom: Node, log: str) -> None:
    body = dom.iter("body")[0]
    assert body.attrs.get("data-ready") == "true"  # the script ran to its end
    assert "data-errors" not in body.attrs
    errors = dom.by_id("page-errors")
    assert "hidden" in errors.attrs and errors.text() == ""
    assert not [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def pressed(dom: Node) -> list[str]:
    toggle = dom.iter("div", "toggle")[0]
    return [
        b.attrs["data-view"] for b in toggle.iter("button") if b.attrs["aria-pressed"] == "true"
    ]


@needs_chromium
def test_browser_opens_the_page_in_split_view_without_errors(port: Port) -> None:
    dom, log = chromium(port, "", "--dump-dom")
    assert_ran_cleanly(dom, log)
    assert dom.iter("body")[0].attrs["data-view"] == "split"
    assert pressed(dom) == ["split"]


@needs_chromium
def test_browser_checks_would_catch_a_failing_script(port: Port) -> None:
    broken = port.root / "broken-page.html"
    broken.write_text(port.page.replace("</body>", "<script>nope();</script></body>"), "utf-8")
    dom, log = chromium(Port(port.root, broken, "", port.dom, {}, {}, {}), "", "--dump-dom")
    with pytest.raises(AssertionError):
        assert_ran_cleanly(dom, log)
    assert "nope is not defined" in dom.by_id("page-errors").text()


@needs_chromium
def test_address_opens_unified_view_at_a_file(port: Port) -> None:
    nav = {
        a.iter("span", "path")[0].text(): a.attrs["href"] for a in port.dom.iter("nav")[0].iter("a")
    }
    target = nav["broken.py"][1:]
    dom, log = chromium(port, f"?view=unified#{target}", "--dump-dom")
    assert_ran_cleanly(dom, log)
    assert dom.iter("body")[0].attrs["data-view"] == "unified"
    assert pressed(dom) == ["unified"]
    current = [s.attrs["id"] for s in dom.iter("details", "current")]
    assert current == [target]
    links = [a.attrs["href"] for a in dom.iter("a") if a.attrs.get("aria-current") == "true"]
    assert links == [f"#{target}"]


@needs_chromium
def test_address_opens_a_line_in_the_view_on_screen(port: Port) -> None:
    file_id = sections(port)["control_deps.py"].attrs["id"]
    line = next(
        f["line"]
        for f in port.report["findings"]
        if f["path"] == "control_deps.py" and f["kind"] == "warning"
    )
    for view in ("split", "unified"):
        dom, log = chromium(port, f"?view={view}#f{file_id[5:]}-L{line}", "--dump-dom")
        assert_ran_cleanly(dom, log)
        (row,) = dom.iter("tr", "target")
        assert numbers(row)[0] == line
        assert any(view in t.classes for t in dom.iter("table") if row in t.iter("tr"))


@needs_chromium
def test_screenshot_for_a_person_to_look_at(port: Port) -> None:
    shot = port.root / "review-page.png"
    _, log = chromium(port, "", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 1000)
    assert len(data) > 50_000, "a blank page compresses to a few kB"  # the page was painted
    SCREENSHOT_COPY.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT_COPY)


def test_long_lines_may_wrap_after_punctuation_never_inside_a_name() -> None:
    from migrator.report.review_highlight import highlight, line_html

    line = "    manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(2**32, 1000)"
    cell = line_html(highlight([line])[0])
    # Break opportunities (<wbr>) after the dots and the bracket, none inside an identifier...
    # (one before a space, where a line may wrap anyway, is harmless)
    words = re.sub(r"<[^>]+>", "", cell.replace("<wbr>", "|")).replace("| ", " ")
    assert words == (
        "    manager = tf.|contrib.|mixed_precision.|ExponentialUpdateLossScaleManager(|2**32, "
        "1000)"
    )
    # ...and the cell's text, what a reader copies, is the line itself.
    assert html_text(cell) == line


def html_text(fragment: str) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", fragment))
