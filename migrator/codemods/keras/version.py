"""Which Keras a file's Keras port assumes, from what the script runs on, and the note saying why.

`npu_lossscale.keras.LossScaleOptimizer` is resolved when it is first imported: Keras 2's class
on TF 2.6-2.15 and under TF_USE_LEGACY_KERAS=1, Keras 3's on TF 2.16+. That is right for a
script whose Keras is whatever its TensorFlow ships, and for one whose Keras 2 optimizers
(`optimizers.legacy`, TensorFlow Addons, the experimental wrapper) only run where the process is
Keras 2 anyway. It is wrong where the script itself chooses Keras 2 after our import ran:

- it imports `tf_keras` (Keras 2 as a package, whatever TF_USE_LEGACY_KERAS says), or
- it sets TF_USE_LEGACY_KERAS to "1" itself (at the top, or in a helper function it calls), which
  TensorFlow reads when `tf.keras` is first touched -- after the file's imports.

Those files import Keras 2's class by its module, `npu_lossscale.keras.keras2`. A file that sets
TF_USE_LEGACY_KERAS to a value chosen at run time is left: which Keras it runs is not known.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from migrator.codemods.shared import api
from migrator.codemods.shared.context import FileContext

# Keras 2's class by its module, for files that pin Keras 2 themselves.
KERAS_2_TARGET = "keras.keras2.LossScaleOptimizer"
_RESOLVES = (
    f"{api.KERAS_MODULE}.LossScaleOptimizer resolves to Keras 2's class where the process runs "
    "Keras 2 (TF 2.6-2.15's tf.keras, or TF_USE_LEGACY_KERAS=1 with tf_keras installed) and to "
    "Keras 3's on TF 2.16+"
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
    Keras-2-only construct among its wrapper calls (line, what)."""

    tf_keras: cst.CSTNode | None
    legacy_settings: tuple[tuple[cst.CSTNode, bool | None], ...]
    keras_2_use: tuple[int, str] | None


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
    if evidence.keras_2_use is not None:
        line, what = evidence.keras_2_use
        return KerasVersion(
            api.KERAS_OPTIMIZER,
            f"Keras 2 assumed: line {line} uses {what}, which runs only on Keras 2; "
            f"{_RESOLVES}, so it is Keras 2's wherever this script runs",
            keras_2=True,
        )
    return KerasVersion(
        api.KERAS_OPTIMIZER,
        "Keras 2 or 3, whichever the installed TensorFlow ships: nothing in the file pins one "
        f"(tf.keras/keras, no tf_keras, no TF_USE_LEGACY_KERAS); {_RESOLVES}, and every argument "
        "is passed so that both read it the same",
    )


def _pinned(
    file: FileContext, evidence: Evidence, settings: list[tuple[int, bool | None]]
) -> str | None:
    """Why the file runs Keras 2 whatever its TensorFlow ships, or None."""
    legacy = [line for line, value in settings if value]
    if legacy:
        return (
            f"the file sets TF_USE_LEGACY_KERAS=1 (line {legacy[0]}), with which tf.keras is "
            "tf_keras, Keras 2, on TF 2.16+ (TensorFlow reads it when tf.keras is first used, "
            "after the file's imports)"
        )
    if evidence.tf_keras is not None:
        return f"the file uses tf_keras, Keras 2 as a package (line {file.line(evidence.tf_keras)})"
    return None
