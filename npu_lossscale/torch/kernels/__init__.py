"""Build and load the PyTorch front-end's fused CPU op on first use, or say why it is not used.

One op, ``torch.ops.npu_lossscale.check_and_unscale_`` (check_unscale.cc): the overflow check of
either mode and the unscale of a list of CPU gradients in one pass, where the pure-torch path
reads them three times in saturation mode; in inf_nan mode at least as fast as torch's own
inf/NaN check-and-unscale kernel, and twice as fast on gradients already in cache (overflow.py).

Why built here rather than shipped: a torch C++ op must be compiled against the torch it is
loaded into (its headers and C++ ABI), so it is compiled once per (source, torch, compiler
command) with the host's g++ into the cache directory the TensorFlow ops use
(npu_lossscale._build_cache), and reused afterwards. g++ is called directly rather than through
``torch.utils.cpp_extension.load``, which needs ninja (a fresh CI machine may lack it) and
Python's headers for what is one C++ file registering one op. Anything that goes wrong -- no
compiler, a compile or load error -- only means the pure-torch path is used: one warning line
says so, and the results are the same either way.

``NPU_LOSSSCALE_FUSED=0`` turns the op off; ``NPU_LOSSSCALE_CACHE`` moves the build cache.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import torch

from npu_lossscale import _build_cache

DISABLE_ENV = _build_cache.DISABLE_ENV
CACHE_ENV = _build_cache.CACHE_ENV
SOURCE = Path(__file__).with_name("check_unscale.cc")
LIBRARY = "npu_lossscale_torch_ops.so"

_lock = threading.Lock()
# "op": the loaded op or None, once tried in this process; "reason": why it is None; "told": the
# level at which that was logged.
_state: dict[str, object] = {}


def fused_op(*, saturation: bool) -> torch._ops.OpOverload | None:
    """``op(grads, found_inf, inv_scale, saturation) -> bool``, building it the first time; None
    where it cannot be built or loaded, or when ``NPU_LOSSSCALE_FUSED=0``.

    The op takes CPU float32, float16 and bfloat16 tensors that each fill one dense block, a
    float32 ``found_inf`` and ``inv_scale`` of one element on the CPU. It returns False, touching
    nothing, when any argument is not such a tensor; otherwise it sets ``found_inf`` to 1 if some
    still-scaled element is NaN or infinite (or, with ``saturation``, has magnitude >= 65504),
    multiplies every gradient by ``inv_scale`` in place, and returns True.

    An op that cannot be loaded is said once: as a warning when saturation mode asks (its
    fallback reads the gradients three times), at INFO level when inf_nan mode does (its fallback
    is stock torch's own kernel, what the user had before).
    """
    if not _build_cache.enabled():
        return None
    with _lock:
        if "op" not in _state:
            _state["op"], _state["reason"] = _load()
        op = _state["op"]
        if op is None:
            _build_cache.log_unused_once(
                _state,
                logging.WARNING if saturation else logging.INFO,
                "npu_lossscale: fused CPU check-and-unscale not used, %s instead (%s)",
                "pure-torch saturation check" if saturation else "torch's inf/NaN kernel",
                _state["reason"],
            )
        return op  # type: ignore[return-value]


def built() -> bool:
    """Whether using the op now is quick: loaded already, cached, disabled or unbuildable here.

    False means the next check of CPU gradients compiles it (several seconds), so a script can
    say so before it waits.
    """
    if "op" in _state or not _build_cache.enabled() or _unusable_reason() is not None:
        return True
    return (_cache_dir() / LIBRARY).exists()


def unavailable_reason() -> str | None:
    """Why the op could not be used in this process (None if it loaded or was never tried)."""
    return _state.get("reason")  # type: ignore[return-value]


def _unusable_reason() -> str | None:
    if shutil.which(_build_cache.compiler()) is None:
        return f"no C++ compiler {_build_cache.compiler()!r} on PATH"
    return None


def _load() -> tuple[torch._ops.OpOverload | None, str | None]:
    """The loaded op and None, or None and why not."""
    reason = _unusable_reason()
    if reason is not None:
        return None, reason
    try:
        library = _cache_dir() / LIBRARY
        _build_cache.build(library, _build_command, "the fused CPU check for torch")
        torch.ops.load_library(str(library))
        return torch.ops.npu_lossscale.check_and_unscale_.default, None
    except Exception as error:  # any build or load failure means "use the pure-torch path"
        return None, f"{type(error).__name__}: {_build_cache.first_line(str(error))}"


def _build_command(output: Path) -> list[str]:
    from torch.utils import cpp_extension  # imports setuptools: only when building

    libraries = cpp_extension.library_paths()
    # at::parallel_for is a header template: without -fopenmp it runs on the calling thread
    # alone. With it, the library's libgomp.so.1 is the one torch already loaded (same soname,
    # found first through the rpath), so torch.set_num_threads governs both.
    openmp = ["-fopenmp"] if torch.backends.openmp.is_available() else []
    return [
        _build_cache.compiler(),
        *_build_cache.CXXFLAGS,
        *openmp,
        "-std=c++20",  # what torch's own extension builder uses for this torch
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{path}" for path in cpp_extension.include_paths()),
        str(SOURCE),
        "-o",
        str(output),
        *(f"-L{path}" for path in libraries),
        *(f"-Wl,-rpath,{path}" for path in libraries),
        "-lc10",
        "-ltorch_cpu",
    ]


def _cache_dir() -> Path:
    return _build_cache.cache_dir(
        (SOURCE,), (torch.__version__, torch.__file__), _build_command(Path("out"))
    )
