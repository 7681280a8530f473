"""Run the real `npu-migrate` CLI as a subprocess, the way a user's shell or pre-commit would.

Shared by every migrator test so they all exercise the same entry point (`python -m migrator`) with
the same deterministic environment: no colour, no terminal, UTF-8 text I/O, and the repository
importable even when the package was not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MIGRATOR_FIXTURES = REPO_ROOT / "tests" / "migrator" / "fixtures"


def cli_env() -> dict[str, str]:
    """The environment for a CLI subprocess: the parent's, made deterministic."""
    env = dict(os.environ)
    env["NO_COLOR"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    env["PYTHONUTF8"] = "1"
    env.pop("FORCE_COLOR", None)
    env.pop("CLICOLOR_FORCE", None)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + existing if existing else "")
    return env


def run_cli(
    *args: str | os.PathLike[str],
    cwd: Path | None = None,
    input: bytes | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m migrator *args`; stdout and stderr come back as text."""
    proc = subprocess.run(
        [sys.executable, "-m", "migrator", *map(str, args)],
        cwd=cwd,
        input=input,
        capture_output=True,
        env=cli_env(),
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        proc.args,
        proc.returncode,
        proc.stdout.decode("utf-8", errors="replace"),
        proc.stderr.decode("utf-8", errors="replace"),
    )


def port_fixture_tree(root: Path, fixtures: Path) -> dict:
    """Copy a fixture folder to root/src, port it to root/out with a JSON report, and check the
    port again: what a module-scoped fixture of the port's tests hands to each test."""
    src, out = root / "src", root / "out"
    shutil.copytree(fixtures, src)
    report = root / "report.json"
    first = run_cli("--output-dir", out, "--copy-unchanged", "--report", report, "--no-color", src)
    assert first.returncode == 0, first.stderr
    again = run_cli("--check", "--no-color", out)
    findings = json.loads(report.read_text(encoding="utf-8"))["findings"]
    return {"src": src, "out": out, "findings": findings, "again": again}


def findings_of(ported: dict, name: str) -> list[dict]:
    """The findings `port_fixture_tree`'s report holds for the fixture file `name`."""
    return [f for f in ported["findings"] if Path(f["path"]).name == name]


def only_warning(ported: dict, fixtures: Path, name: str, text: str, rule: str) -> str:
    """The message of the fixture file's one finding, checked to be `rule`'s warning on the
    first line of the original that holds `text`."""
    source = (fixtures / name).read_text(encoding="utf-8").splitlines()
    line = next(n for n, held in enumerate(source, 1) if text in held)
    (found,) = findings_of(ported, name)
    assert (found["rule"], found["kind"], found["line"]) == (rule, "warning", line)
    return found["message"]
