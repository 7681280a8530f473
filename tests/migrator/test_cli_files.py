"""What npu-migrate looks at and what survives it: discovery, exclusion, encodings, line endings.

Encoding and line-ending cases go through the real CLI on real files; the discovery rules are also
checked in-process against `migrator.sources.files`, which is plain Python without libcst.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import cli_env, run_cli

from migrator.report.diffing import decode_for_display, unified_diff
from migrator.sources.files import discover, is_excluded

# Fails to parse, so it shows up under "failed" in the report: a cheap marker of "was scanned".
BROKEN = b"import tensorflow as tf\ndef f(:\n    tf.contrib.mixed_precision\n"
PORT_LINE = "m = tf.contrib.mixed_precision.FixedLossScaleManager(128)"


def write(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def failed_paths(tmp_path: Path, *args: str) -> set[str]:
    proc = run_cli(*args, "--report", str(tmp_path / "report.json"), cwd=tmp_path / "tree")
    assert proc.returncode in (0, 123), proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    return {f["path"] for f in report["failed"]}


def test_directories_skip_hidden_venv_and_caches(tmp_path: Path) -> None:
    names = [
        "a.py",
        "pkg/b.py",
        "pkg/notes.txt",
        ".git/hooks/c.py",
        ".tox/d.py",
        "venv/lib/e.py",
        ".venv/lib/f.py",
        "pkg/__pycache__/g.py",
        "lib/python3.11/site-packages/h.py",
        "node_modules/i.py",
    ]
    write(tmp_path / "tree", dict.fromkeys(names, BROKEN))
    assert failed_paths(tmp_path, ".") == {"a.py", "pkg/b.py"}


def test_explicit_files_are_taken_whatever_their_suffix(tmp_path: Path) -> None:
    write(tmp_path / "tree", {"train_script": BROKEN, "venv/x.py": BROKEN, "a.py": BROKEN})
    # Named explicitly: read even without .py and even inside a skipped directory.
    assert failed_paths(tmp_path, "train_script", "venv/x.py", "a.py", "./a.py") == {
        "train_script",
        "venv/x.py",
        "a.py",
    }


def test_exclude_globs_match_directories_names_and_paths(tmp_path: Path) -> None:
    names = ["keep.py", "gen/x.py", "proto/y_pb2.py", "tests/deep/t.py", "tests_keep.py"]
    write(tmp_path / "tree", dict.fromkeys(names, BROKEN))
    found = failed_paths(
        tmp_path, ".", "--exclude", "gen", "--exclude", "*_pb2.py", "--exclude", "tests/*"
    )
    assert found == {"keep.py", "tests_keep.py"}


@pytest.mark.parametrize(
    ("relative", "patterns", "expected"),
    [
        ("a/b/c.py", ["a"], True),
        ("a/b/c.py", ["b"], True),
        ("a/b/c.py", ["a/b"], True),
        ("a/b/c.py", ["*.py"], True),
        ("a/b/c.py", ["c.py"], True),
        ("a/b/c.py", ["a/c.py"], False),
        ("a/b/c.py", ["ab"], False),
        ("a/b/c.py", [], False),
        ("abc/d.py", ["a*"], True),
    ],
)
def test_is_excluded(relative: str, patterns: list[str], expected: bool) -> None:
    assert is_excluded(relative, patterns) is expected


def test_discover_takes_each_file_once(tmp_path: Path) -> None:
    write(tmp_path, {"b.py": b"", "a/c.py": b"", "a/d.txt": b""})
    found = discover([tmp_path, tmp_path / "b.py", tmp_path / "a", tmp_path / "a/../b.py"])
    assert sorted(f.path.relative_to(tmp_path).as_posix() for f in found.files) == [
        "a/c.py",
        "b.py",
    ]
    assert found.errors == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root lists directories whatever their mode")
def test_unlistable_directory_is_a_failure(tmp_path: Path) -> None:
    write(tmp_path / "tree", {"a.py": b"x = 1\n", "locked/b.py": b""})
    (tmp_path / "tree" / "locked").chmod(0)
    try:
        proc = run_cli(".", cwd=tmp_path / "tree")
    finally:
        (tmp_path / "tree" / "locked").chmod(0o755)
    assert proc.returncode == 123
    assert "locked: error: cannot list directory: Permission denied" in proc.stderr


UNTOUCHED_CASES = {
    "gbk.py": "# -*- coding: gbk -*-\n# 损失缩放 loss_scale 说明\nx = '混合精度'\n".encode("gbk"),
    "latin1.py": "# coding: latin-1\n# loss_scale: Größe\ny = 'é'\n".encode("latin-1"),
    "bom.py": b"\xef\xbb\xbf# loss_scale\nz = 1\n",
    "crlf.py": b"# loss_scale\r\nif True:\r\n    a = 1  # c\r\n",
    "tabs.py": b"# loss_scale\nif True:\n\ta = 1\t# tab comment\n\n\n",
    "no_newline.py": b"# loss_scale\nb = 2",
    "formfeed.py": b"# loss_scale\n\x0c\ndef f():\n    return 1\n",
}


def test_files_with_nothing_to_port_survive_byte_for_byte(tmp_path: Path) -> None:
    write(tmp_path / "tree", UNTOUCHED_CASES)
    proc = run_cli("--write", ".", cwd=tmp_path / "tree")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"npu-migrate: {len(UNTOUCHED_CASES)} files scanned, 0 changed")
    for name, data in UNTOUCHED_CASES.items():
        assert (tmp_path / "tree" / name).read_bytes() == data, name


def test_output_dir_copy_of_untouched_files_is_byte_identical(tmp_path: Path) -> None:
    write(tmp_path / "tree", UNTOUCHED_CASES)
    proc = run_cli(".", "--output-dir", "../out", "--copy-unchanged", cwd=tmp_path / "tree")
    assert proc.returncode == 0, proc.stderr
    for name, data in UNTOUCHED_CASES.items():
        assert (tmp_path / "out" / name).read_bytes() == data, name


def test_gbk_file_keeps_its_encoding_and_comments_when_changed(tmp_path: Path) -> None:
    text = f"# -*- coding: gbk -*-\n# 训练脚本\nimport tensorflow as tf\n{PORT_LINE}  # 缩放\n"
    write(tmp_path, {"train.py": text.encode("gbk")})
    report = tmp_path / "report.json"
    printed = subprocess.run(
        [sys.executable, "-m", "migrator", "train.py", "--report", report],
        cwd=tmp_path,
        capture_output=True,
        env=cli_env(),
    )
    # Printed in the file's own bytes, so that `patch` applies it; the report holds text.
    assert f"-{PORT_LINE}  # 缩放\n".encode("gbk") in printed.stdout
    diff = json.loads(report.read_text(encoding="utf-8"))["files"][0]["diff"]
    assert f"-{PORT_LINE}  # 缩放\n" in diff  # decoded with the cookie for display
    assert run_cli("--write", "train.py", cwd=tmp_path).returncode == 0
    new = (tmp_path / "train.py").read_bytes()
    assert new.startswith("# -*- coding: gbk -*-\n# 训练脚本\n".encode("gbk"))
    assert "# 缩放".encode("gbk") in new
    assert b"contrib" not in new


def test_crlf_bom_and_tabs_survive_a_change_elsewhere(tmp_path: Path) -> None:
    text = (
        "\ufeff# header\r\nimport tensorflow as tf\r\n\r\n"
        "def f():\r\n\treturn 1\t# tabbed\r\n\r\n"
        f"{PORT_LINE}\r\n"
    )
    write(tmp_path, {"train.py": text.encode("utf-8")})
    assert run_cli("--write", "train.py", cwd=tmp_path).returncode == 0
    new = (tmp_path / "train.py").read_bytes()
    assert new.startswith(b"\xef\xbb\xbf# header\r\n")
    assert b"def f():\r\n\treturn 1\t# tabbed\r\n" in new
    assert b"contrib" not in new
    assert new.count(b"\n") == new.count(b"\r\n"), "a bare LF slipped into a CRLF file"


def test_decode_for_display_falls_back_through_cookie_and_latin1() -> None:
    assert decode_for_display("é".encode()) == "é"
    assert decode_for_display("# coding: gbk\n中".encode("gbk")) == "# coding: gbk\n中"
    assert decode_for_display(b"\xff\xfe") == "ÿþ"


def test_unified_diff_marks_missing_final_newline_and_keeps_crlf() -> None:
    diff = unified_diff(b"a = 1\r\nb = 2", b"a = 1\r\nb = 3", "x.py")
    assert diff == (
        "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a = 1\r\n"
        "-b = 2\n\\ No newline at end of file\n+b = 3\n\\ No newline at end of file\n"
    )
    assert unified_diff(b"same", b"same", "x.py") == ""


def test_invalid_escapes_in_the_users_code_print_no_warnings(tmp_path: Path) -> None:
    # From Python 3.12 the compiler prints a SyntaxWarning for `"\d"` in code it parses (3.11: a
    # DeprecationWarning, hidden): the code is the user's, so the run stays quiet about it. The
    # test that can tell runs on the newest-Python stack of `make test`.
    tree = tmp_path / "tree"
    source = b'import re\nimport tensorflow as tf\nDIGITS = re.compile("\\d+")\n'
    write(tree, {"train.py": source + PORT_LINE.encode() + b"\n"})
    proc = run_cli("--write", ".", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert "Warning: invalid escape" not in proc.stderr, proc.stderr
    ported = (tree / "train.py").read_bytes()
    assert b'DIGITS = re.compile("\\d+")\n' in ported and b"contrib" not in ported


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_not_started_by_fork_print_no_warnings_either(tmp_path: Path, method: str) -> None:
    # Python 3.14 starts workers by forkserver on Linux: they inherit none of the command line's
    # settings and must make their own. 110 files are enough for two workers in both pools (the
    # triage's and the port's); the test that can tell runs on the newest-Python stack.
    tree = tmp_path / "tree"
    source = b'import re\nimport tensorflow as tf\nDIGITS = re.compile("\\d+")\n'
    write(tree, {f"train_{i}.py": source + PORT_LINE.encode() + b"\n" for i in range(110)})
    started = (
        "import multiprocessing, sys\n"
        "multiprocessing.set_start_method(sys.argv[1])\n"
        "from migrator.cli import main\n"
        "sys.argv[:2] = ['npu-migrate']\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", started, method, "--check", "-j", "2", "."],
        cwd=tree,
        capture_output=True,
        env=cli_env(),
        timeout=300,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    assert "110 would change" in proc.stderr, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
