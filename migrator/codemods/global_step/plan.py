"""Move a hand-made `global_step` update into the optimizers' `apply_gradients`.

Scripts like BERT's `create_optimizer` advance `global_step` next to the train op. Under loss
scaling an overflowed step is skipped, and learning-rate schedules read `global_step`, so the step
must advance only when the optimizer really applies gradients. The loss-scale optimizer calls the
inner `apply_gradients` only on clean steps, so that is where the increment goes.

Three phases, because a function and the optimizer classes it uses often live in different files:
`scan` records per-file facts, `build_plan` decides for the whole project (all-or-nothing for every
function and the classes it shares with others), `rewrite` edits one file by the plan. The move is
applied only where the function builds a loss-scale optimizer (the contrib/TF one before porting
or `NPULossScaleOptimizer` after, so the order of codemods does not matter) and the update is
unconditional or conditional on gradient finiteness; everything else is reported, never guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrator import registry
from migrator.codemods.global_step.analysis import Analyzer
from migrator.codemods.global_step.edit import (
    Edits,
    apply_edits,
    increment_statements,
    quote_style,
    template,
)
from migrator.codemods.global_step.model import NEW_STEP, ClassState, ModuleAnalysis, OptimizerRef
from migrator.codemods.shared.visiting import visit_wrapper
from migrator.findings import Finding
from migrator.selection.half_moves import moved_updates
from migrator.selection.prefilter import (
    GLOBAL_STEP_TRIGGERS as GLOBAL_STEP_TRIGGERS,  # contract name
)
from migrator.sources.module_paths import Paths, module_files, norm

MOVE = registry.GLOBAL_STEP_MOVE
MANUAL = registry.GLOBAL_STEP_MANUAL


@dataclasses.dataclass(frozen=True)
class ClassFact:
    name: str
    line: int
    state: ClassState
    reason: str
    bases: tuple[OptimizerRef, ...]


@dataclasses.dataclass(frozen=True)
class FunctionFact:
    key: str
    name: str
    line: int
    problem: str | None
    problem_line: int
    optimizers: tuple[OptimizerRef, ...]
    passes_step: bool
    scaled: bool
    op_name: str | None = None  # the name the script gave its step-update op


@dataclasses.dataclass(frozen=True)
class GlobalStepFacts:
    """What one file contributes to the plan (plain data, picklable)."""

    path: str
    classes: tuple[ClassFact, ...]
    functions: tuple[FunctionFact, ...]
    loss_scale_lines: tuple[int, ...]
    unscaled_steps: tuple[tuple[str, int], ...]
    # (line, classes, op name) of each note a move left above an update it commented out: a
    # class named there that can still take the increment did not get it (a half-applied move).
    notes: tuple[tuple[int, tuple[str, ...], str | None], ...] = ()


DEFAULT_OP_NAME = "step_update"


@dataclasses.dataclass(frozen=True)
class GlobalStepPlan:
    """Which functions lose their update, which classes gain one, and what to report."""

    moves: tuple[tuple[str, str, str], ...] = ()  # (path, function key, where the step goes)
    inserts: tuple[tuple[str, str, str], ...] = ()  # (path, class name, step-update op name)
    warnings: tuple[Finding, ...] = ()


def _analyze(wrapper: MetadataWrapper, *, source: bytes | None = None) -> ModuleAnalysis:
    """The module's analysis; with its `source`, only the parts its text can hold (`scan`)."""
    if source is None:
        analyzer = Analyzer()
    else:
        analyzer = Analyzer(steps=_steps(source))
    visit_wrapper(wrapper, analyzer)
    return analyzer.result


def _facts(analysis: ModuleAnalysis, path: str) -> GlobalStepFacts:
    return GlobalStepFacts(
        path=norm(path),
        classes=tuple(
            ClassFact(c.name, c.line, c.state, c.reason, tuple(c.bases))
            for c in analysis.classes.values()
        ),
        functions=tuple(
            FunctionFact(
                f.key,
                f.name,
                f.line,
                f.problem,
                f.problem_line,
                tuple(f.optimizers),
                any(s.step_passed for s in f.call_sites),
                f.scaled,
                f.op_name,
            )
            for f in analysis.step_functions
        ),
        loss_scale_lines=tuple(analysis.loss_scale_lines),
        unscaled_steps=tuple(analysis.unscaled_steps),
    )


def metadata_needed(source: bytes, module: cst.Module) -> Collection[type]:
    """The metadata `scan` resolves for this file (none when it can skip the analysis).

    Without `global_step` in the text there are no step updates to read, so what is left is the
    module-level classes (an optimizer class another file uses): the parsed module says whether
    there are any, where the word `class` was in nearly every file.
    """
    if not (_steps(source) or _classes(module)):
        return ()
    return Analyzer.get_inherited_dependencies()


def _steps(source: bytes) -> bool:
    # Every step update the analysis reads names `global_step` or one of tf's step getters
    # (`get_global_step`, ...), all spelled with it, even through an import alias.
    return b"global_step" in source


def _classes(module: cst.Module) -> bool:
    return any(isinstance(stmt, cst.ClassDef) for stmt in module.body)


def scan(module: MetadataWrapper | cst.Module, path: str, *, source: bytes) -> GlobalStepFacts:
    """Record one file's step updates and optimizer classes for `build_plan`.

    A wrapper is accepted so the caller can share resolved metadata with the other codemods.
    Without `global_step` in the text there are no step updates, and without module-level classes
    nothing else to record, so the scope analysis is skipped; the file still
    counts as processed for the plan. `source` is the file's bytes, tested instead of the tree:
    generating its code costs a walk.
    """
    tree = module.module if isinstance(module, MetadataWrapper) else module
    if not metadata_needed(source, tree):
        return GlobalStepFacts(norm(path), (), (), (), ())
    wrapper = module if isinstance(module, MetadataWrapper) else MetadataWrapper(module)
    facts = _facts(_analyze(wrapper, source=source), path)
    if b"npu-migrate:" not in source:
        return facts
    notes = tuple((line, tuple(names), op) for line, names, op in moved_updates(source))
    return dataclasses.replace(facts, notes=notes)


def touches(plan: GlobalStepPlan, path: str) -> bool:
    """Whether `rewrite` would edit this file (otherwise it only reports the plan's warnings)."""
    key = norm(path)
    return any(p == key for p, _, _ in plan.moves) or any(p == key for p, _, _ in plan.inserts)


def share(plan: GlobalStepPlan, path: str) -> tuple[tuple[object, ...], ...]:
    """All `rewrite` reads of `plan` for one file: it edits and warns about the file alike under
    two plans whose shares for it are equal."""
    key = norm(path)
    return (
        tuple(m for m in plan.moves if m[0] == key),
        tuple(i for i in plan.inserts if i[0] == key),
        tuple(w for w in plan.warnings if norm(w.path) == key),
    )


def plan_warnings(plan: GlobalStepPlan, path: str) -> list[Finding]:
    """The plan's findings for one file, under the path the caller uses for it."""
    key = norm(path)
    return [dataclasses.replace(w, path=path) for w in plan.warnings if norm(w.path) == key]


class _Resolver:
    """Answers "which class does this reference mean, and where must the increment go?"."""

    def __init__(self, facts: Iterable[GlobalStepFacts]) -> None:
        self.files = {f.path: f for f in facts}
        self.paths = Paths(self.files)
        self.classes = {(f.path, c.name): c for f in self.files.values() for c in f.classes}

    def module_path(self, module: str, importer: str) -> tuple[str | None, str]:
        found = module_files(module, importer, self.paths)
        if len(found) == 1:
            return found[0], ""
        if found:
            return None, f"module `{module}` matches several processed files ({', '.join(found)})"
        return None, f"it is defined in module `{module}`, which is not among the processed files"

    def targets(
        self, ref: OptimizerRef, importer: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> tuple[set[tuple[str, str]], bool, list[str]]:
        """(classes that need the increment, whether a tf.train optimizer is involved, problems)."""
        if ref.kind == "builtin":
            return set(), True, []
        if ref.kind == "unknown":
            return set(), False, [f"cannot tell where `{ref.text}` is defined"]
        path = importer
        if ref.kind == "import":
            found, reason = self.module_path(ref.module, importer)
            if found is None:
                return set(), False, [f"`{ref.text}`: {reason}"]
            path = found
        cls = self.classes.get((path, ref.name))
        if cls is None:
            return set(), False, [f"`{ref.text}` is not a module-level class in {path}"]
        where = f"{cls.name} ({path}:{cls.line})"
        if (path, cls.name) in seen:
            return set(), False, [f"{where} inherits from itself"]
        if cls.state in ("insertable", "inserted"):
            # "inserted": a move left half by a killed or failed write; the function completes it.
            return {(path, cls.name)}, False, []
        if cls.state == "advances":
            return set(), False, [f"{where} already advances global_step in apply_gradients"]
        if cls.state == "unsupported":
            return set(), False, [f"{where}: {cls.reason}"]
        if not cls.bases:
            return set(), False, [f"{where} has no apply_gradients of its own and no base class"]
        targets: set[tuple[str, str]] = set()
        builtin = False
        problems: list[str] = []
        for base in cls.bases:
            t, b, p = self.targets(base, path, seen | {(path, cls.name)})
            targets |= t
            builtin |= b
            problems += p
        return targets, builtin, problems


def build_plan(facts: Iterable[GlobalStepFacts]) -> GlobalStepPlan:
    """Decide the move for the whole project; a function moves only with all its classes."""
    resolver = _Resolver(facts)
    uses: dict[tuple[str, str], set[tuple[str, str]]] = {}  # function -> classes
    blocked: dict[tuple[str, str], tuple[str, int]] = {}  # function -> (reason, line)
    functions = {(f.path, fn.key): (f, fn) for f in resolver.files.values() for fn in f.functions}
    for (path, key), (_, fn) in functions.items():
        targets: set[tuple[str, str]] = set()
        builtin = False
        problems: list[str] = []
        for ref in fn.optimizers:
            t, b, p = resolver.targets(ref, path)
            targets |= t
            builtin |= b
            problems += [f"{x} (used at line {ref.line})" for x in p]
        if builtin and fn.passes_step:
            problems.append(
                "a tf.train optimizer it may use already advances global_step when apply_gradients "
                "receives it, so the step would advance twice"
            )
        uses[path, key] = targets
        if not fn.scaled:
            # Not a candidate (reported below when its file scales losses); it only keeps the
            # classes it uses unchanged.
            blocked[path, key] = ("it builds no loss-scale optimizer", fn.line)
        elif fn.problem is not None:
            blocked[path, key] = (fn.problem, fn.problem_line)
        elif problems:
            blocked[path, key] = ("; ".join(problems), fn.line)
    # All or nothing: a class shared with a function that cannot move must not gain an increment,
    # and then no function using that class may lose its own.
    changed = True
    while changed:
        changed = False
        tainted = {c for f in blocked for c in uses.get(f, ())}
        for f, classes in uses.items():
            if f not in blocked and classes & tainted:
                others = sorted(
                    f"{functions[g][1].name} ({g[0]})"
                    for g in blocked
                    if uses.get(g, set()) & classes
                )
                shared = ", ".join(sorted(c for _, c in classes & tainted))
                blocked[f] = (
                    f"{shared} is also used by {', '.join(others)}, which cannot be moved",
                    functions[f][1].line,
                )
                changed = True
    moves, warnings = [], []
    op_names = _half_applied_inserts(resolver, {c for f in blocked for c in uses.get(f, ())})
    for (path, key), (_, fn) in sorted(functions.items()):
        if (path, key) in blocked:
            reason, line = blocked[path, key]
            if fn.scaled:
                warnings.append(_manual(path, line or fn.line, fn.name, reason))
            continue
        classes = sorted(uses[path, key])
        for cls in classes:
            op_names.setdefault(cls, set()).add(fn.op_name or DEFAULT_OP_NAME)
        where = ", ".join(f"{c}.apply_gradients" for _, c in classes) or (
            "the tf.train optimizer's apply_gradients"
        )
        moves.append((path, key, where))
    for f in resolver.files.values():
        if f.loss_scale_lines:
            warnings.extend(
                Finding(
                    f.path,
                    line,
                    MANUAL,
                    f"{name} advances global_step itself but builds no loss-scale optimizer; if "
                    "one wraps its optimizer elsewhere, overflowed steps still advance the step: "
                    "move "
                    "the update into apply_gradients by hand",
                    kind="warning",
                )
                for name, line in f.unscaled_steps
            )
    # The script's own op name where every function moving into a class used the same one
    # (fetches and hooks find the op by it); otherwise the name TF1 BERT scripts use.
    inserts = sorted(
        (path, cls, next(iter(names)) if len(names) == 1 else DEFAULT_OP_NAME)
        for (path, cls), names in op_names.items()
    )
    return GlobalStepPlan(tuple(moves), tuple(inserts), tuple(warnings))


def _half_applied_inserts(
    resolver: _Resolver, tainted: set[tuple[str, str]]
) -> dict[tuple[str, str], set[str]]:
    """class -> op names, for the classes a moved-update note names that never got their increment
    (a run killed between the writes of a move, a class file restored by hand): the move is
    completed there. Only where it is unambiguous and safe: one class of that name among the files,
    still insertable, and used by no function whose own update stays (its step would advance
    twice). Elsewhere the note stays half and the run reports it (migrator.selection.half_moves).
    """
    found: dict[tuple[str, str], set[str]] = {}
    for facts in resolver.files.values():
        for _, names, op in facts.notes:
            for name in names:
                places = [key for key in resolver.classes if key[1] == name]
                if len(places) != 1 or places[0] in tainted:
                    continue
                if resolver.classes[places[0]].state == "insertable":
                    found.setdefault(places[0], set()).add(op or DEFAULT_OP_NAME)
    return found


def _manual(path: str, line: int, name: str, reason: str) -> Finding:
    return Finding(
        path,
        line,
        MANUAL,
        f"{name} advances global_step outside the optimizer and was left unchanged: {reason}. "
        "With loss scaling an overflowed step must not advance it; move the update into "
        "apply_gradients by hand",
        kind="warning",
    )


def rewrite(
    wrapper: MetadataWrapper | cst.Module, path: str, plan: GlobalStepPlan | None
) -> tuple[cst.Module, list[Finding]]:
    """Edit one file by the plan (a one-file plan when None); returns the tree and findings."""
    if not isinstance(wrapper, MetadataWrapper):
        wrapper = MetadataWrapper(wrapper)
    module = wrapper.module
    if plan is not None and not touches(plan, path):
        return module, plan_warnings(plan, path)
    analysis = _analyze(wrapper)
    if plan is None:
        plan = build_plan([_facts(analysis, path)])
    path_key = norm(path)
    findings = plan_warnings(plan, path)
    moves = {key: where for p, key, where in plan.moves if p == path_key}
    inserts = {name: op for p, name, op in plan.inserts if p == path_key}
    edits = Edits()
    for fn in analysis.step_functions:
        if fn.key not in moves:
            continue
        if fn.problem is not None:
            findings.append(_manual(path, fn.problem_line or fn.line, fn.name, fn.problem))
            continue
        note = template("global_step_moved_note.tmpl").strip().format(where=moves[fn.key])
        for inc in fn.increments:
            for i, stmt in enumerate(inc.statements):
                last = i == len(inc.statements) - 1
                edits.removals[id(stmt)] = (
                    note if i == 0 else None,
                    inc.replacement if last else None,
                )
            findings.append(
                Finding(
                    path,
                    inc.line,
                    MOVE,
                    f"{fn.name}: commented out the hand-made global_step update; the step now "
                    f"advances in {moves[fn.key]}, which runs only on steps without overflow",
                )
            )
        for site in fn.call_sites:
            if not site.step_passed:
                edits.step_arguments[id(site.call)] = fn.step
                findings.append(
                    Finding(
                        path,
                        site.line,
                        MOVE,
                        f"{fn.name}: passes global_step={fn.step} so the optimizer can advance it",
                    )
                )
    quote = quote_style(module)
    for name in sorted(inserts):
        cls = analysis.classes.get(name)
        if cls is None or cls.state in ("advances", "inserted"):
            continue
        if cls.state != "insertable" or cls.apply is None:
            findings.append(
                Finding(
                    path,
                    cls.line if cls else 1,
                    MANUAL,
                    f"{name}: the plan needs a global_step increment in apply_gradients but the "
                    f"class changed shape ({cls.reason if cls else 'not found'}); add it by hand",
                    kind="warning",
                )
            )
            continue
        opening, closing = increment_statements(
            step=cls.step_param,
            tf=cls.tf_alias,
            updates=cls.list_name,
            quote=quote,
            name=inserts[name],
            reads=bool(cls.step_reads),
        )
        edits.insertions[id(cls.apply)] = closing
        if cls.shadow is not None:
            edits.renames.update((id(n), cls.shadow[0]) for n in cls.shadow[1])
        if opening:
            edits.openings[id(cls.apply)] = opening
            edits.renames.update((id(n), NEW_STEP) for n in cls.step_reads)
        findings.append(
            Finding(
                path,
                cls.return_line,
                MOVE,
                f"{name}.apply_gradients: advances {cls.step_param} before returning, guarded by "
                f"`{cls.step_param} is not None` (the loss-scale optimizer calls it only on clean "
                "steps)"
                + (
                    f"; its reads of {cls.step_param} now read {NEW_STEP} = "
                    f"{cls.step_param} + 1, the step being made, as under TF 1.15"
                    if opening
                    else ""
                )
                + (
                    f"; its own local `{cls.step_param}` (set before any read of the argument) "
                    f"is now `{cls.shadow[0]}`, so the increment advances the argument"
                    if cls.shadow is not None
                    else ""
                ),
            )
        )
    if not edits:
        return module, findings
    return apply_edits(module, edits), findings
