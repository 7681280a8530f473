"""Overflow-mode resolution: argument, Ascend runtime, INF_NAN_MODE_ENABLE, default; logged once."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from npu_lossscale import modes
from npu_lossscale.modes import FP16_SATURATION_VALUE, OverflowMode, resolve_overflow_mode

pytestmark = pytest.mark.stacks


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Each test starts with no env var and a fresh 'already logged' memory."""
    monkeypatch.delenv("INF_NAN_MODE_ENABLE", raising=False)
    monkeypatch.setattr(modes, "_logged", set())


def test_fp16_saturation_value_is_fp16_max():
    assert FP16_SATURATION_VALUE == float(np.finfo(np.float16).max) == 65504.0


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("saturation", OverflowMode.SATURATION),
        ("SATURATION", OverflowMode.SATURATION),
        (" Saturation ", OverflowMode.SATURATION),
        ("inf_nan", OverflowMode.INF_NAN),
        ("INF_NAN", OverflowMode.INF_NAN),
        ("infnan", OverflowMode.INF_NAN),
        ("INF/NAN", OverflowMode.INF_NAN),
        (OverflowMode.SATURATION, OverflowMode.SATURATION),
        (OverflowMode.INF_NAN, OverflowMode.INF_NAN),
    ],
)
def test_explicit_mode_any_case(given, expected):
    assert resolve_overflow_mode(given) is expected


def test_explicit_argument_beats_environment(monkeypatch):
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "1")
    assert resolve_overflow_mode("saturation") is OverflowMode.SATURATION
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    assert resolve_overflow_mode("inf_nan") is OverflowMode.INF_NAN


@pytest.mark.parametrize(
    ("env", "expected"), [("1", OverflowMode.INF_NAN), ("0", OverflowMode.SATURATION)]
)
def test_auto_reads_environment(monkeypatch, env, expected):
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", env)
    assert resolve_overflow_mode() is expected
    assert resolve_overflow_mode("AUTO") is expected
    assert resolve_overflow_mode(OverflowMode.AUTO) is expected


@pytest.mark.parametrize("bad", ["yes", "2", "true", ""])
def test_bad_environment_value_names_variable_and_value(monkeypatch, bad):
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", bad)
    with pytest.raises(ValueError) as err:
        resolve_overflow_mode("auto")
    assert "INF_NAN_MODE_ENABLE" in str(err.value)
    assert repr(bad) in str(err.value)


def test_default_is_inf_nan():
    assert resolve_overflow_mode() is OverflowMode.INF_NAN


@pytest.mark.parametrize("bad", ["saturate", "ieee", "", 1, None])
def test_unknown_mode_is_rejected(bad):
    with pytest.raises(ValueError) as err:
        resolve_overflow_mode(bad)
    message = str(err.value)
    assert "overflow_mode" in message
    assert repr(bad) in message
    for valid in ("saturation", "inf_nan", "auto"):
        assert valid in message


def _records(caplog):
    return [r for r in caplog.records if r.name == "npu_lossscale"]


def test_resolution_logged_once_per_mode_and_source(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="npu_lossscale")
    resolve_overflow_mode()
    resolve_overflow_mode()
    assert len(_records(caplog)) == 1
    assert "inf_nan" in _records(caplog)[0].getMessage()
    assert "default" in _records(caplog)[0].getMessage()

    resolve_overflow_mode("SATURATION")
    resolve_overflow_mode("saturation")
    assert len(_records(caplog)) == 2
    assert "saturation" in _records(caplog)[1].getMessage()
    assert "explicit" in _records(caplog)[1].getMessage()

    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    resolve_overflow_mode()
    resolve_overflow_mode()
    assert len(_records(caplog)) == 3
    assert "INF_NAN_MODE_ENABLE" in _records(caplog)[2].getMessage()
    assert all(r.levelno == logging.INFO for r in _records(caplog))


# The Ascend runtime cannot run here. These tests put a stand-in pyACL (and adapter package) on
# sys.path so the lookup logic is exercised: which modules are required and how their answer is
# read. Whether the real pyACL returns these values is only checkable on an Ascend host.


def _install_fake_runtime(tmp_path, monkeypatch, body: str) -> None:
    (tmp_path / "npu_bridge").mkdir()
    (tmp_path / "npu_bridge" / "__init__.py").write_text("")
    (tmp_path / "acl").mkdir()
    (tmp_path / "acl" / "__init__.py").write_text(
        "class _Rt:\n    def get_device_sat_mode(self):\n" + body + "\nrt = _Rt()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("acl", "npu_bridge"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("        return 0", OverflowMode.SATURATION),
        ("        return 1", OverflowMode.INF_NAN),
        ("        return (0, 0)", OverflowMode.SATURATION),
    ],
)
def test_runtime_setting_beats_environment(tmp_path, monkeypatch, caplog, body, expected):
    caplog.set_level(logging.INFO, logger="npu_lossscale")
    _install_fake_runtime(tmp_path, monkeypatch, body)
    other = "0" if expected is OverflowMode.INF_NAN else "1"
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", other)
    assert resolve_overflow_mode() is expected
    assert "runtime" in _records(caplog)[-1].getMessage()


@pytest.mark.parametrize(
    "body",
    ["        raise RuntimeError('no device')", "        return 7", "        return (1, 507000)"],
)
def test_runtime_trouble_falls_through_to_environment(tmp_path, monkeypatch, body):
    _install_fake_runtime(tmp_path, monkeypatch, body)
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    assert resolve_overflow_mode() is OverflowMode.SATURATION
