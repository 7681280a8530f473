"""Which files a file that builds a tf.distribute strategy imports (the run-level fact that gives
their TF1 optimizers `has_strategy()`): the byte test, and the imports resolved as the plan
resolves them. The port of such a file, and its training under two replicas, are
codemods/tf1/test_real_shapes.py's."""

from __future__ import annotations

import pytest

from migrator.selection.strategy_importers import builds_strategy, strategy_importers
from migrator.sources.module_paths import Paths


@pytest.mark.parametrize(
    "line",
    [
        b"strategy = tf.distribute.MirroredStrategy()\n",
        b"s = contrib_distribute.OneDeviceStrategy (\n    '/gpu:0')\n",
        b"config = tf.estimator.RunConfig(train_distribute=make_strategy())\n",
        b"config = RunConfig(eval_distribute = strategy)\n",
    ],
)
def test_a_strategy_built_or_handed_to_an_estimator_counts(line: bytes) -> None:
    assert builds_strategy(b"import tensorflow as tf\n" + line)


@pytest.mark.parametrize(
    "line",
    [
        b"# strategy = tf.distribute.MirroredStrategy()\n",
        b"if tf.distribute.has_strategy():\n    pass\n",
        b"assert isinstance(s, tf.distribute.MirroredStrategy)\n",
        b"strategy = tf.distribute.get_strategy()\n",  # the one already in force, if any
    ],
)
def test_a_comment_a_question_or_a_type_test_does_not(line: bytes) -> None:
    assert not builds_strategy(b"import tensorflow as tf\n" + line)


def test_the_imports_of_a_strategy_file_resolve_to_the_runs_files() -> None:
    paths = Paths(
        [
            "proj/main.py",
            "proj/model.py",
            "proj/pkg/__init__.py",
            "proj/pkg/layers.py",
            "proj/pkg/losses.py",
            "proj/unused.py",
            "other/model.py",
        ]
    )
    main = (
        b"import tensorflow.compat.v1 as tf\n"
        b"import model\n"
        b"from pkg import layers\n"
        b"from .pkg.losses import focal\n"
        b"import main\n"
        b"strategy = tf.distribute.MirroredStrategy()\n"
    )
    assert strategy_importers([("proj/./main.py", main)], paths) == {
        ("proj/model.py", "proj/main.py"),  # the sibling, not other/model.py
        ("proj/pkg/__init__.py", "proj/main.py"),
        ("proj/pkg/layers.py", "proj/main.py"),
        ("proj/pkg/losses.py", "proj/main.py"),
    }  # neither the file itself nor a file it does not import
