"""Shared test set-up: quiet TensorFlow's C++ logging before anything imports it, and let the
older stacks collect only the tests meant for them.

Kept importable on Python 3.7 (TF 1.15's stack runs it), as are the tests marked ``stacks``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STACKS_MARK = "mark.stacks"


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
