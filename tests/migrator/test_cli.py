"""The `npu-migrate` command end to end: modes, exit codes, failures, parallelism, start-up cost.

Every test runs the real CLI in a subprocess on real files in a temporary directory. The rewrites
themselves are tested by the codemod tests; here a file "needs porting" when it uses
tf.contrib.mixed_precision, and a ported file must no longer mention tf.contrib.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import MIGRATOR_FIXTURES, cli_env, run_cli

PORTABLE = (
    b"import tensorflow as tf\n"
    b"\n"
    b"# keep this comment\n"
    b"m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
)
# Passes the byte pre-filter (mentions loss_scale) but has nothing to port.
NOTHING_TO_PORT = b"# loss_scale is discussed here only\nx = 1\n"
# Nothing to rewrite, one warning: the class is used as a value, not constructed.
ONE_WARNING = (
    b"import tensorflow as tf\n"
    b"opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer\n"
)
BROKEN = b"import tensorflow as tf\ndef f(:\n    tf.contrib.mixed_precision\n"

SUMMARY = re.compile(
    r"^npu-migrate: (\d+) files? scanned, (\d+) (?:would change|changed), (\d+) warnings?, "
    r"(\d+) failed \(\d+\.\d\ds\)$"
)


def summary(stderr: str) -> tuple[int, int, int, int]:
    last = stderr.strip().splitlines()[-1]
    match = SUMMARY.match(last)
    assert match, f"no summary line in stderr: {stderr!r}"
    scanned, changed, warnings, failed = (int(g) for g in match.groups())
    return scanned, changed, warnings, failed


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def assert_ported(data: bytes) -> None:
    assert b"contrib" not in data
    assert b"# keep this comment\n" in data


def test_diff_mode_prints_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"train.py": PORTABLE, "util.py": b"x = 1\n"})
    before = snapshot(src)
    proc = run_cli("src", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(src) == before
    assert proc.stdout.startswith("--- a/src/train.py\n+++ b/src/train.py\n@@ ")
    assert "-m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n" in proc.stdout
    assert "util.py" not in proc.stdout
    assert "\x1b[" not in proc.stdout
    assert summary(proc.stderr) == (2, 1, 0, 0)
    assert " would change," in proc.stderr


def test_printed_diff_applies_with_patch_and_equals_write(tmp_path: Path) -> None:
    files = {"a/train.py": PORTABLE, "b.py": PORTABLE.replace(b"128", b"64")}
    reviewed = make_tree(tmp_path / "reviewed", files)
    written = make_tree(tmp_path / "written", files)
    diff = run_cli(".", cwd=reviewed).stdout
    subprocess.run(["patch", "-p1", "-s"], cwd=reviewed, input=diff.encode(), check=True)
    assert run_cli(".", "--write", cwd=written).returncode == 0
    assert snapshot_bytes(reviewed) == snapshot_bytes(written)
    assert_ported((written / "a/train.py").read_bytes())


def test_printed_diff_applies_to_files_in_their_own_encoding(tmp_path: Path) -> None:
    # Context lines with non-ASCII text: the diff must carry the files' bytes, not UTF-8.
    latin1 = (
        "# -*- coding: latin-1 -*-\nimport tensorflow as tf\nname = 'café'\n"
        "m = tf.contrib.mixed_precision.FixedLossScaleManager(128)\n"
    ).encode("latin-1")
    gbk = (
        "# coding: gbk\nimport tensorflow as tf\n# 混合精度\n"
        "m = tf.contrib.mixed_precision.FixedLossScaleManager(64)\n"
    ).encode("gbk")
    files = {"latin.py": latin1, "zh/gbk.py": gbk}
    reviewed = make_tree(tmp_path / "reviewed", files)
    written = make_tree(tmp_path / "written", files)
    printed = subprocess.run(
        [sys.executable, "-m", "migrator", "."], cwd=reviewed, capture_output=True, env=cli_env()
    )
    assert printed.returncode == 0, printed.stderr
    assert b" name = 'caf\xe9'\n" in printed.stdout
    subprocess.run(["patch", "-p1", "-s"], cwd=reviewed, input=printed.stdout, check=True)
    assert run_cli(".", "--write", cwd=written).returncode == 0
    assert snapshot_bytes(reviewed) == snapshot_bytes(written)
    assert b"FixedLossScaleManager(64)" in (written / "zh/gbk.py").read_bytes()
    assert b"contrib" not in (written / "zh/gbk.py").read_bytes()


def snapshot_bytes(root: Path) -> dict[str, bytes]:
    return {k: v[0] for k, v in snapshot(root).items()}


def test_write_is_atomic_keeps_mode_and_leaves_no_temp_files(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": PORTABLE, "same.py": NOTHING_TO_PORT})
    train, same = tmp_path / "train.py", tmp_path / "same.py"
    train.chmod(0o751)
    inode_before = train.stat().st_ino
    same_before = same.stat()
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert_ported(train.read_bytes())
    # A new inode: the file was replaced whole (temp file + rename), not rewritten in place.
    assert train.stat().st_ino != inode_before
    assert stat.S_IMODE(train.stat().st_mode) == 0o751
    # A file with nothing to port is not even rewritten.
    assert same.stat().st_ino == same_before.st_ino
    assert same.stat().st_mtime_ns == same_before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.py", "train.py"]
    assert summary(proc.stderr) == (2, 1, 0, 0)
    assert " changed," in proc.stderr


def test_write_through_a_symlink_updates_the_target_and_keeps_the_link(tmp_path: Path) -> None:
    real = make_tree(tmp_path / "real", {"train.py": PORTABLE}) / "train.py"
    link = tmp_path / "link.py"
    link.symlink_to(real)
    assert run_cli("--write", link).returncode == 0
    assert link.is_symlink()
    assert_ported(real.read_bytes())


def test_second_run_changes_nothing(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": PORTABLE, "pkg/opt.py": PORTABLE})
    assert run_cli("--write", ".", cwd=tmp_path).returncode == 0
    after_first = snapshot(tmp_path)
    check = run_cli("--check", ".", cwd=tmp_path)
    assert check.returncode == 0, check.stdout
    assert check.stdout == ""
    assert run_cli("--write", ".", cwd=tmp_path).returncode == 0
    assert snapshot(tmp_path) == after_first


def test_summary_counts_read_as_english(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", {"a.py": ONE_WARNING})
    proc = run_cli(one, cwd=tmp_path)
    assert proc.stderr.splitlines()[-1].startswith(
        "npu-migrate: 1 file scanned, 0 would change, 1 warning, 0 failed ("
    )
    two = make_tree(tmp_path / "two", {"a.py": PORTABLE, "b.py": PORTABLE})
    proc = run_cli(two, cwd=tmp_path)
    assert proc.stderr.splitlines()[-1].startswith(
        "npu-migrate: 2 files scanned, 2 would change, 0 warnings, 0 failed ("
    )


def test_check_exit_codes(tmp_path: Path) -> None:
    clean = make_tree(tmp_path / "clean", {"a.py": b"x = 1\n", "b.py": NOTHING_TO_PORT})
    pending = make_tree(tmp_path / "pending", {"a.py": PORTABLE})
    broken = make_tree(tmp_path / "broken", {"a.py": PORTABLE, "bad.py": BROKEN})
    assert run_cli("--check", clean).returncode == 0
    proc = run_cli("--check", pending)
    assert proc.returncode == 1
    # An absolute input path is shown as is (no a/ b/ prefixes).
    assert proc.stdout.startswith(f"--- {pending / 'a.py'}\n+++ {pending / 'a.py'}\n@@ ")
    # A failed file outranks pending changes: CI must see that something could not be handled.
    assert run_cli("--check", broken).returncode == 123


def test_broken_file_is_reported_untouched_and_the_rest_is_processed(tmp_path: Path) -> None:
    make_tree(tmp_path, {"bad.py": BROKEN, "good.py": PORTABLE})
    proc = run_cli("--write", ".", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 123
    assert (tmp_path / "bad.py").read_bytes() == BROKEN
    assert_ported((tmp_path / "good.py").read_bytes())
    assert re.search(r"^bad\.py:2:\d+: cannot parse: ", proc.stderr, re.M), proc.stderr
    assert summary(proc.stderr) == (2, 1, 0, 1)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["failed"] == [{"path": "bad.py", "reason": report["failed"][0]["reason"]}]
    assert re.match(r"2:\d+: cannot parse: ", report["failed"][0]["reason"])


def test_syntax_error_names_the_line_python_names(tmp_path: Path) -> None:
    # libcst's parser puts this Python 2 print on line 3 and only lists expected tokens.
    source = b'import tensorflow as tf\nprint "hello"\n# tf.contrib.mixed_precision\n'
    make_tree(tmp_path, {"py2.py": source})
    proc = run_cli("py2.py", cwd=tmp_path)
    assert proc.returncode == 123
    assert "py2.py:2:1: cannot parse: Missing parentheses" in proc.stderr
    assert '\n    print "hello"\n    ^\n' in proc.stderr  # the line, and a caret under column 1
    assert "Python 2 source; convert it to Python 3 first" in proc.stderr
    assert (tmp_path / "py2.py").read_bytes() == source


def test_syntax_error_gives_line_column_source_line_and_caret(tmp_path: Path) -> None:
    make_tree(
        tmp_path, {"bad.py": b"import tensorflow as tf  # mixed_precision\ndef f(:\n    pass\n"}
    )
    proc = run_cli("bad.py", cwd=tmp_path)
    assert proc.returncode == 123
    assert "bad.py:2:7: cannot parse: invalid syntax\n    def f(:\n          ^\n" in proc.stderr
    assert "Python 2" not in proc.stderr


def test_a_named_file_with_nothing_to_port_still_reports_its_parse_error(tmp_path: Path) -> None:
    """A file named on the command line is read even when it mentions no loss-scale API (a
    syntax check in pre-commit must not pass a broken file); one found in a directory is not
    parsed at all when its bytes hold nothing to port, as the README says."""
    make_tree(tmp_path, {"pkg/broken.py": b"def f(x):\n    return x +\n"})
    named = run_cli("--check", "pkg/broken.py", cwd=tmp_path)
    assert named.returncode == 123
    assert "pkg/broken.py:2:" in named.stderr and "cannot parse" in named.stderr
    walked = run_cli("--check", "pkg", cwd=tmp_path)
    assert walked.returncode == 0, walked.stderr


def test_an_output_dir_under_a_file_is_one_usage_error(tmp_path: Path) -> None:
    make_tree(tmp_path, {"src/a.py": PORTABLE, "src/b.py": PORTABLE, "blocker": b"a file"})
    proc = run_cli("src", "--output-dir", "blocker/out", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("blocker is a file") == 1


def test_undecodable_file_names_line_byte_and_the_coding_cookie(tmp_path: Path) -> None:
    source = "# 混合精度 训练脚本\nimport tensorflow as tf  # mixed_precision\n".encode("gbk")
    make_tree(tmp_path, {"gbk.py": source})
    proc = run_cli("gbk.py", cwd=tmp_path)
    assert proc.returncode == 123
    assert "gbk.py:1:3: cannot decode byte 0x" in proc.stderr
    assert "`# -*- coding: gbk -*-`" in proc.stderr
    assert "混合精度" in proc.stderr  # the line is shown in the encoding that reads it


def test_an_unwritable_output_dir_is_named_as_the_destination(tmp_path: Path) -> None:
    make_tree(tmp_path, {"src/sub/train.py": PORTABLE})
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("a file where the mirrored directory should go")
    proc = run_cli("src", "--output-dir", "out", cwd=tmp_path)
    assert proc.returncode == 123
    line = next(x for x in proc.stderr.splitlines() if x.startswith("src/sub/train.py"))
    assert re.match(r"src/sub/train\.py: error: cannot write \S*out/sub", line), line


def test_python2_and_undecodable_files_are_failures_with_reasons(tmp_path: Path) -> None:
    py2 = b"import tensorflow as tf\nprint 'loss_scale', tf.contrib.mixed_precision\n"
    undecodable = b"x = 'loss_scale \xff\xfe'\n"  # invalid UTF-8 and no coding cookie
    make_tree(tmp_path, {"py2.py": py2, "latin.py": undecodable})
    proc = run_cli("--write", "--report", "r.json", ".", cwd=tmp_path)
    assert proc.returncode == 123
    assert (tmp_path / "py2.py").read_bytes() == py2
    assert (tmp_path / "latin.py").read_bytes() == undecodable
    reasons = {
        f["path"]: f["reason"] for f in json.loads((tmp_path / "r.json").read_text())["failed"]
    }
    assert set(reasons) == {"py2.py", "latin.py"}
    assert "cannot parse" in reasons["py2.py"] and "Python 2" in reasons["py2.py"]
    assert "cannot decode" in reasons["latin.py"]


def test_dangling_symlink_is_an_unreadable_file(tmp_path: Path) -> None:
    make_tree(tmp_path, {"good.py": PORTABLE})
    (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 123
    assert "gone.py: error: cannot read: No such file or directory" in proc.stderr
    assert_ported((tmp_path / "good.py").read_bytes())


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files whatever their mode"
)
def test_file_without_read_permission_is_a_failure(tmp_path: Path) -> None:
    make_tree(tmp_path, {"secret.py": PORTABLE, "good.py": PORTABLE})
    (tmp_path / "secret.py").chmod(0)
    proc = run_cli("--write", ".", cwd=tmp_path)
    assert proc.returncode == 123
    assert "secret.py: error: cannot read: Permission denied" in proc.stderr
    assert_ported((tmp_path / "good.py").read_bytes())


def test_output_dir_mirrors_relative_to_the_common_root(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {"pkg/train.py": PORTABLE, "pkg/same.py": NOTHING_TO_PORT, "tool.py": b"x = 1\n"},
    )
    before = snapshot(src)
    out = tmp_path / "out"
    proc = run_cli(
        "src/pkg/train.py", "src/pkg/same.py", "src/tool.py", "--output-dir", out, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert snapshot(src) == before
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.py")) == ["pkg/train.py"]
    assert_ported((out / "pkg/train.py").read_bytes())


def test_output_dir_copy_unchanged_copies_bytes_including_failures(tmp_path: Path) -> None:
    files = {
        "pkg/train.py": PORTABLE,
        "pkg/same.py": NOTHING_TO_PORT,
        "tool.py": b"x = 1\r\n",
        "bad.py": BROKEN,
    }
    src = make_tree(tmp_path / "src", files)
    out = tmp_path / "out"
    proc = run_cli(src, "--output-dir", out, "--copy-unchanged")
    assert proc.returncode == 123
    for name in ("pkg/same.py", "tool.py", "bad.py"):
        assert (out / name).read_bytes() == files[name]
    assert_ported((out / "pkg/train.py").read_bytes())
    assert snapshot_bytes(src) == files


def test_output_dir_inside_the_input_is_not_scanned_again(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": PORTABLE})
    assert run_cli(".", "--output-dir", "ported", cwd=tmp_path).returncode == 0
    proc = run_cli(".", "--output-dir", "ported", cwd=tmp_path)
    assert summary(proc.stderr)[0] == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--write", "--output-dir", "out"],
        ["--check", "--write"],
        ["--check", "--output-dir", "out"],
        ["--copy-unchanged"],
        ["--output-dir", "."],
        ["--report", "r.txt"],
        ["--jobs", "0"],
        ["--distributed", "sometimes"],
        ["missing.py"],
    ],
)
def test_usage_errors_exit_2_and_touch_nothing(tmp_path: Path, args: list[str]) -> None:
    make_tree(tmp_path, {"train.py": PORTABLE})
    proc = run_cli(*args, "train.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Usage: npu-migrate" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    assert (tmp_path / "train.py").read_bytes() == PORTABLE


def test_no_paths_is_a_usage_error() -> None:
    assert run_cli().returncode == 2


def test_jobs_1_and_2_give_the_same_output(tmp_path: Path) -> None:
    files = {f"m{i:02d}.py": PORTABLE.replace(b"128", str(i).encode()) for i in range(12)}
    files |= {f"n{i:02d}.py": NOTHING_TO_PORT for i in range(6)}
    files["bad.py"] = BROKEN
    make_tree(tmp_path, files)
    one = run_cli(".", "--jobs", "1", "--report", "one.json", cwd=tmp_path)
    two = run_cli(".", "--jobs", "2", "--report", "two.json", cwd=tmp_path)
    assert one.returncode == two.returncode == 123
    assert one.stdout == two.stdout
    assert one.stdout.count("+++ b/") == 12
    reports = [json.loads((tmp_path / n).read_text()) for n in ("one.json", "two.json")]
    for r in reports:
        del r["summary"]["seconds"]
    assert reports[0] == reports[1]


def test_jobs_1_and_2_agree_where_the_plan_moves_a_step_or_warns(tmp_path: Path) -> None:
    # In worker processes a file is finished before the project plan is known; the plan's moves
    # (across files) and its warnings must still land, as in one process.
    shutil.copytree(MIGRATOR_FIXTURES / "bert", tmp_path, dirs_exist_ok=True)
    make_tree(tmp_path, {f"m{i}.py": PORTABLE for i in range(4)})
    one = run_cli(".", "--jobs", "1", "--report", "one.json", cwd=tmp_path)
    two = run_cli(".", "--jobs", "2", "--report", "two.json", cwd=tmp_path)
    assert one.returncode == two.returncode == 0, two.stderr
    assert one.stdout == two.stdout
    reports = [json.loads((tmp_path / n).read_text()) for n in ("one.json", "two.json")]
    for r in reports:
        del r["summary"]["seconds"]
    assert reports[0] == reports[1]
    found = {
        (f["path"], c["rule"]) for f in reports[1]["files"] for c in f["changes"] + f["warnings"]
    }
    assert ("crossfile/custom_opt.py", "global-step-move") in found  # a class the plan edits
    assert ("negative/cond_other.py", "global-step-manual") in found  # a plan warning


def test_quiet_keeps_errors_and_drops_the_summary(tmp_path: Path) -> None:
    make_tree(tmp_path, {"bad.py": BROKEN, "ok.py": NOTHING_TO_PORT})
    proc = run_cli("-q", ".", cwd=tmp_path)
    assert proc.returncode == 123
    assert proc.stderr.startswith("bad.py:2:7: cannot parse: ")
    assert "files scanned" not in proc.stderr


def test_color_is_forced_by_flag_and_off_when_piped(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": PORTABLE})
    assert "\x1b[" not in run_cli(".", cwd=tmp_path).stdout
    colored = run_cli(".", "--color", cwd=tmp_path).stdout
    assert "\x1b[31m-m = tf.contrib" in colored
    assert "\x1b[32m+" in colored


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert re.fullmatch(r"npu-migrate \S+.*\n", proc.stdout)


def _imported_modules(*args: str, cwd: Path | None = None) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "migrator", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=cwd,
    )
    return {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_help_and_a_run_never_import_tensorflow(tmp_path: Path) -> None:
    help_modules = _imported_modules("--help")
    assert "click" in help_modules
    assert not any(m.split(".")[0] in {"tensorflow", "libcst"} for m in help_modules)
    make_tree(tmp_path, {"train.py": PORTABLE})
    run_modules = _imported_modules(".", cwd=tmp_path)
    assert "libcst" in run_modules
    assert not any(m.split(".")[0] in {"tensorflow", "keras"} for m in run_modules)


def test_tree_without_candidates_does_not_load_libcst(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a.py": b"x = 1\n", "b.py": b"import os\n"})
    modules = _imported_modules(".", cwd=tmp_path)
    assert "migrator.pipeline.runner" in modules
    assert "libcst" not in modules


def _run_on_terminals(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the CLI with stdout and stderr on pseudo-terminals, as in an interactive shell."""
    out_master, out_slave = os.openpty()
    err_master, err_slave = os.openpty()
    env = cli_env()
    del env["NO_COLOR"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "migrator", *args],
        stdout=out_slave,
        stderr=err_slave,
        cwd=cwd,
        env=env,
    )
    os.close(out_slave)
    os.close(err_slave)
    captured = {out_master: b"", err_master: b""}
    open_fds = set(captured)
    while open_fds:
        for fd in select.select(list(open_fds), [], [], 120)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its end
                chunk = b""
            if chunk:
                captured[fd] += chunk
            else:
                open_fds.discard(fd)
                os.close(fd)
    code = proc.wait(timeout=120)
    return code, captured[out_master].decode(), captured[err_master].decode()


def test_terminal_gets_colour_and_a_progress_bar(tmp_path: Path) -> None:
    # Files the codemods must read (they name a loss-scale class) but do not change.
    seen = b"import npu_lossscale\n\nmanager = npu_lossscale.FixedLossScaleManager(8)\n"
    files = {f"m{i:03d}.py": seen for i in range(60)}
    files["train.py"] = PORTABLE
    make_tree(tmp_path, files)
    code, out, err = _run_on_terminals([".", "--jobs", "1"], tmp_path)
    assert code == 0, err
    assert "\x1b[31m-m = tf.contrib" in out
    assert "migrating" in err
    assert "61/61" in err or "100%" in err
    code, _, err = _run_on_terminals([".", "--quiet", "--jobs", "1"], tmp_path)
    assert "migrating" not in err


def test_output_dir_mirrors_a_symlink_where_it_appears(tmp_path: Path) -> None:
    elsewhere = make_tree(tmp_path / "elsewhere", {"shared.py": NOTHING_TO_PORT})
    src = make_tree(tmp_path / "src", {"a.py": NOTHING_TO_PORT})
    (src / "linked.py").symlink_to(elsewhere / "shared.py")
    proc = run_cli(src, "--output-dir", tmp_path / "out", "--copy-unchanged")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "linked.py").read_bytes() == NOTHING_TO_PORT
    assert not (tmp_path / "out" / "linked.py").is_symlink()


def test_console_script_is_the_same_command(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "npu-migrate"
    if not script.exists():
        pytest.skip("package not installed in this interpreter's environment")
    make_tree(tmp_path, {"train.py": PORTABLE})
    proc = subprocess.run(
        [str(script), "train.py"], cwd=tmp_path, capture_output=True, text=True, env=cli_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_cli("train.py", cwd=tmp_path).stdout
    assert "Usage: npu-migrate" in run_cli("--help").stdout
