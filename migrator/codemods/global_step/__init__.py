"""The global-step move: advance `global_step` inside the optimizers' `apply_gradients`.

One subpackage because the move is one rewrite in several parts: `names` and `exprs` recognise
what a step update looks like, `tree` walks and reads assignments, `analysis` finds the updates and
optimizer classes of a module (with the readers `classes`, `conditions`, `increments` and `tracing`
over the metadata questions of `reading`) and records them as `model` records, `edit` rewrites a
file, and `plan` decides across files (scan, build_plan, rewrite). Callers use the names
re-exported here.
"""

from migrator.codemods.global_step.plan import (
    GLOBAL_STEP_TRIGGERS,
    MANUAL,
    MOVE,
    GlobalStepFacts,
    GlobalStepPlan,
    build_plan,
    metadata_needed,
    plan_warnings,
    rewrite,
    scan,
    share,
    touches,
)

__all__ = [
    "GLOBAL_STEP_TRIGGERS",
    "MANUAL",
    "MOVE",
    "GlobalStepFacts",
    "GlobalStepPlan",
    "build_plan",
    "metadata_needed",
    "plan_warnings",
    "rewrite",
    "scan",
    "share",
    "touches",
]
