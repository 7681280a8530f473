"""Whether a file imports a module of the run that initialises Horovod: a project-level fact.

tencent-ailab/hok_env's apd_model.py builds its optimizer (a graph rewrite, ported to the library's)
and hands the gradients to gradient_fusion.py, which imports Horovod, calls `hvd.init()` as it is
imported and all-reduces them. Nothing in apd_model.py says it trains distributed, so its port had
no `is_distributed` and nothing said why: on two workers in saturation mode one skipped an
overflowed step that the other applied, where the original's inf/NaN check of the all-reduced
gradients had kept them alike. The value to pass reads Horovod, which the file does not import,
so the port warns instead of writing one.

The run's initialising files are those `init_sites` finds. A file's own imports are read (with
`ast`) only when the port asks, for an optimizer with nothing said about distribution: asked of
every file up front, the dense speed tree's `train`, `utils` and `main` made it read hundreds. An
absolute import counts only from a folder the importer sits in (`from utils import X` in one
project of the run does not mean another project's utils.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence

from migrator.selection.triage import imports
from migrator.sources.module_paths import Paths, module_files, norm


@dataclasses.dataclass(frozen=True)
class HorovodInits:
    """Where the run calls `hvd.init()`, and the run's paths (both normalised)."""

    sites: tuple[tuple[str, str], ...]  # (file, "file:line"), the first call of each file
    paths: tuple[str, ...]


def horovod_inits(sites: Sequence[tuple[str, int]], paths: Iterable[str]) -> HorovodInits | None:
    """The run's initialising files, from `init_sites`; None where there are none."""
    first: dict[str, str] = {}
    for path, line in sites:
        first.setdefault(norm(path), f"{path}:{line}")
    return HorovodInits(tuple(first.items()), tuple(paths)) if first else None


def importer_of(inits: HorovodInits, path: str, source: bytes) -> str | None:
    """Where a file of the run that `path` (its bytes `source`) imports calls `hvd.init()`
    ("file:line"); None where it imports none, or calls it itself."""
    sites = dict(inits.sites)
    importer = norm(path)
    if importer in sites:
        return None
    index = _index(inits.paths)
    for module in sorted(imports(source)):
        for target in module_files(module, importer, index):
            if target in sites and _reachable(target, module, importer):
                return sites[target]
    return None


@functools.lru_cache(maxsize=1)
def _index(paths: tuple[str, ...]) -> Paths:
    return Paths(paths)


def _reachable(target: str, module: str, importer: str) -> bool:
    """Whether the importer can mean `target` by `module`: a relative import, or an absolute
    one from a folder the importer sits in (its own, or a project root above it)."""
    if module.startswith("."):
        return True
    parts = module.split(".")
    for tail in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if target == tail or target.endswith("/" + tail):
            root = target[: len(target) - len(tail)].rstrip("/")
            return not root or importer.startswith(root + "/")
    return False
