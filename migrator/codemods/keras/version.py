"""Which Keras a file's Keras port assumes, from what the script runs on, and the note saying why.

`npu_lossscale.keras.LossScaleOptimizer` is resolved when it is first imported: Keras 2's class
on TF 2.6-2.15 and under TF_USE_LEGACY_KERAS=1, Keras 3's on TF 2.16+. That is right for a
script whose Keras is whatever its TensorFlow ships, and for one whose Keras 2 optimizers
(`optimizers.legacy`, TensorFlow Addons, the experimental wrapper) only run where the process is
Keras 2 anyway. It is wrong where the script itself chooses Keras 2 after our import ran:

- it imports `tf_keras` (Keras 2 as a package, whatever TF_USE_LEGACY_KERAS says), or
- it sets TF_USE_LEGACY_KERAS to "1" itself (at the top, or in a helper function it calls), which
  TensorFlow reads when `tf.keras` is first touched -- after the file's imports, or
- it calls a function another file of the run defines that sets it to "1" on every call
  (`migrator.selection.keras_helpers`).

Those files import Keras 2's class by its module, `npu_lossscale.keras.keras2`. A file that sets
TF_USE_LEGACY_KERAS to a value chosen at run time is left: which Keras it runs is not known. A
helper of another file that sets it only in a branch (or to a run-time value) pins nothing: the
port names the class resolved at import, as for a file that sets nothing, and the note says why.
A helper in a file not given to the run is not seen at all.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from migrator.codemods.shared import api
from migrator.codemods.shared.context import FileContext
from migrator.selection.keras_helpers import KerasHelper

# Keras 2's class by its module, for files that pin Keras 2 themselves.
KERAS_2_TARGET = "keras.keras2.LossScaleOptimizer"
_RESOLVES = (
    f"{api.KERAS_MODULE}.LossScaleOptimizer resolves to Keras 2's class where the process runs "
    "Keras 2 (TF 2.6-2.15's tf.keras, or TF_USE_LEGACY_KERAS=1 with tf_keras installed) and to "
    "Keras 3's on TF 2.16+"
)

_READ = (
    "with which tf.keras is tf_keras, Keras 2, on TF 2.16+ (TensorFlow reads it when tf.keras "
    "is first used, after the file's imports)"
)


@dataclasses.dataclass(frozen=True)
class KerasVersion:
    """The Keras a file's port assumes: `target` is the class the port names, `note` what the
    report says about it, `problem` why the file cannot be ported (then nothing else counts)."""

    target: str
    note: str
    problem: str | None = None
    keras_2: bool = False  # Keras 2 surely: an ambiguous positional call binds in its order


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the file shows: where it names tf_keras, where it sets TF_USE_LEGACY_KERAS (and to
    what: True for "1"/"true", False for "0", None when chosen at run time), and the first
    Keras-2-only construct among its wrapper calls (line, what); and its calls of other files'
    functions that set TF_USE_LEGACY_KERAS."""

    tf_keras: cst.CSTNode | None
    legacy_settings: tuple[tuple[cst.CSTNode, bool | None], ...]
    keras_2_use: tuple[int, str] | None
    helper_calls: tuple[tuple[cst.CSTNode, KerasHelper], ...] = ()


def decide(file: FileContext, evidence: Evidence) -> KerasVersion:
    """The Keras assumed for the file's port, with the reason a reviewer reads."""
    settings = [(file.line(node), value) for node, value in evidence.legacy_settings]
    runtime = [line for line, value in settings if value is None]
    if runtime:
        return KerasVersion(
            api.KERAS_OPTIMIZER,
            "",
            problem=(
                f"the file sets TF_USE_LEGACY_KERAS to a value chosen at run time (line "
                f"{runtime[0]}), so whether its tf.keras is Keras 2 (tf_keras) or Keras 3 is not "
                "known before it runs; import npu_lossscale.keras.keras2's LossScaleOptimizer "
                "(Keras 2) or npu_lossscale.keras.optimizer's (Keras 3) to match, by hand"
            ),
        )
    pinned = _pinned(file, evidence, settings)
    if pinned is not None:
        return KerasVersion(
            KERAS_2_TARGET,
            f"Keras 2 assumed: {pinned}; so the port imports Keras 2's class from "
            f"{api.KERAS_MODULE}.keras2 by name (on TF 2.16+ it wraps tf_keras optimizers, and "
            "needs tf_keras installed), not the class chosen when npu_lossscale.keras is imported",
            keras_2=True,
        )
    unsure = _unsure_helper(file, evidence)
    if evidence.keras_2_use is not None:
        line, what = evidence.keras_2_use
        return KerasVersion(
            api.KERAS_OPTIMIZER,
            f"Keras 2 assumed: line {line} uses {what}, which runs only on Keras 2; "
            f"{_RESOLVES}, so it is Keras 2's wherever this script runs{unsure}",
            keras_2=True,
        )
    return KerasVersion(
        api.KERAS_OPTIMIZER,
        "Keras 2 or 3, whichever the installed TensorFlow ships: nothing in the file pins one "
        f"(tf.keras/keras, no tf_keras, no TF_USE_LEGACY_KERAS); {_RESOLVES}, and every argument "
        f"is passed so that both read it the same{unsure}",
    )


def _pinned(
    file: FileContext, evidence: Evidence, settings: list[tuple[int, bool | None]]
) -> str | None:
    """Why the file runs Keras 2 whatever its TensorFlow ships, or None."""
    legacy = [line for line, value in settings if value]
    if legacy:
        return f"the file sets TF_USE_LEGACY_KERAS=1 (line {legacy[0]}), {_READ}"
    for call, helper in evidence.helper_calls:
        if not helper.unsure:
            return (
                f"line {file.line(call)} calls `{helper.function}`, which sets "
                f"TF_USE_LEGACY_KERAS=1 ({helper.where}), {_READ}"
            )
    if evidence.tf_keras is not None:
        return f"the file uses tf_keras, Keras 2 as a package (line {file.line(evidence.tf_keras)})"
    return None


def _unsure_helper(file: FileContext, evidence: Evidence) -> str:
    """The note's last clause where the file calls another file's function that may set
    TF_USE_LEGACY_KERAS=1 (in a branch, or to a run-time value): not taken to pin Keras 2 (a
    helper that surely sets it was taken by `_pinned` before this is asked)."""
    if evidence.helper_calls:
        call, helper = evidence.helper_calls[0]
        return (
            f"; line {file.line(call)} calls `{helper.function}`, which sets "
            f"TF_USE_LEGACY_KERAS {helper.unsure} ({helper.where}), so Keras 2 is not assumed "
            "from it: where it does set it to 1 after npu_lossscale.keras is imported, import "
            f"LossScaleOptimizer from {api.KERAS_MODULE}.keras2 instead"
        )
    return ""
