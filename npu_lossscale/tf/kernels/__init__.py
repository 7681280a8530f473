"""Build and load the fused CPU ops on first use, or say why they are not used.

Two ops, one library: ``NpuUnscaleAndCheck`` (unscale_check.cc) unscales gradients and decides
overflow in one pass; ``NpuLossScaleUpdate`` (loss_scale_update.cc) is the dynamic manager's
per-step update as one graph node.

Why built here rather than shipped: a TensorFlow custom op must be compiled against the exact
TensorFlow it is loaded into, so it is compiled once per (source, TensorFlow, compiler flags) with
the host's g++ into a cache directory and reused afterwards. Anything that goes wrong -- no
compiler, no headers, a load error -- only means the pure-TF path is used: one warning line says
so, and the results are the same either way.

``NPU_LOSSSCALE_FUSED=0`` turns the op off; ``NPU_LOSSSCALE_CACHE`` moves the build cache.

Using the ops and registering them are two decisions. New graphs use them only where they help
(``fused_ops``). But a graph saved with them (a ``.meta`` file, a SavedModel of the training
graph) names them, and TensorFlow refuses to import it until they are registered in the process,
wherever it is resumed: ``register_ops`` builds and loads the library for that, explicitly,
since building on ``import npu_lossscale`` would cost every first import about 15 s.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import threading
from pathlib import Path
from types import ModuleType

import tensorflow as tf

from npu_lossscale import _build_cache

DISABLE_ENV = _build_cache.DISABLE_ENV
CACHE_ENV = _build_cache.CACHE_ENV
LIBRARY = "npu_lossscale_ops.so"
OP_NAMES = ("NpuUnscaleAndCheck", "NpuLossScaleUpdate")
SOURCES = tuple(Path(__file__).with_name(n) for n in ("unscale_check.cc", "loss_scale_update.cc"))

_lock = threading.Lock()
# "library": (module, None) or (None, why) once built or tried; "module": what fused_ops hands
# out, once decided; "reason": why that is None; "elsewhere": whether because an NPU or GPU runs
# the graph; "told": the level that was logged at.
_state: dict[str, object] = {}


# Called while a tf.function is traced; AutoGraph would otherwise try to convert the loader and
# the os/importlib helpers it calls, and warn once per helper that it cannot.
@tf.autograph.experimental.do_not_convert
def fused_ops(*, warn: bool = True) -> ModuleType | None:
    """The loaded op module, building it the first time; None if unusable, said once.

    Where an NPU or GPU runs the graph the op was never meant to run: that is an INFO line. A
    missing compiler or a failed build is a warning when ``warn`` (the TF1 optimizer, whose
    fallback reads every gradient twice), an INFO line otherwise (the Keras optimizer, whose
    fallback is Keras's own check); a later warning caller still gets its warning.
    """
    if not _build_cache.enabled():
        return None
    with _lock:
        if "module" not in _state:
            elsewhere = _elsewhere_reason()
            reason = elsewhere or _compiler_reason()
            module = None
            if reason is None:
                module, reason = _library_locked()
            _state["module"], _state["reason"], _state["elsewhere"] = module, reason, elsewhere
        module = _state["module"]
        if module is None:
            _build_cache.log_unused_once(
                _state,
                logging.WARNING if warn and not _state["elsewhere"] else logging.INFO,
                "npu_lossscale: fused CPU ops not used, pure-TF check and update instead (%s)",
                _state["reason"],
            )
        return module  # type: ignore[return-value]


def register_ops() -> None:
    """Register the fused ops with TensorFlow, building them if needed, before importing a graph
    that was saved with them (``tf.compat.v1.train.import_meta_graph``, a SavedModel loader).

    Registration does not depend on whether this process would use the ops (a GPU may be visible
    here, or ``NPU_LOSSSCALE_FUSED=0`` set): the graph being imported already contains them.
    Raises RuntimeError naming the reason when they cannot be built or loaded here.
    """
    with _lock:
        module, reason = _library_locked()
    if module is None:
        raise RuntimeError(
            f"npu_lossscale: cannot register the fused ops NpuUnscaleAndCheck and "
            f"NpuLossScaleUpdate ({reason}); a graph saved with them cannot be imported here. "
            f"Build graphs that must move to such machines with {DISABLE_ENV}=0."
        )


def built() -> bool:
    """Whether using the ops now is quick: loaded already, cached, disabled or unbuildable here.

    False means the next use compiles them (about 15 s), so a script can say so before it waits.
    """
    if "library" in _state or not _build_cache.enabled() or _unusable_reason() is not None:
        return True
    return (_cache_dir() / LIBRARY).exists()


def unavailable_reason() -> str | None:
    """Why the op could not be used in this process (None if it loaded or was never tried)."""
    return _state.get("reason")  # type: ignore[return-value]


def in_xla_context() -> bool:
    """Whether ops built now will be compiled by XLA (``tf.function(jit_compile=True)``).

    XLA cannot compile a custom op, so there the pure-TF path must be used. TensorFlow exposes
    this only through an internal module; if that ever moves, assume XLA (the safe answer).
    """
    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return True
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _unusable_reason() -> str | None:
    return _elsewhere_reason() or _compiler_reason()


def _elsewhere_reason() -> str | None:
    """Why the graph runs somewhere the op cannot go, if it does: on an Ascend host the graph is
    compiled for the NPU, which knows no custom CPU op; on a GPU build the op would pull every
    gradient back to the host."""
    if any(importlib.util.find_spec(name) for name in ("npu_bridge", "npu_device")):
        return "an Ascend adapter is installed (the graph runs on the NPU)"
    # tf.config.list_physical_devices is TF 2.1+; TF 1.15 has only the experimental name.
    list_devices = getattr(tf.config, "list_physical_devices", None)
    if (list_devices or tf.config.experimental.list_physical_devices)("GPU"):
        return "GPUs are visible (the op is CPU-only)"
    return None


def _compiler_reason() -> str | None:
    if shutil.which(_build_cache.compiler()) is None:
        return f"no C++ compiler {_build_cache.compiler()!r} on PATH"
    return None


def _library_locked() -> tuple[ModuleType | None, str | None]:
    """The built and loaded library and None, or None and why not; tried once per process.
    The caller holds ``_lock``."""
    if "library" not in _state:
        try:
            library = _cache_dir() / LIBRARY
            _build_cache.build(library, _build_command, "the fused CPU ops")
            module = tf.load_op_library(str(library))
            for name in OP_NAMES:
                tf.no_gradient(name)
            _state["library"] = (module, None)
        except Exception as error:  # any build or load failure means "use the pure-TF path"
            reason = f"{type(error).__name__}: {_build_cache.first_line(str(error))}"
            _state["library"] = (None, reason)
    return _state["library"]  # type: ignore[return-value]


def _build_command(output: Path) -> list[str]:
    compile_flags = tf.sysconfig.get_compile_flags()
    return [
        _build_cache.compiler(),
        *_build_cache.CXXFLAGS,
        *_language_standard(compile_flags),
        *(str(source) for source in SOURCES),
        "-o",
        str(output),
        *compile_flags,
        *tf.sysconfig.get_link_flags(),
    ]


def _language_standard(compile_flags: list[str]) -> list[str]:
    """The C++ standard this TensorFlow's headers were built for, where its flags do not say.

    Recent releases name it in their compile flags (TF 2.21: ``--std=c++17``); TF 1.15 and 2.6
    do not, and were built as C++14: their headers compiled under g++'s newer default standard
    declare other symbols (``string_view`` overloads) than the library exports, and the op
    fails to load with an undefined symbol.
    """
    if any(flag.lstrip("-").startswith("std=") for flag in compile_flags):
        return []
    return ["-std=c++14"]


def _cache_dir() -> Path:
    return _build_cache.cache_dir(
        SOURCES, (tf.__version__, tf.__file__), _build_command(Path("out"))
    )
