"""Distribution facts of one file and the `is_distributed=` they decide.

Horovod imports, `hvd.init()` and `DistributedOptimizer` calls, tf.distribute strategies (also
one an Estimator is handed through RunConfig), and `name = <world-size test>` assignments are
gathered while walking; `is_distributed` turns them into the keyword for one optimizer call, the
same way for the TF1 and the Keras port (`shared/distributed.py` reads the conditions).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import GlobalScope

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.shared.context import FileContext
from migrator.codemods.shared.distributed import (
    DistributedFacts,
    has_strategy,
    horovod_parameter,
    is_distributed_value,
    size_test_direction,
)


class Distribution:
    """`distributed` is the --distributed option: "auto", "always" or "never"; `strategy_importer`
    a file of the run that builds a tf.distribute strategy and imports this one;
    `horovod_importer` says, when asked, where a file of the run that this one imports calls
    hvd.init() (a read of the file's imports, so only for an optimizer that needs it)."""

    def __init__(
        self,
        file: FileContext,
        distributed: str,
        strategy_importer: str | None = None,
        horovod_importer: Callable[[], str | None] | None = None,
    ) -> None:
        self.file = file
        self.distributed = distributed
        self.strategy_importer = strategy_importer
        self.horovod_importer = horovod_importer
        self.facts = DistributedFacts()

    def visit_Call(self, node: cst.Call) -> None:
        func = self.file.canonical(node.func)
        if (func is not None and api.is_distribute_strategy(func)) or _hands_a_strategy(node):
            self.facts.strategy_used = True
        elif (
            func is not None
            and api.is_horovod_module(func)
            and func.endswith(".init")
            and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name)
        ):
            self.facts.initialised.add(node.func.value.value)
            self.facts.init_calls.append(node)
        elif (
            func is not None
            and api.is_horovod_module(func)
            and func.endswith(".DistributedOptimizer")
        ):
            self.facts.wrappers.append(node)
        elif self._unresolved_horovod(node.func, "init"):
            # Horovod that resolves to no single import: bound by a lazy-import helper, or by an
            # optional import whose failure leaves None (where `hvd.size()` raises until init).
            assert isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name)
            self.facts.initialised.add(node.func.value.value)
            self.facts.init_calls.append(node)
        elif self._unresolved_horovod(node.func, "DistributedOptimizer"):
            self.facts.wrappers.append(node)
        elif (
            func is not None
            and func.startswith("byteps.")
            and func.endswith(".DistributedOptimizer")
        ):
            self.facts.byteps_wrappers.append(node)
        elif func is not None and func.endswith(".DistributedOptimizer") and _horovod_proxy(func):
            # Horovod through the project's own module (Habana's BERT: `from
            # common.horovod_helpers import hvd`): the wrapper is Horovod's, whatever imports it.
            self.facts.horovod_imported = True
            self.facts.wrappers.append(node)

    def _unresolved_horovod(self, func: cst.BaseExpression, attribute: str) -> bool:
        """`X.<attribute>` where X is Horovod though no single import resolves it: bound by a
        lazy-import helper, or by an optional import whose failure leaves None."""
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == attribute
            and isinstance(func.value, cst.Name)
        ):
            return False
        name = func.value.value
        facts = self.facts
        optional = name in facts.optional_horovod and name in facts.horovod_aliases
        return optional or name in facts.lazy_horovod

    def visit_Assign(self, node: cst.Assign) -> None:
        lazy = _lazily_imported(node)
        if lazy is not None and api.is_horovod_module(lazy):
            # `hvd = LazyImport("horovod.tensorflow")`: Horovod, though no import binds it.
            name = node.targets[0].target
            assert isinstance(name, cst.Name)
            self.facts.horovod_imported = True
            self.facts.horovod_aliases[name.value] = node
            self.facts.lazy_horovod.add(name.value)
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and isinstance(node.value, cst.Name)
            and node.value.value == "None"
            and isinstance(self.file.scope(node), GlobalScope)
        ):
            self.facts.optional_horovod.add(node.targets[0].target.value)
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            direction = size_test_direction(node.value, self.file.canonical)
            if direction:
                target = node.targets[0].target
                self.facts.size_tests[target.value] = (target, direction > 0)

    def is_distributed(
        self, call: cst.Call, *, keras: bool = False
    ) -> tuple[cst.BaseExpression | None, str]:
        """`is_distributed=` for an optimizer built by `call` (None: leave it out) and why.

        Horovod is decided alike for both front-ends. A tf.distribute strategy alone is not a
        reason to pass anything to the Keras optimizer: its default (None) already sums the flag
        exactly when a strategy has several replicas, where `has_strategy()` evaluated at
        construction could pass False and be refused under a multi-replica strategy.
        """
        if self.distributed == "never":
            return None, "of --distributed never"
        if self.distributed == "always":
            return cst.Name("True"), "of --distributed always"
        # A function handed Horovod as a parameter decides for itself, whatever the file imports.
        handed = horovod_parameter(
            self.file.scope(call), self.file.parent, self.facts.horovod_aliases
        )
        if handed is not None:
            return handed
        if not self.facts.trains_distributed:
            elsewhere = None if keras else self._strategy_elsewhere(call)
            if elsewhere is not None:
                return elsewhere
            if self.facts.byteps_wrappers:
                self._warn_byteps(call, keras)
            elif self.horovod_importer is not None:
                site = self.horovod_importer()
                if site is not None:
                    self._warn_horovod_elsewhere(call, keras, site)
            return None, ""
        if keras and not self.facts.horovod_imported:
            return None, (
                "the file trains under a tf.distribute strategy, over whose replicas the Keras "
                "optimizer's default (None) sums the overflow flag by itself"
            )
        value, why = is_distributed_value(
            call,
            self.facts,
            parent=self.file.parent,
            canonical=self.file.canonical,
            scope=self.file.scope(call),
        )
        if self.facts.horovod_imported and not self.facts.initialised and _is_true(value):
            self.file.warn(
                call,
                registry.DISTRIBUTED_UNVERIFIED,
                "is_distributed=True: the file uses Horovod but never calls hvd.init(); the "
                "optimizer raises at graph build unless Horovod is initialised first (e.g. by "
                "the runner). If the script also runs without Horovod, pass the condition it "
                "uses instead",
            )
        return value, why

    def _strategy_elsewhere(self, call: cst.Call) -> tuple[cst.BaseExpression, str] | None:
        """`has_strategy()` where a strategy file of the run imports this one: the optimizer may
        be built under its strategy (an Estimator's model_fn, a function it calls), or not."""
        if self.strategy_importer is None:
            return None
        value = has_strategy(self.facts, self.file.scope(call))
        if value is None:
            return None
        return value, (
            f"{self.strategy_importer}, which imports this file, builds a tf.distribute strategy "
            "for some runs"
        )

    def _warn_horovod_elsewhere(self, call: cst.Call, keras: bool, site: str) -> None:
        """Horovod initialised by a module this file imports: the gradients may be all-reduced
        there (hok_env's gradient_fusion.py), which nothing here shows."""
        where = "LossScaleOptimizer" if keras else "NPULossScaleOptimizer"
        self.file.warn(
            call,
            registry.DISTRIBUTED_ELSEWHERE,
            f"no is_distributed written: this file imports a module that initialises Horovod "
            f"({site}), and nothing here says whether this optimizer's "
            "gradients are all-reduced over its workers; where they are, pass "
            f"`is_distributed=hvd.size() > 1` to the {where} (with `import horovod.tensorflow "
            "as hvd`), or each worker decides alone whether to skip an overflowed step and the "
            "workers drift apart",
        )

    def _warn_byteps(self, call: cst.Call, keras: bool) -> None:
        """BytePS sums the gradients, but the library knows no BytePS engine to sum the overflow
        flag over: where the flag is read from the gradients (INF/NAN mode) every worker decides
        alike; the NPU's per-device saturation status need not, and nothing would say so."""
        where = "LossScaleOptimizer" if keras else "loss-scale manager"
        reducer = (
            ""
            if keras
            else ", or give NPULossScaleOptimizer `is_distributed=True` and `reducer=` an object "
            "whose all_reduce_sum(tensor) sums over BytePS"
        )
        self.file.warn(
            call,
            registry.DISTRIBUTED_ENGINE_UNSUPPORTED,
            "the file trains with BytePS (`DistributedOptimizer`), over which npu_lossscale "
            "cannot sum the overflow flag (it knows tf.distribute, Horovod and HCCL), so "
            "is_distributed is left out: each worker decides alone whether to skip a step. Where "
            "BytePS has summed the gradients before the check, the INF/NAN check decides alike "
            "on every worker, but the NPU's saturation status is per device: pass "
            f'`overflow_mode="inf_nan"` to the {where}{reducer}',
        )


def _horovod_proxy(func: str) -> bool:
    """`X.DistributedOptimizer` where X is named for Horovod (`hvd`, a `horovod_helpers` module)
    though it is a module of the project, not horovod itself."""
    return any(part == "hvd" or "horovod" in part.lower() for part in func.split(".")[:-1])


def _is_true(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"


def _hands_a_strategy(call: cst.Call) -> bool:
    """`RunConfig(train_distribute=strategy)`: an Estimator trains under the strategy, however
    the script built it (a helper such as distribution_utils.get_distribution_strategy)."""
    return any(
        arg.keyword is not None
        and arg.keyword.value in ("train_distribute", "eval_distribute")
        and not (isinstance(arg.value, cst.Name) and arg.value.value == "None")
        for arg in call.args
    )


def _lazily_imported(node: cst.Assign) -> str | None:
    """The module `name = helper("a.module", ...)` names: a lazy import the script wrote itself
    (`LazyImport("horovod.tensorflow")`, `importlib.import_module(...)`)."""
    if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
        return None
    value = node.value
    if not isinstance(value, cst.Call) or not value.args or value.args[0].keyword is not None:
        return None
    first = value.args[0].value
    if not isinstance(first, cst.SimpleString):
        return None
    module = first.evaluated_value
    return module if isinstance(module, str) else None
