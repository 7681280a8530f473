"""Compile a fused CPU op library once per machine setup with the host's C++ compiler, and cache it.

Shared by the TensorFlow and PyTorch front-ends (npu_lossscale.tf.kernels,
npu_lossscale.torch.kernels). A framework's custom op must be compiled against the exact framework
it is loaded into, so each library is built on first use and kept in a cache directory whose name
hashes everything the binary depends on: the sources, the framework's version and location, the
compiler command and the platform. A change to any of them builds afresh; nothing else does.

``NPU_LOSSSCALE_FUSED=0`` turns the fused ops off; ``NPU_LOSSSCALE_CACHE`` moves the cache
(default ``~/.cache/npu_lossscale``). Parallel processes wait on a file lock for one build, and a
library appears under its final name only once complete, so none ever loads a half-written file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

logger = logging.getLogger("npu_lossscale")

DISABLE_ENV = "NPU_LOSSSCALE_FUSED"
CACHE_ENV = "NPU_LOSSSCALE_CACHE"
# Portable on purpose (no -march=native): the cache directory may be shared between machines.
CXXFLAGS = ("-O3", "-shared", "-fPIC", "-w")
COMPILE_TIMEOUT_S = 600


def enabled() -> bool:
    """Whether the environment allows the fused ops (read on every use, so it can be toggled)."""
    return os.environ.get(DISABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def compiler() -> str:
    return os.environ.get("CXX", "g++")


def first_line(text: str) -> str:
    """The first non-blank line of an error, cut to 300 characters: what one warning line shows."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"


def cache_dir(sources: Iterable[Path], identity: Iterable[str], command: Sequence[str]) -> Path:
    """The directory for the library built by ``command`` from ``sources``; ``identity`` names
    the framework it is built against (version, install location)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(Path.home(), ".cache", "npu_lossscale")
    key = hashlib.sha256()
    for source in sources:
        key.update(source.read_bytes())
    for part in identity:
        key.update(part.encode())
    key.update(" ".join(command).encode())
    key.update(sys.platform.encode())
    return Path(root) / key.hexdigest()[:20]


def log_unused_once(state: dict[str, object], level: int, message: str, *args: object) -> None:
    """Log why a fused op is not used, once per level: a caller whose fallback costs more asks
    for a warning, one whose fallback costs what the user had anyway for an INFO line, and a
    warning still comes after an INFO line. ``state["told"]`` keeps the level logged so far."""
    if state.get("told", logging.NOTSET) < level:  # type: ignore[operator]
        state["told"] = level
        logger.log(level, message, *args)


def failure_record(library: Path) -> Path:
    """Where a failed compile of ``library`` is remembered: beside it, in the same cache
    directory, so it holds for exactly the sources, framework build and flags that failed."""
    return library.with_name(library.name + ".failed")


def build(library: Path, command: Callable[[Path], list[str]], label: str) -> Path:
    """Compile ``library`` with ``command(output)`` unless it exists; returns its path.

    Raises RuntimeError with the compiler's first error line when the compile fails. A failed
    compile is remembered (``failure_record``), so later processes raise the same error at once
    instead of spending the compile again (7-40 s of g++ each): it could only fail the same way,
    since everything it depends on is in the cache directory's name. Deleting the record retries.
    """
    import fcntl  # POSIX only: imported here, so that elsewhere a build fails instead of an import

    library.parent.mkdir(parents=True, exist_ok=True)
    failed = failure_record(library)
    with open(library.parent / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if library.exists():
            return library
        if failed.exists():
            raise RuntimeError(f"{failed.read_text().strip()} (remembered in {failed})")
        handle, temp_name = tempfile.mkstemp(suffix=library.suffix, dir=library.parent)
        os.close(handle)
        temp = Path(temp_name)
        try:
            started = time.perf_counter()
            logger.info("npu_lossscale: compiling %s (one-off)", label)
            done = subprocess.run(
                command(temp),
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line]
                message = f"{compiler()} failed: {first_line(errors[0] if errors else done.stderr)}"
                failed.write_text(message + "\n")
                raise RuntimeError(message)
            os.replace(temp, library)
            logger.info(
                "npu_lossscale: %s built in %.1f s into %s",
                label,
                time.perf_counter() - started,
                library,
            )
        finally:
            if temp.exists():  # Path.unlink(missing_ok=) needs Python 3.8
                temp.unlink()
    return library
