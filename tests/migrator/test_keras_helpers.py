"""Which functions of a run's file set TF_USE_LEGACY_KERAS, and whether every call surely sets it
to 1 (migrator.selection.keras_helpers): the fact another file's Keras port decides from."""

from __future__ import annotations

import pytest

from migrator.selection.keras_helpers import KerasHelper, legacy_keras_helpers


def _helpers(body: str) -> set[KerasHelper]:
    source = "import os\n\n\ndef choose(flag=None):\n" + body
    return legacy_keras_helpers("pkg/env_utils.py", source.encode())


@pytest.mark.parametrize(
    "body",
    [
        '    os.environ["TF_USE_LEGACY_KERAS"] = "1"\n',
        '    os.environ.setdefault("TF_USE_LEGACY_KERAS", "true")\n',
        '    os.putenv("TF_USE_LEGACY_KERAS", "1")\n',
        '    os.environ.update({"TF_USE_LEGACY_KERAS": "1"})\n',
        '    os.environ.update(TF_USE_LEGACY_KERAS="True")\n',
    ],
)
def test_a_setting_every_call_runs_pins_keras_2(body: str) -> None:
    assert _helpers(body) == {KerasHelper("env_utils", "choose", "pkg/env_utils.py:5")}


@pytest.mark.parametrize(
    ("body", "unsure"),
    [
        ('    if flag:\n        os.environ["TF_USE_LEGACY_KERAS"] = "1"\n', "only in a branch"),
        ('    os.environ["TF_USE_LEGACY_KERAS"] = flag\n', "to a value chosen at run time"),
        (
            '    os.environ["TF_USE_LEGACY_KERAS"] = "1"\n'
            '    os.environ["TF_USE_LEGACY_KERAS"] = "0"\n',
            "to 1 and to 0",
        ),
    ],
)
def test_a_setting_not_every_call_runs_is_unsure(body: str, unsure: str) -> None:
    (helper,) = _helpers(body)
    assert helper.unsure == unsure


@pytest.mark.parametrize(
    "body",
    [
        '    os.environ["TF_USE_LEGACY_KERAS"] = "0"\n',  # Keras 3 stays Keras 3
        '    return os.environ.get("TF_USE_LEGACY_KERAS")\n',  # a read
        '    print("set TF_USE_LEGACY_KERAS=1 yourself")\n',  # a message
    ],
)
def test_what_does_not_choose_keras_2_is_no_helper(body: str) -> None:
    assert _helpers(body) == set()


def test_an_init_module_is_named_by_its_package() -> None:
    source = b'import os\ndef f():\n    os.environ["TF_USE_LEGACY_KERAS"] = "1"\n'
    (helper,) = legacy_keras_helpers("proj/envs/__init__.py", source)
    assert (helper.module, helper.function) == ("envs", "f")
