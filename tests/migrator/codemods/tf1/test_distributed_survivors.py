"""`is_distributed=` for Horovod scripts: the cases the mutation run (benchmarks/mutation.py,
issue 30) found unpinned.

Each script is ported, and the `is_distributed=` it gets (absent means False) is evaluated as the
ported script would evaluate it at run time, for several world sizes and flag settings: it must
be true exactly on the runs where the script trains on several workers. `hvd` there is a small
stand-in with `size()`, since only the ported condition is evaluated, not Horovod.
"""

from __future__ import annotations

import ast
import types

import pytest

from migrator.pipeline.transform import migrate_source

HEADER = "import horovod.tensorflow as hvd\nimport tensorflow as tf\n\nFLAGS = None\n\n\n"
LSO = "tf.contrib.mixed_precision.LossScaleOptimizer"


def _flags(source: str) -> dict[str, str | None]:
    """Port ``source``; the is_distributed= text of each NPULossScaleOptimizer, by the name it is
    assigned to (`return` for a returned one), None where the argument is left out."""
    ported = migrate_source(source.encode(), path="train.py").new_source.decode()
    found: dict[str, str | None] = {}
    for node in ast.walk(ast.parse(ported)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            key, call = node.targets[0].id, node.value
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            key, call = "return", node.value
        else:
            continue
        if getattr(call.func, "id", None) != "NPULossScaleOptimizer":
            continue
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        found[key] = keywords.get("is_distributed")
    return found


def _value(flag: str | None, workers: int, **flags: bool) -> bool:
    if flag is None:
        return False
    hvd = types.SimpleNamespace(size=lambda: workers)
    env = {"hvd": hvd, "FLAGS": types.SimpleNamespace(**flags)}
    return bool(eval(compile(flag, "<is_distributed>", "eval"), env))  # noqa: S307


def test_size_at_least_two_is_the_multi_worker_test() -> None:
    flags = _flags(
        HEADER + "hvd.init()\n\n\ndef build(opt, manager):\n"
        "    if hvd.size() >= 2:\n"
        f"        multi = {LSO}(opt, manager)\n"
        "    else:\n"
        f"        single = {LSO}(opt, manager)\n"
        "    return multi, single\n"
    )
    assert flags == {"multi": "hvd.size() >= 2", "single": None}


def test_a_chained_size_test_is_not_read_as_its_first_part() -> None:
    """`1 < hvd.size() < 8` is false on 16 workers too: its else branch is not single-worker."""
    flags = _flags(
        HEADER + "hvd.init()\n\n\ndef build(opt, manager):\n"
        "    if 1 < hvd.size() < 8:\n"
        f"        small = {LSO}(opt, manager)\n"
        "    else:\n"
        f"        other = {LSO}(opt, manager)\n"
        "    return small, other\n"
    )
    for workers in (2, 4):
        assert _value(flags["small"], workers)
    assert not _value(flags["other"], 1)
    assert _value(flags["other"], 16)


def test_the_else_of_a_conjunction_is_negated_as_a_whole() -> None:
    """Horovod wraps in the else of `if FLAGS.local and FLAGS.debug:`: distributed unless both."""
    flags = _flags(
        HEADER + "def build(opt, manager):\n"
        "    if FLAGS.local and FLAGS.debug:\n"
        "        pass\n"
        "    else:\n"
        "        opt = hvd.DistributedOptimizer(opt)\n"
        f"    return {LSO}(opt, manager)\n"
    )
    for local, debug in ((False, False), (True, False), (False, True)):
        assert _value(flags["return"], 4, local=local, debug=debug)
    assert not _value(flags["return"], 4, local=True, debug=True)


def test_two_different_wrapper_conditions_fall_back_to_the_world_size() -> None:
    flags = _flags(
        HEADER + "def build(opt, manager):\n"
        "    if FLAGS.horovod:\n"
        "        opt = hvd.DistributedOptimizer(opt)\n"
        "    if FLAGS.sync:\n"
        "        opt = hvd.DistributedOptimizer(opt)\n"
        f"    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    hvd.init()\n"
    )
    for horovod, sync in ((True, False), (False, True), (True, True)):
        assert _value(flags["return"], 4, horovod=horovod, sync=sync)
    assert not _value(flags["return"], 1, horovod=True, sync=True)


@pytest.mark.parametrize(
    "inits",
    [
        "def main():\n    if FLAGS.horovod:\n        hvd.init()\n\n\n"
        "def evaluate():\n    hvd.init()\n",
        "def main():\n    if hvd.init() is None and FLAGS.verbose:\n        print('up')\n",
    ],
    ids=["unguarded-beside-guarded", "init-in-the-if-test"],
)
def test_an_init_that_always_runs_makes_the_world_size_decide(inits: str) -> None:
    flags = _flags(
        HEADER + f"def build(opt, manager):\n    return {LSO}(opt, manager)\n\n\n" + inits
    )
    assert _value(flags["return"], 4, horovod=False, verbose=False)
    assert not _value(flags["return"], 1, horovod=True, verbose=True)


def test_a_guard_on_another_functions_local_is_not_copied() -> None:
    """`use_hvd` exists only in main(): written into build() it would be a NameError."""
    flags = _flags(
        HEADER + f"def build(opt, manager):\n    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    use_hvd = FLAGS.horovod\n    if use_hvd:\n        hvd.init()\n"
    )
    assert "use_hvd" not in (flags["return"] or "")
    assert _value(flags["return"], 4, horovod=True)


def test_a_module_flag_guarding_init_goes_first() -> None:
    """Control for the one above: a module-level flag is the same name in build()."""
    flags = _flags(
        HEADER + f"def build(opt, manager):\n    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    if FLAGS.horovod:\n        hvd.init()\n"
    )
    assert flags["return"] == "FLAGS.horovod and hvd.size() > 1"
    assert not _value(flags["return"], 1, horovod=True)
    assert _value(flags["return"], 4, horovod=True)


def test_an_optimizer_built_in_an_if_test_is_not_in_its_branch() -> None:
    """The test runs on every world size: `hvd.size() == 1` there does not make it single."""
    source = (
        HEADER + "hvd.init()\n\n\ndef build(opt, manager):\n"
        f"    if describe({LSO}(opt, manager)) and hvd.size() == 1:\n"
        "        print('one worker')\n"
    )
    ported = migrate_source(source.encode(), path="train.py").new_source.decode()
    call = next(
        n
        for n in ast.walk(ast.parse(ported))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "NPULossScaleOptimizer"
    )
    flag = next((ast.unparse(k.value) for k in call.keywords if k.arg == "is_distributed"), None)
    assert _value(flag, 4)
    assert not _value(flag, 1)


def test_a_single_worker_conjunction_leaves_the_default() -> None:
    """In `if use_hvd and hvd.size() == 1:` the optimizer runs on one worker only."""
    flags = _flags(
        HEADER + "def build(opt, manager, use_hvd):\n"
        "    if use_hvd and hvd.size() == 1:\n"
        f"        single = {LSO}(opt, manager)\n"
        "    return single\n"
    )
    assert flags == {"single": None}


def test_another_modules_size_is_not_the_world_size() -> None:
    """`queue_utils.size()` is not Horovod's: the Horovod run decides by its own world size."""
    flags = _flags(
        "import horovod.tensorflow as hvd\nimport queue_utils\nimport tensorflow as tf\n\n"
        "hvd.init()\n\n\ndef build(opt, manager):\n"
        "    if queue_utils.size() > 1:\n"
        f"        big = {LSO}(opt, manager)\n"
        "    else:\n"
        f"        small = {LSO}(opt, manager)\n"
        "    return big, small\n"
    )
    for name in ("big", "small"):
        assert _value(flags[name], 4) and not _value(flags[name], 1), flags


WRAP = "opt = hvd.DistributedOptimizer(opt)\n"


@pytest.mark.parametrize(
    ("guarded", "expected"),
    [
        (
            "    if FLAGS.horovod:\n        if FLAGS.sync:\n            " + WRAP,
            "FLAGS.horovod and FLAGS.sync",
        ),
        (
            "    if FLAGS.local:\n        pass\n    else:\n"
            "        if FLAGS.sync:\n            " + WRAP,
            "not FLAGS.local and FLAGS.sync",
        ),
    ],
    ids=["nested-ifs", "else-then-if"],
)
def test_nested_wrapper_guards_are_all_kept_in_order(guarded: str, expected: str) -> None:
    """Horovod wraps the optimizer only where both `if`s hold: every guard is part of the
    condition, outermost first, and a run where the outer one fails is not distributed."""
    flags = _flags(
        HEADER + "def build(opt, manager):\n" + guarded + f"    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    hvd.init()\n"
    )
    assert flags == {"return": expected}
    outer_holds = {"horovod": True, "local": False}
    outer_fails = {"horovod": False, "local": True}
    assert _value(flags["return"], 4, sync=True, **outer_holds)
    assert not _value(flags["return"], 4, sync=True, **outer_fails)
    assert not _value(flags["return"], 4, sync=False, **outer_holds)


OPTIONAL = (
    "import tensorflow as tf\n\ntry:\n    import horovod.tensorflow as hvd\n"
    "except ImportError:\n    hvd = None\n\nFLAGS = None\n\n\n"
)


class _Horovod:
    """What the ported condition meets at run time: Horovod's size() raises until init() ran."""

    def __init__(self, workers: int, initialised: bool) -> None:
        self.workers, self.initialised = workers, initialised

    def size(self) -> int:
        if not self.initialised:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        return self.workers


def _run_value(flag: str, hvd: _Horovod | None, horovod: bool) -> bool:
    env = {"hvd": hvd, "FLAGS": types.SimpleNamespace(horovod=horovod)}
    return bool(eval(compile(flag, "<is_distributed>", "eval"), env))  # noqa: S307


def test_an_optional_horovod_initialised_under_a_flag_is_asked_its_size_only_then() -> None:
    """`try: import horovod` / `except ImportError: hvd = None`, and `hvd.init()` only under
    `if FLAGS.horovod:`. A single-device run on a host with Horovod installed never initialises
    it, and there `hvd.size()` raises: the flag must come first, as for a plain import."""
    flags = _flags(
        OPTIONAL + f"def build(opt, manager):\n    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    if FLAGS.horovod:\n        hvd.init()\n"
    )
    flag = flags["return"]
    assert flag is not None
    assert not _run_value(flag, _Horovod(4, initialised=False), horovod=False)
    assert not _run_value(flag, None, horovod=False)  # Horovod not installed
    assert not _run_value(flag, _Horovod(1, initialised=True), horovod=True)
    assert _run_value(flag, _Horovod(4, initialised=True), horovod=True)


def test_an_optional_horovod_initialised_where_it_is_imported_needs_only_the_import() -> None:
    """Control for the one above: `hvd.init()` right after the import, inside the `try`, runs
    whenever Horovod is there, so the import alone decides."""
    imported = "    import horovod.tensorflow as hvd\n"
    source = OPTIONAL.replace(imported, imported + "    hvd.init()\n")
    flags = _flags(source + f"def build(opt, manager):\n    return {LSO}(opt, manager)\n")
    flag = flags["return"]
    assert flag is not None
    assert not _run_value(flag, None, horovod=False)
    assert not _run_value(flag, _Horovod(1, initialised=True), horovod=False)
    assert _run_value(flag, _Horovod(4, initialised=True), horovod=False)


def test_a_wrapper_in_another_function_does_not_hide_the_one_beside_the_optimizer() -> None:
    """`evaluate()` wraps an optimizer of its own first in the file; `build()` wraps its
    optimizer only under `FLAGS.horovod`. The optimizer built in `build()` follows its own
    function's wrapper: a run without the flag trains alone on each worker."""
    flags = _flags(
        HEADER + "def evaluate(opt):\n    return hvd.DistributedOptimizer(opt)\n\n\n"
        "def build(opt, manager):\n    if FLAGS.horovod:\n"
        "        opt = hvd.DistributedOptimizer(opt)\n"
        f"    return {LSO}(opt, manager)\n\n\n"
        "def main():\n    hvd.init()\n"
    )
    assert flags == {"return": "FLAGS.horovod"}
    assert not _value(flags["return"], 4, horovod=False)
    assert _value(flags["return"], 4, horovod=True)


def test_a_name_scope_around_the_optimizer_is_not_a_strategy_scope() -> None:
    """A script that builds a MirroredStrategy only for multi-GPU runs and its optimizer under
    `with tf.name_scope(...)`: a name scope distributes nothing, so the flag stays the run-time
    question (`has_strategy()`), false on the single-GPU runs, where True would have the
    optimizer look for a distributed engine that is not there."""
    source = (
        "import tensorflow as tf\n\nFLAGS = None\n\n\n"
        "def main():\n    if FLAGS.num_gpus > 1:\n"
        "        strategy = tf.distribute.MirroredStrategy()\n\n\n"
        "def build(opt, manager):\n    with tf.name_scope('loss_scale'):\n"
        f"        return {LSO}(opt, manager)\n"
    )
    assert _flags(source) == {"return": "tf.distribute.has_strategy()"}


def test_a_horovod_parameter_defaulting_to_the_module_is_not_optional() -> None:
    """`def build(opt, manager, hvd=hvd)`: the default is the Horovod module itself, never None,
    so the flag is the world-size test alone (no `hvd is not None` guard the script never
    needed); only a default of None makes the parameter optional."""
    flags = _flags(
        HEADER + "hvd.init()\n\n\ndef build(opt, manager, hvd=hvd):\n"
        "    opt = hvd.DistributedOptimizer(opt)\n"
        f"    return {LSO}(opt, manager)\n"
    )
    assert flags == {"return": "hvd.size() > 1"}
    flags = _flags(
        HEADER + "def build(opt, manager, hvd=None):\n"
        "    opt = hvd.DistributedOptimizer(opt)\n"
        f"    return {LSO}(opt, manager)\n"
    )
    assert flags == {"return": "hvd is not None and hvd.size() > 1"}


def test_the_branch_that_does_not_wrap_for_horovod_is_the_single_worker_one() -> None:
    """neurst: `if hvd_backend: opt = hvd.DistributedOptimizer(...) else: opt = LossScaleOptimizer
    (...)`. The optimizer of the else branch never trains distributed: `True` there made every
    single-device run fail at its first step. One built after the wrapper, in the branch that
    applies it, is as before: that function always wraps it (`True`)."""
    manager = "tf.contrib.mixed_precision.FixedLossScaleManager(8)"
    source = HEADER + (
        "def make(optimizer, hvd_backend=None):\n"
        "    if hvd_backend:\n"
        "        wrapped = hvd.DistributedOptimizer(optimizer)\n"
        f"        distributed = {LSO}(wrapped, {manager})\n"
        "    else:\n"
        f"        single = {LSO}(optimizer, {manager})\n"
    )
    assert _flags(source) == {"distributed": "True", "single": None}
    findings = migrate_source(source.encode(), path="train.py").findings
    (single,) = [f for f in findings if f.line == 12 and f.rule == "contrib-optimizer"]
    assert "no is_distributed because it is built in the branch of `if hvd_backend:`" in (
        single.message
    )


def test_a_wrapper_in_the_other_branch_alone_does_not_make_a_single_worker_branch() -> None:
    """DeepLearningExamples' TF2 ConvNets: with gradient accumulation its own train step
    all-reduces the gradients, so only the other branch wraps the optimizer for Horovod; the
    optimizer built with accumulation still trains on every worker."""
    manager = "tf.contrib.mixed_precision.FixedLossScaleManager(8)"
    source = HEADER + (
        "def make(optimizer, accumulation_steps):\n"
        "    if accumulation_steps > 1:\n"
        f"        accumulating = {LSO}(optimizer, {manager})\n"
        "    else:\n"
        "        optimizer = hvd.DistributedOptimizer(optimizer)\n"
    )
    assert _flags(source) == {"accumulating": "True"}


@pytest.mark.parametrize(
    ("test", "branch"),
    [
        ("hvd_backend", "else"),
        ("FLAGS.use_horovod", "else"),
        ("not use_hvd", "body"),
    ],
)
def test_the_branch_where_a_horovod_flag_is_false_is_the_single_worker_one(
    test: str, branch: str
) -> None:
    """neurst's real shape: the other branch builds the project's own Horovod optimizer, no
    `hvd.DistributedOptimizer` to see, but the test names Horovod."""
    manager = "tf.contrib.mixed_precision.FixedLossScaleManager(8)"
    single = f"        single = {LSO}(optimizer, {manager})\n"
    other = "        other = make_horovod_optimizer(optimizer)\n"
    body, orelse = (other, single) if branch == "else" else (single, other)
    source = HEADER + (
        "def make(optimizer, hvd_backend=None, use_hvd=False):\n"
        f"    if {test}:\n{body}    else:\n{orelse}"
    )
    assert _flags(source) == {"single": None}
