"""Which files of the run are imported by a file that builds a tf.distribute strategy: a
project-level fact.

tensorflow/tpu's RetinaNet builds its MirroredStrategy in retinanet_main.py and hands the
Estimator the model_fn of retinanet_model.py, which builds the optimizer: nothing in that file
says it trains distributed, so its port had no `is_distributed=`, and under two replicas the
library refused it at graph build. The strategy file's imports name the files its strategy may
run; their TF1 optimizers get `tf.distribute.has_strategy()`, true exactly where the optimizer is
built under a strategy, and false, like the keyword left out, everywhere else.

The strategy files are found by a byte test of every file read (their own bytes need name no
loss-scale API), then their imports are read with `ast` and resolved the way the global-step plan
resolves them (migrator.sources.module_paths).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from migrator.selection.triage import imports
from migrator.sources.module_paths import Paths, module_files, norm

# A strategy class called on a line that is not a comment (`tf.distribute.MirroredStrategy(`,
# `contrib_distribute.OneDeviceStrategy(`), or one handed to an Estimator's RunConfig.
_BUILDS = re.compile(rb"^[^#\n]*(?:Strategy\s*\(|\b(?:train|eval)_distribute\s*=)", re.M)


def builds_strategy(data: bytes) -> bool:
    """Whether the file may build a tf.distribute strategy (a byte test: no parse)."""
    return (b"Strategy" in data or b"_distribute" in data) and _BUILDS.search(data) is not None


def strategy_importers(
    builders: Sequence[tuple[str, bytes]], paths: Iterable[str]
) -> frozenset[tuple[str, str]]:
    """(imported file, the first strategy file importing it) for every file of `paths` (the
    run's, normalised) that one of `builders` (path, bytes) imports; both paths normalised
    (module_paths.norm). The run's paths are indexed only where some file builds a strategy."""
    if not builders:
        return frozenset()
    index = Paths(paths)
    found: dict[str, str] = {}
    for path, data in builders:
        importer = norm(path)
        for module in sorted(imports(data)):
            for target in module_files(module, importer, index):
                if target != importer:
                    found.setdefault(target, importer)
    return frozenset(found.items())
