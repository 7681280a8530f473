"""Direct checks of the transform's contract that the CLI tests do not isolate."""

from __future__ import annotations

import pytest
from cli_runner import MIGRATOR_FIXTURES

from migrator.findings import SourceError
from migrator.pipeline.transform import (
    MigrateOptions,
    might_need_migration,
    migrate_source,
    plan_from_facts,
    scan_source,
)

FIXTURES = MIGRATOR_FIXTURES


def test_prefilter_keeps_every_fixture_and_skips_plain_code() -> None:
    for path in sorted(FIXTURES.glob("cases/*.py")):
        assert might_need_migration(path.read_bytes()), path.name
    assert might_need_migration(b"m = tf.train.experimental.DynamicLossScale()\n")
    assert might_need_migration(b"f = getattr(tf.contrib, name)\n")
    assert not might_need_migration(b"import tensorflow as tf\nprint(tf.add(1, 2))\n")
    assert not might_need_migration(b"getattr(obj, 'x')\n")


def test_nothing_to_port_returns_the_same_bytes() -> None:
    source = b"import tensorflow as tf  # keep\r\n\r\nx   =  tf.constant(1)\r\n"
    result = migrate_source(source, path="plain.py")
    assert result.new_source is source
    assert result.findings == []


def test_unparsable_and_undecodable_input_raise_source_error() -> None:
    with pytest.raises(SourceError, match="^2:5: cannot parse"):
        migrate_source(b"import tensorflow as tf\ndef (:\n", path="bad.py")
    with pytest.raises(SourceError):
        migrate_source(b"# -*- coding: no-such-codec -*-\nx = 1\n", path="bad.py")


def test_options_reject_unknown_distributed_mode() -> None:
    with pytest.raises(ValueError, match="distributed"):
        MigrateOptions(distributed="sometimes")  # type: ignore[arg-type]


def test_plan_skips_unparsable_files_and_is_picklable() -> None:
    import pickle

    sources = {
        "a.py": (FIXTURES / "cases" / "bert_snippet.py").read_bytes(),
        "broken.py": b"def (:\n",
    }
    plan = plan_from_facts(scan_source(s, path=p) for p, s in sources.items())
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_findings_point_at_original_lines() -> None:
    source = (FIXTURES / "cases" / "control_deps.py").read_bytes()
    result = migrate_source(source, path="control_deps.py")
    lines = source.decode().splitlines()
    for finding in result.findings:
        if finding.rule in ("contrib-manager", "manager-in-control-deps"):
            assert "ExponentialUpdateLossScaleManager" in lines[finding.line - 1]
