"""Every API spelling in the registry reaches the codemods: no earlier stage skips its file.

For each spelling the TF1/Keras and torch ports recognise (checked against the codemods' own name
tables first), small real sources that import and use it go through the real byte pre-filter (the
whole-file gate and the port's own gate) and the real `ast` triage. A spelling the registry gained
without a trigger to match would fail here; the derivation that prevents it is checked too.
"""

from __future__ import annotations

import pytest

from migrator import registry
from migrator.codemods.shared import api
from migrator.codemods.torch import names
from migrator.selection import prefilter, triage


def _sources(spelling: str) -> list[str]:
    """Three ways a script names the API: a from-import, a module import, an aliased root."""
    module, _, leaf = spelling.rpartition(".")
    root, _, rest = spelling.partition(".")
    return [
        f"from {module} import {leaf}\n\nx = {leaf}()\n",
        f"import {module}\n\nx = {spelling}()\n",
        f"import {root} as fw\n\nx = fw.{rest}()\n",
    ]


def _reaches_the_codemods(source: str, port_gate) -> bool:
    data = source.encode()
    return (
        prefilter.might_need_migration(data) and port_gate(data) and triage.verdict(data) == "full"
    )


@pytest.mark.parametrize("spelling", registry.tf_spellings())
def test_every_tf_and_keras_spelling_reaches_the_tf_ports(spelling: str):
    name = api.canonical(spelling)
    assert api.classify(name) is not None or api.is_policy_setter(name), spelling
    for source in _sources(spelling):
        assert _reaches_the_codemods(source, prefilter.might_need_loss_scale_port), source


@pytest.mark.parametrize("spelling", registry.torch_spellings())
def test_every_torch_spelling_reaches_the_torch_port(spelling: str):
    known = names.classify(spelling) is not None
    assert known or names.foreign(spelling) or names.wrapped(spelling), spelling
    for source in _sources(spelling):
        assert _reaches_the_codemods(source, prefilter.might_need_torch_port), source


@pytest.mark.parametrize(
    "leaf", (*registry.TF_CONTRIB_CLASSES, *registry.TF_CORE_NAMES, registry.TORCH_SCALER)
)
def test_an_api_class_re_exported_by_a_user_module_reaches_the_codemods(leaf: str):
    source = f"from utils import {leaf}\n\nx = {leaf}()\n"
    assert _reaches_the_codemods(source, lambda data: True), source


def test_the_global_step_move_sees_optimizer_classes_and_hand_made_updates():
    method = f"class Opt(object):\n    def {registry.STEP_METHOD}(self, grads):\n        pass\n"
    assert prefilter.might_need_migration(method.encode())
    for step in registry.STEP_NAMES:
        for call in registry.STEP_CALL_PREFIXES:
            update = f"import tensorflow as tf\n\nop = {step}.{call}({step} + 1)\n"
            assert prefilter.might_need_migration(update.encode()), update
            assert triage.verdict(update.encode()) == "step", update


def test_a_spelling_without_a_trigger_brings_its_own():
    # Without the derivation this spelling would be skipped by both gates...
    unknown = "tensorflow.experimental.ScaleKeeper"
    for source in _sources(unknown):
        assert not prefilter.might_need_migration(source.encode())
    # ...with it, its last part becomes a trigger, while a covered spelling adds none.
    words = registry.triggers([*registry.tf_spellings(), unknown], registry.TF_MARKERS)
    assert words[-1] == "ScaleKeeper"
    assert registry.triggers(registry.tf_spellings(), registry.TF_MARKERS) == words[:-1]


def test_the_triggers_are_the_registry_s():
    words = registry.triggers(registry.tf_spellings(), registry.TF_MARKERS)
    assert prefilter.LOSS_SCALE_TRIGGERS == tuple(w.encode() for w in words)
    assert set(words) <= triage.NAME_FRAGMENTS


def test_no_registry_name_is_bound_twice():
    # One module holds spellings and rule ids: a rule id named like a spelling would silently
    # replace it (TF_DYNAMIC_LOSS_SCALE once did, and DynamicLossScale went unported).
    import ast

    tree = ast.parse(open(registry.__file__, encoding="utf-8").read())
    bound = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
    assert sorted({n for n in bound if bound.count(n) > 1}) == []


@pytest.mark.parametrize("spelling", registry.tf_spellings())
def test_each_core_and_contrib_class_keeps_its_own_kind(spelling: str):
    module, _, leaf = spelling.rpartition(".")
    if module in registry.TF_CORE_MODULES and leaf in registry.TF_CORE_NAMES:
        assert api.classify(spelling) is not api.Kind.UNPORTED, spelling
