"""pytest plugin of benchmarks/mutation.py: record what each test runs, then run a mutant's tests
in the order most likely to fail fast.

Recording pass (NPU_MUTATION_COVERAGE set): before each test, its id goes into the environment
(NPU_MUTATION_TEST, which sitecustomize reads in every process the test starts) and into the
coverage context of this process; each test's time, setup and teardown included, is written to
NPU_MUTATION_DURATIONS at the end.

Mutant pass (NPU_MUTATION_MAP names the JSON that mutation.py built from the recording): the
mutated line is found by comparing the area's modules with their unmutated text, and the test
modules holding a test that ran that line go first, quickest first, then every other module.
Only the order changes: every test of the area still runs unless one fails (`-x`), so a mutant
survives exactly when it would survive the whole area's tests, whatever the recording missed.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

_durations: dict[str, float] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not os.environ.get("NPU_MUTATION_COVERAGE"):
        return
    os.environ["NPU_MUTATION_TEST"] = item.nodeid
    import coverage

    current = coverage.Coverage.current()
    if current is not None:
        current.switch_context(item.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("NPU_MUTATION_DURATIONS")
    if target:
        Path(target).write_text(json.dumps(_durations), encoding="utf-8")


def _statement_lines(source: str, line: int) -> range:
    """The lines of the innermost statement holding `line` (a compound statement's header only):
    the tracer records a multi-line statement under any of its lines."""
    spans = [(line, line)]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        end = node.end_lineno or node.lineno
        if isinstance(body, list) and body and body[0].lineno > node.lineno:
            end = body[0].lineno - 1
        if node.lineno <= line <= end:
            spans.append((node.lineno, end))
    # The innermost: the one starting last, the shortest of those.
    start, end = max(spans[1:] or spans, key=lambda span: (span[0], -span[1]))
    return range(start, end + 1)


def _mutated(root: Path, recorded: dict) -> tuple[str, int, str] | None:
    for module, text in recorded["texts"].items():
        now = (root / module).read_text(encoding="utf-8")
        if now == text:
            continue
        for number, (before, after) in enumerate(zip(text.splitlines(), now.splitlines()), 1):
            if before != after:
                return module, number, now
        return module, min(len(text.splitlines()), len(now.splitlines())) + 1, now
    return None


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    source = os.environ.get("NPU_MUTATION_MAP")
    if not source:
        return
    recorded = json.loads(Path(source).read_text(encoding="utf-8"))
    durations: dict[str, float] = recorded["durations"]
    ran: set[str] = set()
    found = _mutated(Path(str(config.rootpath)), recorded)
    if found is not None:
        module, line, text = found
        lines = recorded["lines"].get(module, {})
        for number in _statement_lines(text, line):
            ran.update(lines.get(str(number), ()))
    # A line that ran while the tests were being imported ran for every test: no order to gain.
    if "" in ran:
        ran = set()
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(item.nodeid.split("::")[0], []).append(item)

    def cost(group: list[pytest.Item]) -> tuple[bool, float]:
        hit = any(item.nodeid in ran for item in group)
        return (not hit, sum(durations.get(item.nodeid, 0.0) for item in group))

    items[:] = [item for group in sorted(groups.values(), key=cost) for item in group]
