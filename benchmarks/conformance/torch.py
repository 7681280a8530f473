"""PyTorch's and torch-npu's own GradScaler tests, run against npu_lossscale.torch's and stock's.

    python benchmarks/conformance/torch.py SNAPSHOT_DIR --materialize [--mirrors DIR]
    python benchmarks/conformance/torch.py SNAPSHOT_DIR [-v]

prints one line per suite and mode, ``torch[inf_nan]: ours P/N, stock C/N``; ``-v`` writes each
test ours fails to stderr as ``--- ours fails SUITE TEST`` and its traceback.

The texts (never copied into this repository; ``--materialize`` writes them to
SNAPSHOT_DIR/Ascend+pytorch/ from a bare clone at MIRRORS/Ascend+pytorch/repo, /work/.mirror by
default, made with ``git clone --bare`` of the Ascend/pytorch repository on GitHub), both at
Ascend/pytorch (torch-npu) commit 9e73e708ab9350d203475609f36f8a43f6a0c2ab, whose version.txt
lists torch 2.13.0 to 2.15.0:

- ``test/test_torch.py``: torch-npu's copy of PyTorch's test/test_torch.py (the pytorch repository
  is too big to fetch whole). Its grad-scaling tests in ``TestTorchDeviceType`` run on the CPU
  as PyTorch's own instantiation does (``instantiate_device_type_tests(..., only_for="cpu")``):
  every method whose name says grad scaling, GradScaler pickling or gradients invalidated after
  unscale_, and the helpers they call, unmodified, with the file's own torch imports. Not run:
  ``test_grad_scaling_update_scale`` (torch's update kernel alone, no scaler) and
  ``test_grad_scaler_deprecated_warning`` (builds ``torch.cpu.amp.GradScaler``, stock's deprecated
  wrapper, not the class under test). The class is bound by setting ``torch.GradScaler`` and
  ``torch.amp.GradScaler``, through which the tests reach it. The torch-npu names the file's
  CPU path touches take their torch values: ``TEST_MULTINPU`` and ``device_is_910A`` False,
  ``torch_npu.npu.amp.grad_scaler`` is ``torch.amp.grad_scaler``.
- ``test/npu/test_amp.py``: torch-npu's own GradScaler tests (``test_grad_scaling_*``), moved to
  the CPU by these rewrites of the text and nothing else: the device ``"npu"``/``'npu'`` ->
  ``"cpu"``, ``.npu()`` -> ``.cpu()``, ``torch.npu.FloatTensor`` -> ``torch.FloatTensor``, and
  autocast in float16 as torch-npu's is (``torch.autocast('cpu', dtype=torch.float16, ...)``).
  Its ``GradScaler`` is ours (device "auto", the CPU here) or stock torch's
  ``torch.amp.GradScaler("cpu")`` as the control (torch-npu itself needs CANN); ``TestCase`` is
  torch's with ``assertRtolEqual(a, b, prec)`` as ``|a - b| <= prec * (1 + |b|)``;
  ``SupportedDevices`` runs the Ascend910B variants, whose overflow is an inf in the gradients,
  and skips the 910A/910P ones, whose overflow is the chip's float status.

Modes: ours runs with ``INF_NAN_MODE_ENABLE=1`` (inf_nan) and ``=0`` (saturation), the class as it
ships; ``per_optimizer`` is inf_nan with ``per_optimizer=True``, stock's per-optimizer decisions.
Each side runs in a fresh process. torch's test helpers need the ``expecttest`` package.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script, this file's folder comes first on sys.path, and this file is named torch.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import ast  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import types  # noqa: E402
import unittest  # noqa: E402

REPO_ROOT = HERE.parents[1]
REPOSITORY = "Ascend/pytorch"
COMMIT = "9e73e708ab9350d203475609f36f8a43f6a0c2ab"
TEST_TORCH = "test/test_torch.py"
TEST_AMP = "test/npu/test_amp.py"
NOT_RUN = ("test_grad_scaling_update_scale", "test_grad_scaler_deprecated_warning")
SIDES = {  # side -> environment for the run
    "stock": {},
    "inf_nan": {"INF_NAN_MODE_ENABLE": "1"},
    "saturation": {"INF_NAN_MODE_ENABLE": "0"},
    "per_optimizer": {"INF_NAN_MODE_ENABLE": "1"},
}
AMP_REWRITES = (
    ("torch.autocast('npu', ", "torch.autocast('cpu', dtype=torch.float16, "),
    ('"npu"', '"cpu"'),
    ("'npu'", "'cpu'"),
    (".npu()", ".cpu()"),
    ("torch.npu.FloatTensor", "torch.FloatTensor"),
)


def materialize(snapshot: Path, mirrors: Path) -> None:
    git_dir = mirrors / REPOSITORY.replace("/", "+") / "repo"
    for path in (TEST_TORCH, TEST_AMP):
        text = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{COMMIT}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        target = _path(snapshot, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _path(snapshot: Path, path: str) -> Path:
    return snapshot / REPOSITORY.replace("/", "+") / path


def _from_torch_npu(node: ast.stmt) -> bool:
    """An import of torch-npu, or of the test folder's own helpers (url)."""
    if isinstance(node, ast.ImportFrom):
        roots = [(node.module or "").split(".")[0]]
    else:
        roots = [alias.name.split(".")[0] for alias in node.names]
    return any(root in ("torch_npu", "url") for root in roots)


def _is_import(node: ast.stmt) -> bool:
    """An import of torch's (or the standard library's), or a choice between such imports."""
    if isinstance(node, ast.If):
        return all(_is_import(n) for n in node.body + node.orelse)
    return isinstance(node, (ast.Import, ast.ImportFrom)) and not _from_torch_npu(node)


def _imports(tree: ast.Module, path: Path, namespace: dict) -> None:
    """Run the file's own imports (torch-npu's left out) into ``namespace``."""
    for node in tree.body:
        if _is_import(node):
            exec(compile(ast.Module([node], []), str(path), "exec"), namespace)


def torch_suite(path: Path) -> unittest.TestSuite:
    """test_torch.py's grad-scaling tests for the CPU, compiled from the file's own nodes (so
    tracebacks point into it)."""
    import torch
    from torch.testing._internal.common_device_type import instantiate_device_type_tests

    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    namespace: dict = {"__name__": "upstream_test_torch"}
    _imports(tree, path, namespace)
    grad_scaler = types.SimpleNamespace(grad_scaler=torch.amp.grad_scaler)
    namespace.update(
        TEST_MULTINPU=False,
        device_is_910A=False,
        torch_npu=types.SimpleNamespace(npu=types.SimpleNamespace(amp=grad_scaler)),
    )
    (cls,) = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TestTorchDeviceType"
    ]
    wanted = ("grad_scal", "gradscaler", "invalidated", "_run_scaling_case")
    methods = [
        node
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
        and any(word in node.name for word in wanted)
        and node.name not in NOT_RUN
    ]
    shell = ast.ClassDef(
        name=cls.name, bases=cls.bases, keywords=[], body=methods, decorator_list=[]
    )
    ast.copy_location(shell, cls)
    exec(compile(ast.Module([shell], []), str(path), "exec"), namespace)
    instantiate_device_type_tests(namespace[cls.name], namespace, only_for="cpu")
    return unittest.defaultTestLoader.loadTestsFromTestCase(namespace[cls.name + "CPU"])


def amp_suite(path: Path, grad_scaler: object) -> unittest.TestSuite:
    """torch-npu's test_amp.py grad-scaling tests, moved to the CPU (see the module docstring)."""
    import numpy as np
    import torch
    from torch.testing._internal.common_utils import TestCase

    source = path.read_text(encoding="utf-8")
    for old, new in AMP_REWRITES:
        source = source.replace(old, new)
    tree = ast.parse(source)

    class AmpTestCase(TestCase):
        def assertRtolEqual(self, expected: object, actual: object, prec: float = 1e-4) -> None:
            expected, actual = np.asarray(expected), np.asarray(actual)
            bound = prec * (1.0 + np.abs(expected))
            self.assertTrue(bool((np.abs(actual - expected) <= bound).all()), (expected, actual))

    def supported_devices(devices: list[str]) -> object:
        return unittest.skipUnless("Ascend910B" in devices, "needs the chip's float status")

    namespace: dict = {"__name__": "upstream_test_amp"}
    _imports(tree, path, namespace)
    namespace.update(
        torch=torch,
        GradScaler=grad_scaler,
        autocast=torch.autocast,
        SupportedDevices=supported_devices,
        TestCase=AmpTestCase,
    )
    body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.If))]
    exec(compile(ast.Module(body, []), str(path), "exec"), namespace)
    loader = unittest.TestLoader()
    loader.testMethodPrefix = "test_grad_scaling"
    return loader.loadTestsFromTestCase(namespace["TestAmp"])


def _run(suite: unittest.TestSuite) -> dict[str, object]:
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0).run(suite)
    failed = result.failures + result.errors
    total = result.testsRun - len(result.skipped)
    return {
        "passed": total - len(failed),
        "total": total,
        "failed": [test.id().rsplit(".", 1)[-1] for test, _ in failed],
        "tracebacks": [text for _, text in failed],
    }


def worker(snapshot: Path, side: str) -> None:
    """One side in this process: its results as JSON on the last stdout line."""
    import functools

    import torch

    if side == "stock":
        torch_npu_scaler = functools.partial(torch.amp.GradScaler, "cpu")
    else:
        from npu_lossscale.torch import GradScaler

        if side == "per_optimizer":
            GradScaler = _per_optimizer_class(GradScaler)
        torch.GradScaler = torch.amp.GradScaler = torch_npu_scaler = GradScaler
    results = {
        "torch": _run(torch_suite(_path(snapshot, TEST_TORCH))),
        "torch-npu": _run(amp_suite(_path(snapshot, TEST_AMP), torch_npu_scaler)),
    }
    print(json.dumps(results))


def _per_optimizer_class(base: type) -> type:
    """The shipped class with per_optimizer=True, bound where pickle finds it (this module)."""

    class PerOptimizerGradScaler(base):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("per_optimizer", True)
            super().__init__(*args, **kwargs)

    PerOptimizerGradScaler.__module__ = __name__
    PerOptimizerGradScaler.__qualname__ = PerOptimizerGradScaler.__name__
    globals()["PerOptimizerGradScaler"] = PerOptimizerGradScaler
    return PerOptimizerGradScaler


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torch.py", description=__doc__.split("\n")[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--materialize", action="store_true", help="write the texts and exit")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.materialize:
        materialize(args.snapshot, args.mirrors)
        return 0
    if args.side:
        worker(args.snapshot, args.side)
        return 0
    for path in (TEST_TORCH, TEST_AMP):
        if not _path(args.snapshot, path).is_file():
            sys.exit(f"torch: {_path(args.snapshot, path)} is missing (run with --materialize)")
    results = {side: _side(args.snapshot, side) for side in SIDES}
    stock = results.pop("stock")
    for suite in ("torch", "torch-npu"):
        theirs = stock[suite]
        for side, ours in results.items():
            mine = ours[suite]
            label = f"{suite}[{side}]"
            if args.verbose:
                for test, trace in zip(mine["failed"], mine["tracebacks"]):
                    sys.stderr.write(f"--- ours fails {label} {test}\n{trace}\n")
            print(
                f"{label}: ours {mine['passed']}/{mine['total']}, "
                f"stock {theirs['passed']}/{theirs['total']}"
            )
        if args.verbose:
            for test in theirs["failed"]:
                sys.stderr.write(f"--- stock fails {suite} {test}\n")
    return 0


def _side(snapshot: Path, side: str) -> dict:
    env = {**os.environ, **SIDES[side]}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, __file__, str(snapshot), "--side", side],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        if "No module named 'expecttest'" in done.stderr:
            sys.stderr.write("torch's test helpers need expecttest: pip install expecttest\n")
        sys.exit(f"torch: the {side} run failed (exit {done.returncode})")
    return json.loads(lines[-1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
