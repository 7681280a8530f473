"""Make every worker take the same skip-or-apply decision by all-reducing the overflow status.

Each worker only sees its own gradients. If one overflows and another does not, one skips and the
other applies: weights and loss scales drift apart without any error. So with
``is_distributed=True`` the optimizer sums the local overflow flags over all workers (sum > 0 means
an overflow somewhere) before it decides, exactly as the Ascend adapter does with HCCL.

The sum goes through the engine the script already runs on, never a home-made one:

* ``"tf.distribute"``: inside a replica context of a ``tf.distribute`` strategy (MirroredStrategy,
  MultiWorkerMirroredStrategy): a cross-replica sum of the flag.
* ``"horovod"``: when ``horovod.tensorflow`` has been imported and ``hvd.init()`` called.
* ``"hccl"``: when the Ascend TensorFlow adapter (``npu_bridge``) is importable.

Auto-detection looks in that order, at graph-build time (``apply_gradients``), because only then is
it known whether the call sits inside a strategy's replica function. ``reducer=`` forces an engine
by name or takes any object with an ``all_reduce_sum(tensor) -> tensor`` method.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import sys
from typing import Any

import tensorflow as tf

ENGINE_NAMES = ("tf.distribute", "horovod", "hccl")
"""Names ``reducer=`` accepts, in auto-detection order."""

_SEARCHED = (
    "a tf.distribute replica context (apply_gradients called inside strategy.run / "
    "call_for_each_replica of MirroredStrategy or MultiWorkerMirroredStrategy)",
    "Horovod (horovod.tensorflow imported and hvd.init() called)",
    "the Ascend HCCL adapter (npu_bridge importable)",
)


class NoDistributedEngineError(RuntimeError):
    """is_distributed=True, but no engine to all-reduce the overflow status with was found.

    Raised while the graph is built, not mid-training: going on alone would silently let this
    worker's weights drift from the others'.
    """

    # AutoGraph re-wraps unknown exception types raised while tracing a tf.function into a generic
    # StagingError; this marker makes it let ours through so `except NoDistributedEngineError`
    # works the same in graph code and inside tf.function.
    ag_pass_through = True


class Reducer(abc.ABC):
    """What the optimizer needs from an engine: a sum of a float32 scalar over all workers.

    The method is called where ``apply_gradients`` is called (inside the replica function under
    tf.distribute) and must return the same value on every worker/replica. Any object with that
    method counts as one (``isinstance`` checks the method, as a runtime-checkable Protocol
    would; typing.Protocol itself needs Python 3.8).
    """

    @abc.abstractmethod
    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor: ...

    @classmethod
    def __subclasshook__(cls, other: type) -> object:
        if cls is Reducer and callable(getattr(other, "all_reduce_sum", None)):
            return True
        return NotImplemented


class TFDistributeReducer:
    """Cross-replica sum through the active tf.distribute strategy's own collectives."""

    name = "tf.distribute"

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        context = strategy_replica_context()
        if context is None:
            raise NoDistributedEngineError(
                "reducer='tf.distribute' needs apply_gradients to run inside a tf.distribute "
                "replica context (strategy.run(step_fn) or "
                "strategy.extended.call_for_each_replica(step_fn)); none is active here"
            )
        if context.num_replicas_in_sync == 1:
            return tensor
        # Not ReplicaContext.all_reduce: that wraps the sum in a custom gradient, which in TF1
        # graphs looks up every variable the flag depends on by name and fails on the mirrored
        # copies ("w/replica_1"). The flag never needs a gradient, so reduce it directly.
        return context.merge_call(_sum_to_every_replica, args=(tensor,))


def _sum_to_every_replica(strategy: tf.distribute.Strategy, value: Any) -> Any:
    return strategy.extended.reduce_to(tf.distribute.ReduceOp.SUM, value, destinations=value)


class HorovodReducer:
    """Sum with ``hvd.allreduce``; a single Horovod process needs no communication at all."""

    name = "horovod"

    def __init__(self, hvd: Any) -> None:
        self._hvd = hvd

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        if self._hvd.size() == 1:
            return tensor
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name="npu_lossscale_overflow")


class HcclReducer:
    """Sum with the Ascend adapter's HCCL allreduce, as the vendor's own optimizer does."""

    name = "hccl"

    def __init__(self, hccl_ops: Any, rank_size: int | None) -> None:
        self._hccl_ops = hccl_ops
        self._rank_size = rank_size

    def all_reduce_sum(self, tensor: tf.Tensor) -> tf.Tensor:
        if self._rank_size == 1:
            return tensor
        return self._hccl_ops.allreduce(tensor, "sum", fusion=0)


def strategy_replica_context() -> tf.distribute.ReplicaContext | None:
    """The replica context of a real (non-default) strategy, or None."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    return tf.distribute.get_replica_context()


def _horovod_module() -> Any | None:
    """horovod.tensorflow if the script imported and initialised it; never imports it itself.

    Importing Horovod on our own would be wrong twice over: it is heavy, and a script that has not
    called hvd.init() is not running under Horovod.
    """
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    is_initialized = getattr(hvd, "is_initialized", None)
    if callable(is_initialized):
        return hvd if is_initialized() else None
    try:
        hvd.size()
    except ValueError:  # older Horovod: "Horovod has not been initialized; use hvd.init()."
        return None
    return hvd


def _hccl_reducer() -> HcclReducer | None:
    """The Ascend adapter's HCCL allreduce, if the adapter is installed (Ascend hosts only)."""
    if importlib.util.find_spec("npu_bridge") is None:
        return None
    try:
        hccl_ops = importlib.import_module("npu_bridge.hccl.hccl_ops")
    except ImportError:
        return None
    return HcclReducer(hccl_ops, _hccl_rank_size())


def _hccl_rank_size() -> int | None:
    """Number of HCCL ranks, or None when the adapter cannot say (then always all-reduce)."""
    try:
        api = importlib.import_module("hccl.manage.api")
        return int(api.get_rank_size())
    except Exception:  # no rank table yet, or an adapter without this API: reduce anyway
        return None


def detect_engine() -> str | None:
    """Name of the engine the calling code runs on, in ENGINE_NAMES order, or None."""
    if strategy_replica_context() is not None:
        return "tf.distribute"
    if _horovod_module() is not None:
        return "horovod"
    if _hccl_reducer() is not None:
        return "hccl"
    return None


def _no_engine_error(detail: str) -> NoDistributedEngineError:
    searched = "\n".join(f"  - {item}" for item in _SEARCHED)
    return NoDistributedEngineError(
        f"NPULossScaleOptimizer(is_distributed=True): {detail}. Looked for:\n{searched}\n"
        "Run apply_gradients inside one of these, pass the engine explicitly with "
        "reducer='tf.distribute' | 'horovod' | 'hccl' or reducer=<object with "
        "all_reduce_sum(tensor) -> tensor>, or set is_distributed=False for one worker."
    )


def check_reducer_argument(reducer: object) -> None:
    """Reject a bad ``reducer=`` when the optimizer is built, long before the first step."""
    if reducer is None or reducer == "auto" or reducer in ENGINE_NAMES:
        return
    if isinstance(reducer, str) or not callable(getattr(reducer, "all_reduce_sum", None)):
        accepted = ", ".join(repr(name) for name in ("auto", *ENGINE_NAMES))
        raise ValueError(
            f"reducer must be None, one of {accepted}, or an object with an "
            f"all_reduce_sum(tensor) -> tensor method; got {reducer!r}"
        )


def resolve_reducer(reducer: object = None) -> Reducer:
    """Turn the optimizer's ``reducer=`` into a Reducer for the current graph-building context."""
    check_reducer_argument(reducer)
    if reducer is not None and not isinstance(reducer, str):
        return reducer  # type: ignore[return-value]
    if reducer in (None, "auto"):
        engine = detect_engine()
        if engine is None:
            raise _no_engine_error("no distributed engine is active")
    else:
        engine = reducer
    if engine == "tf.distribute":
        if strategy_replica_context() is None:
            raise _no_engine_error("reducer='tf.distribute' but no tf.distribute replica context")
        return TFDistributeReducer()
    if engine == "horovod":
        hvd = _horovod_module()
        if hvd is None:
            raise _no_engine_error(
                "reducer='horovod' but horovod.tensorflow is not imported and initialised "
                "(import horovod.tensorflow as hvd; hvd.init(); install: "
                "pip install 'npu-lossscale[horovod]')"
            )
        return HorovodReducer(hvd)
    hccl = _hccl_reducer()
    if hccl is None:
        raise _no_engine_error(
            "reducer='hccl' but the Ascend adapter (npu_bridge.hccl.hccl_ops) cannot be imported"
        )
    return hccl


def in_strategy_replica_context() -> bool:
    """True inside the replica function of a tf.distribute strategy (not the default one).

    There the inner optimizer's apply_gradients must be entered from cross-replica context, so
    NPULossScaleOptimizer routes even is_distributed=False through apply_distributed.
    """
    return strategy_replica_context() is not None


def apply_distributed(
    optimizer: Any,
    grads_and_vars: tuple[tuple[Any, tf.Variable], ...],
    global_step: tf.Variable | None = None,
    name: str | None = None,
) -> tf.Operation:
    """NPULossScaleOptimizer.apply_gradients for is_distributed=True, or inside a strategy.

    The flag is summed where apply_gradients was called, so one code path serves every engine.
    Under tf.distribute the decision is then taken once, in cross-replica context (merge_call),
    because the scale variables and the inner optimizer's gradient all-reduce live there; the
    inner optimizer is still entered through its own apply_gradients on each replica, so a user
    optimizer that overrides apply_gradients (e.g. to increment the global step, as the vendor
    guide asks for BERT) keeps working. Every worker computes the same sum and so takes the same
    branch, which is what makes the collectives inside the branch safe.
    """
    context = strategy_replica_context()
    grads = [grad for grad, _ in grads_and_vars]
    if optimizer._is_distributed:
        overflow = resolve_reducer(optimizer._reducer).all_reduce_sum(
            optimizer._local_overflow(grads)
        )
    else:
        _require_single_replica(context)
        overflow = optimizer._local_overflow(grads)
    if context is None:
        return optimizer._apply_if_clean(
            overflow, lambda: optimizer._opt.apply_gradients(grads_and_vars, global_step, name)
        )
    return context.merge_call(
        _apply_in_cross_replica_context,
        args=(optimizer, grads_and_vars, overflow, global_step, name),
    )


def _require_single_replica(context: tf.distribute.ReplicaContext | None) -> None:
    """is_distributed=False is only sound for one replica: otherwise each would decide alone."""
    if context is not None and context.num_replicas_in_sync > 1:
        raise ValueError(
            "NPULossScaleOptimizer(is_distributed=False) is running under a tf.distribute "
            f"strategy with {context.num_replicas_in_sync} replicas: each replica would decide "
            "on its own whether to skip a step. Pass is_distributed=True so the overflow status "
            "is summed over all replicas first."
        )


def _apply_in_cross_replica_context(
    strategy: tf.distribute.Strategy,
    optimizer: Any,
    grads_and_vars: tuple[tuple[Any, tf.Variable], ...],
    overflow: Any,
    global_step: tf.Variable | None,
    name: str | None,
) -> tf.Operation:
    # After the all-reduce every local replica holds the same sum; the first one decides. An
    # optimizer built in the replica function (an Estimator runs model_fn once per replica)
    # arrives as one per replica, over the same mirrored state: the first one decides too,
    # and each replica applies through its own.
    agreed = strategy.experimental_local_results(overflow)[0]
    deciding = strategy.experimental_local_results(optimizer)[0]

    def apply_on_every_replica() -> tf.Operation:
        per_replica = strategy.extended.call_for_each_replica(
            _apply_inner, args=(optimizer, grads_and_vars, global_step, name)
        )
        return strategy.group(per_replica)

    return deciding._apply_if_clean(agreed, apply_on_every_replica)


def _apply_inner(
    optimizer: Any,
    grads_and_vars: tuple[tuple[Any, tf.Variable], ...],
    global_step: tf.Variable | None,
    name: str | None,
) -> tf.Operation:
    return optimizer._opt.apply_gradients(grads_and_vars, global_step, name)
