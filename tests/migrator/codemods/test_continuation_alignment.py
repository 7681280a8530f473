"""A call whose opening bracket moves (a shorter or longer name) keeps its continuation lines
aligned with it; hanging indents, strings and tab-indented lines are left as they were.

Real CLI on real files in a temporary directory; the expected files were written by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from cli_runner import run_cli

TF_BEFORE = """\
import tensorflow as tf


def build(loss, global_step):
    manager = tf.contrib.mixed_precision.ExponentialUpdateLossScaleManager(init_loss_scale=2**32,
                                                                           incr_every_n_steps=1000,
                                                                           decr_every_n_nan_or_inf=2)
    opt = tf.train.AdamOptimizer(1e-3)
    opt = tf.contrib.mixed_precision.LossScaleOptimizer(opt,
                                                        manager)
    train_op = opt.minimize(loss,
                            var_list=None)
    train_op = tf.group(train_op, global_step.assign_add(1))
    return train_op
"""
TF_AFTER = """\
import tensorflow as tf
from npu_lossscale import ExponentialUpdateLossScaleManager, NPULossScaleOptimizer


def build(loss, global_step):
    manager = ExponentialUpdateLossScaleManager(init_loss_scale=2**32,
                                                incr_every_n_steps=1000,
                                                decr_every_n_nan_or_inf=2)
    opt = tf.train.AdamOptimizer(1e-3)
    opt = NPULossScaleOptimizer(opt,
                                manager)
    train_op = opt.minimize(loss,
                            var_list=None,
                            global_step=global_step)
"""
TORCH_BEFORE = '''\
import torch


def make(args):
    scaler = torch.cuda.amp.GradScaler(init_scale=2.**16,
                                       growth_interval=args.interval,
                                       enabled=bool(dict(a=1,
                                                         b=2)))
    below_one = torch.cuda.amp.GradScaler(init_scale=0.5,
                                          growth_interval=100)
    hanging = torch.cuda.amp.GradScaler(
        init_scale=1024,
    )
    text = """torch.cuda.amp.GradScaler(x,
                                    y)"""
    return scaler, below_one, hanging, text
'''
TORCH_AFTER = '''\
import npu_lossscale.torch


def make(args):
    scaler = npu_lossscale.torch.GradScaler(init_scale=2.**16,
                                            growth_interval=args.interval,
                                            enabled=bool(dict(a=1,
                                                              b=2)))
    below_one = npu_lossscale.torch.GradScaler(init_scale=0.5,
                                               growth_interval=100,
                                               min_loss_scale=0)
    hanging = npu_lossscale.torch.GradScaler(
        init_scale=1024,
    )
    text = """torch.cuda.amp.GradScaler(x,
                                    y)"""
    return scaler, below_one, hanging, text
'''


def _port(tmp_path: Path, text: str, newline: str = "\n") -> str:
    path = tmp_path / "script.py"
    path.write_bytes(text.replace("\n", newline).encode())
    proc = run_cli("--write", path)
    assert proc.returncode == 0, proc.stderr
    data = path.read_bytes().decode()
    ast.parse(data)
    return data


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_renamed_tf1_calls_keep_their_arguments_aligned(tmp_path: Path, newline: str) -> None:
    ported = _port(tmp_path, TF_BEFORE, newline)
    assert ported.startswith(TF_AFTER.replace("\n", newline))  # the moved step's note follows


def test_renamed_torch_scalers_keep_their_arguments_aligned(tmp_path: Path) -> None:
    # The nested call's own continuation follows its bracket; the added keyword (a scale below 1)
    # gets the same column; the hanging indent and the string's second line stay as they were.
    assert _port(tmp_path, TORCH_BEFORE) == TORCH_AFTER


def test_a_tab_indented_continuation_is_left_alone(tmp_path: Path) -> None:
    before = (
        "import torch\n\n\ndef make():\n"
        "\tscaler = torch.cuda.amp.GradScaler(init_scale=2.**16,\n"
        "\t                                   growth_interval=100)\n"
        "\treturn scaler\n"
    )
    ported = _port(tmp_path, before)
    assert "\tscaler = npu_lossscale.torch.GradScaler(init_scale=2.**16,\n" in ported
    assert "\t                                   growth_interval=100)\n" in ported


def test_calls_far_apart_in_a_file_of_repeated_lines_are_both_realigned(tmp_path: Path) -> None:
    # 1,500 lines of the same few continuation lines between two renamed calls: the old and new
    # files are matched up again after each difference, not confused by the repeats.
    head = "m{n} = tf.contrib.mixed_precision.FixedLossScaleManager("
    call = head + "1024,\n" + " " * len(head.format(n=1)) + "enable_overflow_check=True)\n"
    filler = "".join(
        f"def f{i}(x):\n    return some_call(x,\n                     {i % 3})\n"
        for i in range(500)
    )
    before = "import tensorflow as tf\n\n" + call.format(n=1) + filler + call.format(n=2)
    ported = _port(tmp_path, before)
    for n in (1, 2):
        assert (
            f"m{n} = FixedLossScaleManager(1024,\n"
            + " " * len(f"m{n} = FixedLossScaleManager(")
            + "enable_overflow_check=True)\n"
        ) in ported
    assert filler in ported
