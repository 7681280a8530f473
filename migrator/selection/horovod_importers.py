"""Which files of the run import a module that initialises Horovod: a project-level fact.

tencent-ailab/hok_env's apd_model.py builds its optimizer (a graph rewrite, ported to the library's)
and hands the gradients to gradient_fusion.py, which imports Horovod, calls `hvd.init()` as it is
imported and all-reduces them. Nothing in apd_model.py says it trains distributed, so its port had
no `is_distributed` and nothing said why: on two workers in saturation mode one skipped an
overflowed step that the other applied, where the original's inf/NaN check of the all-reduced
gradients had kept them alike. The value to pass reads Horovod, which the file does not import,
so the port warns instead of writing one.

The initialising files are those `init_sites` finds; a file is read for its imports (with `ast`,
through the triage's cached reader) only where its bytes spell one of their module names, and an
absolute import counts only from a folder the importer sits in (`from utils import X` in one
project of the run does not mean another project's utils.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import PurePath

from migrator.selection.triage import imports
from migrator.sources.module_paths import Paths, module_files, norm


def horovod_importers(
    sites: Sequence[tuple[str, int]], files: Iterable[tuple[str, bytes]], paths: Iterable[str]
) -> frozenset[tuple[str, str]]:
    """(file, "initialising file:line") for every file of `files` (path, bytes) that imports a
    file of the run calling `hvd.init()` (`sites`, as `init_sites` gives them) and calls none
    itself; the first path normalised (module_paths.norm), as the run's `paths` are."""
    if not sites:
        return frozenset()
    inits: dict[str, str] = {}
    for path, line in sites:
        inits.setdefault(norm(path), f"{path}:{line}")
    names = {_module_name(p).encode() for p in inits}
    index: Paths | None = None
    found: dict[str, str] = {}
    for path, data in files:
        importer = norm(path)
        if importer in inits or not any(name in data for name in names):
            continue
        index = Paths(paths) if index is None else index
        for module in sorted(imports(data)):
            for target in module_files(module, importer, index):
                if target in inits and _reachable(target, module, importer):
                    found.setdefault(importer, inits[target])
    return frozenset(found.items())


def _reachable(target: str, module: str, importer: str) -> bool:
    """Whether the importer can mean `target` by `module`: a relative import, or an absolute
    one from a folder the importer sits in (its own, or a project root above it). A file of
    the same name in another project of the run (another `utils.py`) is not warned about."""
    if module.startswith("."):
        return True
    parts = module.split(".")
    for tail in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if target == tail or target.endswith("/" + tail):
            root = target[: len(target) - len(tail)].rstrip("/")
            return not root or importer.startswith(root + "/")
    return False


def _module_name(path: str) -> str:
    """The name an import of the file spells last: its stem, or its package's for __init__.py."""
    pure = PurePath(path)
    return pure.parent.name if pure.stem == "__init__" else pure.stem
