"""The single entry point that parses a file once and chains the codemods over it.

The CLI only talks to this module: a cheap byte pre-filter (migrator.selection.prefilter,
re-exported), then per file `prepare_source` (the plan facts and the loss-scale port, from one parse
and one metadata resolution, run in worker processes), `plan_from_facts` once for the project, and
`finish` per file. `migrate_source` chains the three for one file. Keeping parsing here means every
codemod sees the same tree and the file is either rewritten as a whole or not at all.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable, Iterable
from typing import Literal

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrator.codemods import add_loss_scale, global_step
from migrator.codemods.port import (
    LOSS_SCALE_METADATA,
    TORCH_METADATA,
    port_loss_scale,
    port_torch,
)
from migrator.codemods.shared.add_loss_scale_choice import manager_call
from migrator.codemods.shared.codegen import bytes_of, code_of
from migrator.codemods.shared.lines import remember_starts
from migrator.codemods.shared.splice import ported_bytes
from migrator.codemods.shared.visiting import Wrapper
from migrator.codemods.targets import npu_bridge
from migrator.findings import Finding, MigrationResult, SourceError
from migrator.pipeline import cst_parse, outline, slicing
from migrator.selection import (
    auto_mixed_precision,
    framework_fp16,
    hand_loss_scale,
    torch_hand_loss_scale,
    unscaled_gradients,
)
from migrator.selection.horovod_importers import HorovodInits, importer_of
from migrator.selection.keras_helpers import KerasHelper
from migrator.selection.prefilter import might_need_loss_scale_port, might_need_torch_port
from migrator.selection.prefilter import (
    might_need_migration as might_need_migration,  # the CLI's contract
)
from migrator.selection.scaler_helpers import ScalerHelper, calls_helper
from migrator.sources import limits, source_errors
from migrator.sources.module_paths import norm

Distributed = Literal["auto", "always", "never"]


@dataclasses.dataclass(frozen=True)
class MigrateOptions:
    """User choices that change the output (not how files are found or written)."""

    distributed: Distributed = "auto"
    add_loss_scale: str | None = None  # 'dynamic' or a fixed scale: see codemods.add_loss_scale
    target: str = "npulossscale"  # or 'npu-bridge': see codemods.targets.npu_bridge
    # (module, name) pairs other files of the run import (migrator.selection.reexports): kept bound
    reexports: frozenset[tuple[str, str]] = frozenset()
    # functions of the run's files that set TF_USE_LEGACY_KERAS (migrator.selection.keras_helpers)
    keras_helpers: frozenset[KerasHelper] = frozenset()
    # names of the run's modules that build a LossScaleOptimizer
    # (migrator.selection.loss_scale_modules): a file importing one may be wrapped there
    loss_scale_modules: frozenset[str] = frozenset()
    # self.<attr> names some file of the run assigns a scaler the port does not build
    # (migrator.selection.scaler_attrs): their annotations stay torch's
    scaler_attrs: frozenset[str] = frozenset()
    # functions of the run's files that build a scaler (migrator.selection.scaler_helpers): a
    # file that calls one and relies on a scale below 1 is warned
    scaler_helpers: frozenset[ScalerHelper] = frozenset()
    # (file, importer) where a file of the run that builds a tf.distribute strategy imports the
    # file (migrator.selection.strategy_importers); paths normalised
    strategy_importers: frozenset[tuple[str, str]] = frozenset()
    # where the run calls hvd.init(), for the files importing such a module
    # (migrator.selection.horovod_importers)
    horovod_inits: HorovodInits | None = None

    def __post_init__(self) -> None:
        if self.add_loss_scale is not None:
            manager_call(self.add_loss_scale)  # raises ValueError on a bad value
        if self.target not in npu_bridge.TARGETS:
            raise ValueError(f"target must be one of {npu_bridge.TARGETS}, got {self.target!r}")
        if self.distributed not in ("auto", "always", "never"):
            raise ValueError(
                f"distributed must be 'auto', 'always' or 'never', got {self.distributed!r}"
            )


@dataclasses.dataclass(frozen=True)
class ProjectPlan:
    """Cross-file facts gathered once before the per-file work (picklable for worker processes)."""

    global_step: global_step.GlobalStepPlan | None = None


def parse(source: bytes) -> cst.Module:
    """Parse bytes (libcst keeps the detected encoding and newline); failures are SourceError,
    whose message starts with `LINE:COL: ` (see migrator.sources.source_errors). A file too deep
    or too long for libcst's parser (which would crash the process) is refused first."""
    limits.check(source)
    try:
        module = cst_parse.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise SourceError(source_errors.syntax_error(source, exc.raw_line, exc.message)) from exc
    except UnicodeDecodeError as exc:
        raise SourceError(source_errors.decode_error(source, exc)) from exc
    except (LookupError, SyntaxError) as exc:
        # libcst reports undecodable UTF-8 as a missing encoding declaration: say where it is.
        try:
            source.decode(source_errors.declared_encoding(source))
        except (UnicodeDecodeError, LookupError) as decode:
            if isinstance(decode, UnicodeDecodeError):
                raise SourceError(source_errors.decode_error(source, decode)) from exc
        raise SourceError(f"1:1: cannot decode: {exc}") from exc
    remember_starts(module, limits.statement_starts(source))
    return module


@dataclasses.dataclass(frozen=True)
class PreparedFile:
    """One file's share of the plan plus its loss-scale port of the unmoved tree (picklable).

    Both come from one parse and one metadata resolution. Most files are not edited by the
    global-step move, and then the port of the original tree already is the final answer; only
    files the plan edits are parsed again (see `finish`).
    """

    path: str
    source: bytes
    facts: global_step.GlobalStepFacts
    ported: MigrationResult
    # With --add-loss-scale, `source` is the file with loss scaling added, `original` the user's
    # bytes and `added` what the addition did (lines of `original`).
    original: bytes | None = None
    added: tuple[Finding, ...] = ()
    # A long file is ported through a view of the statements that can matter
    # (migrator.pipeline.slicing): `source` and `ported` are then the view's, and `finish` puts the
    # result back in the file.
    view: slicing.View | None = None
    # The 0-based lines of `source` at which its top-level statements start, from the tokenizer's
    # pass (migrator.sources.limits); empty where not known. The checks of a port read only the
    # statements it changed (migrator.sources.spans).
    starts: tuple[int, ...] = ()


def scan_source(source: bytes, *, path: str) -> global_step.GlobalStepFacts | None:
    """A file's cross-file facts; None for files that do not parse (never raises)."""
    try:
        module = parse(source)
    except SourceError:
        return None
    # Just parsed, so nobody else holds the tree: no defensive copy (see `_prepare`).
    return global_step.scan(
        Wrapper(module, unsafe_skip_copy=True, source=source), path, source=source
    )


def plan_from_facts(facts: Iterable[global_step.GlobalStepFacts | None]) -> ProjectPlan:
    """The project plan from every file's `scan_source` result, in any order."""
    return ProjectPlan(global_step=global_step.build_plan(f for f in facts if f is not None))


def prepare_source(
    source: bytes,
    *,
    path: str,
    options: MigrateOptions = MigrateOptions(),  # noqa: B008 - frozen, so sharing it is safe
    whole: bool = False,
    facts_only: bool = False,
) -> PreparedFile:
    """Scan for the plan and port the loss-scale APIs in one pass; raises SourceError.

    A long file is ported through its view (migrator.pipeline.slicing) unless `whole` is set, or the
    global-step move or --add-loss-scale has business in it: their cross-file facts carry lines.

    `facts_only`: the file is here for the plan alone (the ast triage found nothing the ports could
    change or report in it on its own, migrator.selection.triage), so only its plan facts are
    read, from its outline (migrator.pipeline.outline); its port is the file unchanged, as the
    ports would have found.
    """
    if facts_only:
        prepared = _outline_facts(source, path)
        if prepared is not None:
            return prepared
    if not whole and options.add_loss_scale is None and b"global_step" not in source:
        view = slicing.view_of(source)
        if view is not None:
            prepared = _prepare(view.source, path, options, facts_only)
            facts = prepared.facts
            if not (facts.classes or facts.functions or facts.unscaled_steps):
                lines = tuple(view.line(n) for n in facts.loss_scale_lines)
                facts = dataclasses.replace(facts, loss_scale_lines=lines)
                return dataclasses.replace(prepared, facts=facts, view=view)
    return _prepare(source, path, options, facts_only)


def _outline_facts(source: bytes, path: str) -> PreparedFile | None:
    """The plan facts of a file here for the plan alone, from its outline; None where it has no
    outline, or the outline does not parse (then the whole file is read, as before), and where
    the notes of an earlier move are read from its text (global_step.scan)."""
    short = outline.outline(source) if b"npu-migrate:" not in source else None
    if short is None:
        return None
    try:
        prepared = _prepare(short, path, MigrateOptions(), facts_only=True)
    except SourceError:
        return None
    unchanged = MigrationResult(path=path, old_source=source, new_source=source, findings=[])
    return PreparedFile(path, source, prepared.facts, unchanged)


def _prepare(
    source: bytes, path: str, options: MigrateOptions, facts_only: bool = False
) -> PreparedFile:
    if facts_only:
        # No port, so none of its metadata; the scan asks for its own (often none at all).
        wrapper = Wrapper(parse(source), unsafe_skip_copy=True, source=source)
        facts = global_step.scan(wrapper, path, source=source)
        unchanged = MigrationResult(path=path, old_source=source, new_source=source, findings=[])
        return PreparedFile(path, source, facts, unchanged)
    if options.add_loss_scale is not None:
        added_source, added = _add_loss_scale(source, path, options.add_loss_scale)
        if added:
            without = dataclasses.replace(options, add_loss_scale=None)
            prepared = _prepare(added_source, path, without)
            return dataclasses.replace(prepared, original=source, added=tuple(added))
    # The tree was just parsed, so no node appears twice in it and nobody else holds it: the
    # defensive deep copy MetadataWrapper makes by default would only cost time.
    tree = parse(source)
    wrapper = Wrapper(tree, unsafe_skip_copy=True, source=source)
    # libcst resolves metadata in rounds and walks the whole tree once per round, even a round
    # with nothing to walk for; asking for what every codemod needs at once saves those walks.
    wanted = set(global_step.metadata_needed(source, tree))
    if might_need_loss_scale_port(source):
        wanted.update(LOSS_SCALE_METADATA)
    if might_need_torch_port(source):
        wanted.update(TORCH_METADATA)
    wrapper.resolve_many(wanted)
    facts = global_step.scan(wrapper, path, source=source)
    module, findings = _port(wrapper, source, path, options)
    new = (
        ported_bytes(module, tree, source) if any(f.kind == "change" for f in findings) else source
    )
    ported = MigrationResult(path=path, old_source=source, new_source=new, findings=findings)
    return PreparedFile(path, source, facts, ported, starts=_top_level_starts(source))


def _top_level_starts(source: bytes) -> tuple[int, ...]:
    # The file was just parsed, so the tokenizer's pass is remembered (limits measures it once).
    starts = limits.statement_starts(source)
    return tuple(line - 1 for line in starts.top_level()) if starts is not None else ()


def _port(
    wrapper: MetadataWrapper, source: bytes, path: str, options: MigrateOptions
) -> tuple[cst.Module, list[Finding]]:
    """The TensorFlow loss-scale port, then the PyTorch one over what it left, each run only
    where the bytes can hold what it looks for; findings carry lines of `wrapper.module`."""
    module, findings = wrapper.module, []
    if might_need_loss_scale_port(source):
        module, findings = port_loss_scale(
            wrapper,
            path,
            options.distributed,
            options.reexports,
            options.keras_helpers,
            options.loss_scale_modules,
            dict(options.strategy_importers).get(norm(path)),
            _horovod_importer(options.horovod_inits, path, source),
        )
    helpers = options.scaler_helpers
    if not might_need_torch_port(source) and not calls_helper(source, helpers):
        return module, findings
    facts = (options.reexports, options.scaler_attrs, helpers)
    if not any(f.kind == "change" for f in findings):
        module, torch_findings = port_torch(wrapper, path, *facts)
        return module, [*findings, *torch_findings]
    # Rare (one file using both frameworks' scalers): a second resolution on the ported tree.
    ported, torch_findings = port_torch(Wrapper(module), path, *facts)
    mapped = _map_lines(torch_findings, code_of(wrapper.module), code_of(module))
    return ported, [*findings, *mapped]


def _horovod_importer(
    inits: HorovodInits | None, path: str, source: bytes
) -> Callable[[], str | None] | None:
    """Where a module the file imports calls hvd.init(), asked only if the port needs it."""
    if inits is None:
        return None
    return functools.partial(importer_of, inits, path, source)


def plan_share(prepared: PreparedFile, plan: ProjectPlan) -> tuple[object, ...]:
    """All `finish` reads of `plan` for this file: it gives the same result under two plans whose
    shares are equal (the global-step move's edits and warnings for the file)."""
    return global_step.share(_step_plan(prepared, plan), prepared.path)


def is_cheap_to_finish(prepared: PreparedFile, plan: ProjectPlan) -> bool:
    """False when `finish` must parse the file again because the global-step move edits it."""
    return not global_step.touches(_step_plan(prepared, plan), prepared.path)


NO_PLAN = ProjectPlan(global_step=global_step.GlobalStepPlan())
"""A plan that moves nothing and warns about nothing: `finish` under it gives a file's result
before the project plan is known, which is its final result unless `plan_matters`."""


def plan_matters(prepared: PreparedFile, plan: ProjectPlan) -> bool:
    """Whether `finish` under `plan` differs from `finish` under NO_PLAN: the global-step move
    edits the file or warns about it (the plan enters `finish` through nothing else)."""
    return not is_cheap_to_finish(prepared, plan) or bool(
        global_step.plan_warnings(_step_plan(prepared, plan), prepared.path)
    )


def with_plan_warnings(
    prepared: PreparedFile, plan: ProjectPlan, options: MigrateOptions, result: MigrationResult
) -> MigrationResult | None:
    """`finish(prepared, plan, options)` from `result`, the same under NO_PLAN, where `plan` does
    not edit the file: its warnings for the file sorted in (`_sorted` is stable, so a warning
    stays before the port's findings of the same line, kind and rule, as in `finish`). None where
    `finish` does more with them: a long file's view maps their lines, --add-loss-scale and the
    npu-bridge target rework the findings."""
    if (
        prepared.view is not None
        or prepared.original is not None
        or options.target == "npu-bridge"
        or not is_cheap_to_finish(prepared, plan)
    ):
        return None
    warnings = global_step.plan_warnings(_step_plan(prepared, plan), prepared.path)
    return dataclasses.replace(result, findings=_sorted([*warnings, *result.findings]))


def finish(prepared: PreparedFile, plan: ProjectPlan, options: MigrateOptions) -> MigrationResult:
    """Combine a prepared file with the project plan into the file's final result."""
    result = _finish(prepared, plan, options)
    found = hand_loss_scale.findings(result.old_source, result.path)  # the user's own bytes
    found += framework_fp16.findings(result.old_source, result.path)
    found += auto_mixed_precision.findings(result.old_source, result.path)
    for check in (torch_hand_loss_scale.finding, unscaled_gradients.finding):
        other = check(result.old_source, result.path)
        found += [other] if other is not None else []
    if found:
        result = dataclasses.replace(result, findings=_sorted([*result.findings, *found]))
    if options.target != "npu-bridge" or not result.changed:
        return result
    done = npu_bridge.retarget(result.path, result.new_source)
    if done is None:
        return result
    old, new = code_of(parse(result.old_source)), code_of(parse(result.new_source))
    added = _map_lines(done.findings, old, new)
    if done.source is None:  # the file stays as it was; the port's warnings still hold for it
        kept = [f for f in result.findings if f.kind != "change"]
        return dataclasses.replace(
            result, new_source=result.old_source, findings=_sorted([*kept, *added])
        )
    return dataclasses.replace(
        result, new_source=done.source, findings=_sorted([*result.findings, *added])
    )


def _finish(prepared: PreparedFile, plan: ProjectPlan, options: MigrateOptions) -> MigrationResult:
    if prepared.view is not None:
        result = _finish(dataclasses.replace(prepared, view=None), plan, options)
        expanded = prepared.view.expand(result)
        if expanded is not None:
            return expanded
        whole = prepare_source(
            prepared.view.original, path=prepared.path, options=options, whole=True
        )
        return _finish(whole, plan, options)
    step_plan = _step_plan(prepared, plan)
    if global_step.touches(step_plan, prepared.path):
        result = _migrate_moved(prepared.source, prepared.path, options, step_plan)
    else:
        findings = _sorted(
            [*global_step.plan_warnings(step_plan, prepared.path), *prepared.ported.findings]
        )
        result = dataclasses.replace(prepared.ported, findings=findings)
    if prepared.original is None:
        return result
    # The port saw the file with loss scaling added: report against the user's own lines, and
    # not the contrib spelling of the addition (the user never wrote it; `added` says it all).
    ported = [f for f in result.findings if not f.rule.startswith("contrib-")]
    mapped = _map_lines(ported, code_of(parse(prepared.original)), code_of(parse(prepared.source)))
    return dataclasses.replace(
        result, old_source=prepared.original, findings=_sorted([*prepared.added, *mapped])
    )


def _add_loss_scale(source: bytes, path: str, choice: str) -> tuple[bytes, list[Finding]]:
    """The file with loss scaling added (--add-loss-scale), in the contrib spelling the port
    then rewrites; the bytes unchanged where nothing was added."""
    module = parse(source)
    added, findings = add_loss_scale.add_loss_scale(module, source, path, choice)
    return (source if added is module else bytes_of(added)), findings


def _step_plan(prepared: PreparedFile, plan: ProjectPlan) -> global_step.GlobalStepPlan:
    # A plan without global-step facts means "plan this file on its own", as `rewrite` does.
    if plan.global_step is not None:
        return plan.global_step
    return global_step.build_plan([prepared.facts])


def migrate_source(
    source: bytes,
    *,
    path: str,
    options: MigrateOptions = MigrateOptions(),  # noqa: B008 - frozen, so sharing it is safe
    plan: ProjectPlan | None = None,
) -> MigrationResult:
    """Port one file's bytes; pure (no I/O), byte-identical output when nothing changes.

    Without a plan the file is planned on its own, as if it were the whole project.
    """
    prepared = prepare_source(source, path=path, options=options)
    if plan is None:
        plan = plan_from_facts([prepared.facts])
    return finish(prepared, plan, options)


def _migrate_moved(
    source: bytes, path: str, options: MigrateOptions, plan: global_step.GlobalStepPlan
) -> MigrationResult:
    """The full chain for a file the global-step move edits.

    The move runs first, on the original tree, so its findings (and the project plan's) carry
    original line numbers; the loss-scale port's lines are mapped back through the difference the
    move made.
    """
    original = parse(source)
    # Just parsed, so not copied (see `_prepare`): the move's line lookups then read the lines
    # the parse remembered, and the statements it leaves are the parsed ones, whose bytes
    # `ported_bytes` copies from the file instead of generating their code.
    moved, findings = global_step.rewrite(
        Wrapper(original, unsafe_skip_copy=True, source=source), path, plan
    )
    ported, port_findings = _port(Wrapper.of_built(moved), source, path, options)
    if port_findings:
        moved_code = ported_bytes(moved, original, source).decode(original.encoding)
        port_findings = _map_lines(port_findings, code_of(original), moved_code)
    findings = _sorted([*findings, *port_findings])
    if not any(f.kind == "change" for f in findings):
        return MigrationResult(path=path, old_source=source, new_source=source, findings=findings)
    return MigrationResult(
        path=path,
        old_source=source,
        new_source=ported_bytes(ported, original, source),
        findings=findings,
    )


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (f.line, f.kind, f.rule))


def _map_lines(findings: list[Finding], old: str, new: str) -> list[Finding]:
    """Re-anchor findings made on `new` to the matching lines of `old`."""
    opcodes = difflib.SequenceMatcher(
        None, old.splitlines(), new.splitlines(), autojunk=False
    ).get_opcodes()

    def to_old(line: int) -> int:
        index = line - 1
        for tag, i1, _i2, j1, j2 in opcodes:
            if j1 <= index < j2 or (j1 == j2 == index):
                return (i1 + index - j1 if tag == "equal" else i1) + 1
        return line

    return [dataclasses.replace(f, line=to_old(f.line)) for f in findings]
