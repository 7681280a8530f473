"""Shared test set-up: quiet TensorFlow's C++ logging before anything imports it, keep TF 2's
import from turning on TF 2 behaviour in the TF 1.15 interpreters tests start, and let the older
stacks collect only the tests meant for them.

Kept importable on Python 3.7 (TF 1.15's stack runs it), as are the tests marked ``stacks``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STACKS_MARK = "mark.stacks"


def pytest_runtest_setup(item):
    """Importing TensorFlow 2 sets TF2_BEHAVIOR=1 in os.environ (its own state is already set by
    then, so nothing here depends on the variable). Every child process would inherit it, and
    TF 1.15 reads it: a script meant to run on TF 1.15's reference variables and graph mode
    would run on resource variables and eager defaults, and pass for the wrong reason."""
    os.environ.pop("TF2_BEHAVIOR", None)


def pytest_ignore_collect(collection_path, config):
    """Under ``-m stacks`` (how `make test` runs the TF 1.15 and TF 2.6.5 venvs) skip importing
    test files that mark nothing for the older stacks: they may use syntax or packages that
    only the main stack has (torch, Keras 3, Python 3.10), and would fail at collection before
    the marker could deselect them. A file takes part by writing ``pytest.mark.stacks``."""
    if "stacks" not in (config.getoption("markexpr", "") or ""):
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return STACKS_MARK not in collection_path.read_text(encoding="utf-8")
