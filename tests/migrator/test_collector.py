"""The command line runs Python's cyclic collector between files, not during one
(`processes.collect_between_files`): checked in a process of its own, the setting being global."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_runner import MIGRATOR_FIXTURES, cli_env

SCRIPT = """
import gc, json, sys
from migrator.pipeline import processes, runner
from migrator.pipeline.transform import MigrateOptions

source = open(sys.argv[1], "rb").read()
seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))

def collections(flag):
    processes._collect_between_files = flag
    options = MigrateOptions()
    gc.collect()  # not one started by this script's own allocations (Python 3.12+ starts one
    seen.clear()  # as soon as the count passes the threshold, before the file's work begins)
    prepared, _, error = runner.prepare_one("optimization.py", source, options)
    assert prepared is not None and error is None, error
    return list(seen)

runner.prepare_one("warm.py", source, MigrateOptions())  # imports and caches outside the count
plain = collections(False)  # at the default thresholds
processes.collect_between_files()
gc.set_threshold(700)  # the default again: only the pause keeps the collector out now
paused = collections(True)
print(json.dumps({"plain": plain, "paused": paused, "enabled": gc.isenabled()}))
"""


def test_one_young_collection_per_file_and_none_during_it() -> None:
    source = MIGRATOR_FIXTURES / "bert" / "optimization.py"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(source)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert len(seen["plain"]) > 1  # the file is large enough to collect during it otherwise
    assert seen["paused"] == [0]
    assert seen["enabled"]
