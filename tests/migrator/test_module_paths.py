"""The one module-path resolver the global-step plan and the triage share.

The triage puts a cleared file back when the plan could take an import for it; both now ask
`module_files`, so what is checked here holds for both. The end-to-end case (a class file only the
plan needs, kept by the triage) is test_triage.py's CLI test.
"""

from __future__ import annotations

from migrator.sources.module_paths import Paths, module_files, norm

PATHS = [
    "proj/train.py",
    "proj/mylib/__init__.py",
    "proj/mylib/opt.py",
    "proj/opt.py",
    "other/mylib/opt.py",
    "proj/pkg/sub/model.py",
    "proj/pkg/layers.py",
]


def test_a_sibling_file_wins_over_every_other_match():
    assert module_files("opt", "proj/train.py", PATHS) == ["proj/opt.py"]
    assert module_files("mylib.opt", "proj/train.py", PATHS) == ["proj/mylib/opt.py"]


def test_an_absolute_module_matches_every_file_ending_with_its_path_in_order():
    assert module_files("mylib.opt", "elsewhere/run.py", PATHS) == [
        "proj/mylib/opt.py",
        "other/mylib/opt.py",
    ]
    assert module_files("mylib", "elsewhere/run.py", PATHS) == ["proj/mylib/__init__.py"]
    # a path that merely ends with the same letters is another module
    assert module_files("b.opt", "x/run.py", ["x/lib.opt.py", "x/ab/opt.py"]) == []


def test_a_relative_module_is_looked_up_from_the_importer_folder_only():
    assert module_files(".layers", "proj/pkg/model.py", PATHS) == ["proj/pkg/layers.py"]
    assert module_files("..layers", "proj/pkg/sub/model.py", PATHS) == ["proj/pkg/layers.py"]
    assert module_files(".", "proj/mylib/opt.py", PATHS) == ["proj/mylib/__init__.py"]
    assert module_files(".opt", "proj/pkg/sub/model.py", PATHS) == []


def test_paths_are_compared_normalised():
    assert norm("proj\\pkg\\..\\opt.py") == "proj/opt.py"
    assert module_files(".opt", "proj/./x/../train.py", PATHS) == ["proj/opt.py"]


TREE = [
    *PATHS,
    "/abs/proj/mylib/opt.py",
    "mylib/opt.py",
    "x/lib.opt.py",
    "x/ab/opt.py",
    "deep/a/b/c/mylib/__init__.py",
    "opt.py",
]


def _every_path_scanned(module: str, paths: list[str]) -> list[str]:
    # The rule stated once more, path by path: the path is the module's file or package, or ends
    # with `/` and one of those.
    parts = module.split(".")
    tails = ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"]))
    return [p for p in paths if any(p == t or p.endswith("/" + t) for t in tails)]


def test_the_index_finds_what_scanning_every_path_finds_in_the_same_order():
    index = Paths(reversed(TREE))
    for module in ("opt", "mylib.opt", "mylib", "b.opt", "lib.opt", "c.mylib", "proj.opt", "x"):
        assert module_files(module, "elsewhere/run.py", index) == _every_path_scanned(
            module, list(reversed(TREE))
        ), module
    assert module_files("mylib.opt", "elsewhere/run.py", index) == [
        "mylib/opt.py",
        "/abs/proj/mylib/opt.py",
        "other/mylib/opt.py",
        "proj/mylib/opt.py",
    ]
    assert "proj/opt.py" in index and "proj" not in index and len(index) == len(TREE)
