"""Every mutant benchmarks/mutation_equivalent.tsv explains is one cosmic-ray still makes.

A row is keyed by module, line and operator: when code above it moves, the row would silently
stop matching its survivor (which then counts against the score unexplained) or, worse, match
another mutant on the line that took its place. cosmic-ray's own `init` lists the mutants of the
modules the rows name, from the checkout as it is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_runner import REPO_ROOT
from cosmic_ray.work_db import WorkDB, use_db

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import mutation  # noqa: E402


def test_every_explained_mutant_is_made_by_cosmic_ray_from_the_current_source(
    tmp_path: Path,
) -> None:
    rows = mutation._equivalents()
    assert rows, "no rows read: the file or its format changed"
    modules = sorted({module for module, _, _ in rows})
    config = tmp_path / "equivalents.toml"
    session = tmp_path / "equivalents.sqlite"
    config.write_text(
        mutation._config(REPO_ROOT, modules, ["tests"], 60, tmp_path / "map.json"), encoding="utf-8"
    )
    cosmic_ray = Path(sys.executable).parent / "cosmic-ray"
    subprocess.run(
        [str(cosmic_ray), "init", str(config), str(session)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    with use_db(str(session), WorkDB.Mode.open) as db:
        made = {
            (str(m.module_path), m.start_pos[0], m.operator_name)
            for item in db.work_items
            for m in item.mutations
        }
    assert sorted(key for key in rows if key not in made) == []
