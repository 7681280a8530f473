"""The mutation run's ordering: a mutant's tests start with those that ran its line, in this
process or in a subprocess a test started, and every other test still runs after them.

A small project in a temporary folder (a module with two functions; one test module calling each
in-process, one calling the second through a subprocess, one calling neither) is recorded with
benchmarks/mutation.py's own recording pass, then mutated as cosmic-ray would, and pytest with
the mutation_order plugin is asked for its order.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_runner import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import mutation  # noqa: E402

MODULE = """\
def double(x):
    return 2 * x


def halve(x):
    total = (
        x
        /
        2
    )
    return total
"""

TESTS = {
    "tests/test_a_double.py": "from pkg.m import double\n\n\ndef test_double():\n"
    "    assert double(2) == 4\n",
    "tests/test_b_nothing.py": "def test_nothing():\n    assert True\n",
    "tests/test_c_halve_in_a_subprocess.py": "import subprocess, sys\n\n\n"
    "def test_halve():\n    code = 'from pkg.m import halve; assert halve(4) == 2'\n"
    "    subprocess.run([sys.executable, '-c', code], check=True)\n",
}


def _project(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (root / "pkg" / "m.py").write_text(MODULE, encoding="utf-8")
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n", encoding="utf-8")
    for name, text in TESTS.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    hooks = root / mutation.HOOKS
    hooks.mkdir(parents=True)
    for source in (REPO_ROOT / mutation.HOOKS).glob("*.py"):
        (hooks / source.name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")


def _order(root: Path, ordering: Path) -> list[str]:
    command = mutation._test_command(root, ["tests"], NPU_MUTATION_MAP=str(ordering))
    listed = subprocess.run(
        command + " --collect-only",
        shell=True,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return [line.split("::")[1] for line in listed.stdout.splitlines() if "::" in line]


def test_tests_that_ran_the_mutated_line_come_first_and_the_others_still_run(
    tmp_path: Path,
) -> None:
    _project(tmp_path)
    ordering = mutation._record(tmp_path, ["pkg/m.py"], ["tests"], "pkg")
    source = tmp_path / "pkg" / "m.py"
    everything = ["test_double", "test_halve", "test_nothing"]
    # Unmutated: no line to go by, quickest first (the subprocess's test is the slowest).
    unmutated = _order(tmp_path, ordering)
    assert sorted(unmutated) == everything and unmutated[-1] == "test_halve"

    # The operator alone on a line of a statement spread over four (a line the tracer never
    # reports): only the test whose subprocess ran that statement comes first, though slowest.
    source.write_text(MODULE.replace("/\n", "*\n"), encoding="utf-8")
    order = _order(tmp_path, ordering)
    assert order[0] == "test_halve" and sorted(order) == everything

    source.write_text(MODULE.replace("2 * x", "3 * x"), encoding="utf-8")
    order = _order(tmp_path, ordering)
    assert order[0] == "test_double" and sorted(order) == everything
