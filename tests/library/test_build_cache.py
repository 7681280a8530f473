"""The fused-op build cache remembers a failed compile, so no later process pays for it again.

A real g++ on a real source that cannot compile: the first build fails with the compiler's
error, and every later build of the same library (same cache directory: same sources, framework
and flags) raises the same error at once without running the compiler again.
"""

from __future__ import annotations

import shutil

import pytest

from npu_lossscale import _build_cache

pytestmark = [
    pytest.mark.stacks,
    pytest.mark.skipif(shutil.which(_build_cache.compiler()) is None, reason="no C++ compiler"),
]


def test_a_failed_compile_is_remembered_and_not_retried(tmp_path):
    source = tmp_path / "broken.cc"
    source.write_text("int main() { return undeclared_name; }\n")
    library = tmp_path / "cache" / "broken.so"
    runs = []

    def command(output):
        runs.append(output)
        return [_build_cache.compiler(), *_build_cache.CXXFLAGS, str(source), "-o", str(output)]

    with pytest.raises(RuntimeError, match="undeclared_name") as first:
        _build_cache.build(library, command, "a broken op")
    assert len(runs) == 1
    with pytest.raises(RuntimeError, match="undeclared_name") as again:
        _build_cache.build(library, command, "a broken op")
    assert len(runs) == 1  # the compiler did not run a second time
    assert str(first.value) in str(again.value)
    assert not library.exists()
    assert [p.name for p in library.parent.iterdir() if p.suffix == ".so"] == []

    # Deleting the record (what the message points at) lets the next build try again.
    _build_cache.failure_record(library).unlink()
    with pytest.raises(RuntimeError):
        _build_cache.build(library, command, "a broken op")
    assert len(runs) == 2


def test_a_good_compile_is_built_once(tmp_path):
    source = tmp_path / "ok.cc"
    source.write_text('extern "C" int answer() { return 42; }\n')
    library = tmp_path / "cache" / "ok.so"
    runs = []

    def command(output):
        runs.append(output)
        return [_build_cache.compiler(), *_build_cache.CXXFLAGS, str(source), "-o", str(output)]

    assert _build_cache.build(library, command, "an op") == library
    assert _build_cache.build(library, command, "an op") == library
    assert len(runs) == 1 and library.exists()
