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

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import tensorflow as tf

logger = logging.getLogger("npu_lossscale")

DISABLE_ENV = "NPU_LOSSSCALE_FUSED"
CACHE_ENV = "NPU_LOSSSCALE_CACHE"
OP_NAMES = ("NpuUnscaleAndCheck", "NpuLossScaleUpdate")
SOURCES = tuple(Path(__file__).with_name(n) for n in ("unscale_check.cc", "loss_scale_update.cc"))

# Portable on purpose (no -march=native): the cache directory may be shared between machines.
_CXXFLAGS = ("-O3", "-shared", "-fPIC", "-w")
_COMPILE_TIMEOUT_S = 600

_lock = threading.Lock()
# "library": (module, None) or (None, why) once built or tried; "module": what fused_ops hands
# out, once decided; "reason": why that is None.
_state: dict[str, object] = {}


def enabled() -> bool:
    """Whether the environment allows the fused op (checked on every use, so it can be toggled)."""
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


# Called while a tf.function is traced; AutoGraph would otherwise try to convert the loader and
# the os/importlib helpers it calls, and warn once per helper that it cannot.
@tf.autograph.experimental.do_not_convert
def fused_ops() -> ModuleType | None:
    """The loaded op module, building it the first time; None (after one warning) if unusable."""
    if not enabled():
        return None
    with _lock:
        if "module" not in _state:
            reason = _unusable_reason()
            module = None
            if reason is None:
                module, reason = _library_locked()
            if module is None:
                _state["reason"] = reason
                logger.warning(
                    "npu_lossscale: fused CPU ops not used, pure-TF check and update instead (%s)",
                    reason,
                )
            _state["module"] = module
        return _state["module"]  # type: ignore[return-value]


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
    if "library" in _state or not enabled() or _unusable_reason() is not None:
        return True
    return (_cache_dir() / "npu_lossscale_ops.so").exists()


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
    # On an Ascend host the graph is compiled for the NPU, which knows no custom CPU op; on a GPU
    # build the op would pull every gradient back to the host.
    if any(importlib.util.find_spec(name) for name in ("npu_bridge", "npu_device")):
        return "an Ascend adapter is installed (the graph runs on the NPU)"
    if tf.config.list_physical_devices("GPU"):
        return "GPUs are visible (the op is CPU-only)"
    if shutil.which(_compiler()) is None:
        return f"no C++ compiler {_compiler()!r} on PATH"
    return None


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def _library_locked() -> tuple[ModuleType | None, str | None]:
    """The built and loaded library and None, or None and why not; tried once per process.
    The caller holds ``_lock``."""
    if "library" not in _state:
        try:
            module = tf.load_op_library(str(_build()))
            for name in OP_NAMES:
                tf.no_gradient(name)
            _state["library"] = (module, None)
        except Exception as error:  # any build or load failure means "use the pure-TF path"
            _state["library"] = (None, f"{type(error).__name__}: {_first_line(str(error))}")
    return _state["library"]  # type: ignore[return-value]


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"


def _build_command(output: Path) -> list[str]:
    return [
        _compiler(),
        *_CXXFLAGS,
        *(str(source) for source in SOURCES),
        "-o",
        str(output),
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
    ]


def _cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(Path.home(), ".cache", "npu_lossscale")
    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.read_bytes())
    key.update(tf.__version__.encode())
    key.update(tf.__file__.encode())
    key.update(" ".join(_build_command(Path("out"))).encode())
    key.update(sys.platform.encode())
    return Path(root) / key.hexdigest()[:20]


def _build() -> Path:
    """Compile once per cache key; a file lock makes parallel processes wait for one build."""
    directory = _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "npu_lossscale_ops.so"
    with open(directory / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if library.exists():
            return library
        handle, temp_name = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(handle)
        temp = Path(temp_name)
        try:
            started = time.perf_counter()
            logger.info("npu_lossscale: compiling the fused CPU ops (one-off)")
            done = subprocess.run(
                _build_command(temp),
                capture_output=True,
                text=True,
                timeout=_COMPILE_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                message = _first_line(errors[0] if errors else done.stderr)
                raise RuntimeError(f"{_compiler()} failed: {message}")
            os.replace(temp, library)
            logger.info(
                "npu_lossscale: fused ops built in %.1f s into %s",
                time.perf_counter() - started,
                library,
            )
        finally:
            temp.unlink(missing_ok=True)
    return library
