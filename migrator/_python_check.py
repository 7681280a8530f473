"""The `npu-migrate` console script: checks the Python version before importing the migrator.

The package installs on Python 3.7 (the library runs where TensorFlow 1.15 does), but the migrator
needs 3.10+ and its dependencies (libcst, click) are only installed there. Without this check the
command would die on an import error that never names Python. So this module stays importable on
any Python 3 (standard library only, no newer syntax) and is the entry point itself.
"""

import sys

REQUIRED = (3, 10)


def message(version=None):
    """The one sentence shown on a Python the migrator cannot run on."""
    major, minor = (version or sys.version_info)[:2]
    return (
        f"npu-migrate: the migrator needs Python 3.10 or newer (this is Python {major}.{minor}); "
        "run it from a Python 3.10+ environment -- the code it writes runs on Python 3.7 and later."
    )


def main():
    """Exit 2 with one sentence on an older Python; otherwise run the migrator's CLI."""
    if sys.version_info < REQUIRED:
        sys.stderr.write(message() + "\n")
        raise SystemExit(2)
    from migrator.cli import main as cli_main

    cli_main()
