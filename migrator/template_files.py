"""The files under the top-level templates/ folder, wherever the migrator runs from.

An installed distribution carries them as the package data `migrator.templates` (pyproject maps
that package to templates/); a checkout run in place reads templates/ beside the package. No
symlink: it would break on checkouts and archives without them.
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent / "templates"


def _folder() -> Traversable:
    try:
        installed = resources.files("migrator.templates")
    except ModuleNotFoundError:
        return _CHECKOUT
    return installed if installed.joinpath("README.md").is_file() else _CHECKOUT


def read(name: str) -> str:
    """The text of templates/NAME."""
    return _folder().joinpath(name).read_text(encoding="utf-8")
