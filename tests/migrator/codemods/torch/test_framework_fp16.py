"""A script that hands fp16 to a training framework (DeepSpeed, Lightning, accelerate, Hugging
Face's Trainer) names no scaler the port could rewrite: it is left as it is with one warning per
framework, at the first call that asks for fp16, saying so outright where a literal asks and
spelling out the condition where the file computes the value or the command line gives it.
Literals that ask for bf16 or fp32 (also through a local name), DeepSpeed with no optimizer, a
script that never trains (it predicts or generates) and a project's own `Trainer` get none; a
framework that hands its loop to DeepSpeed is warned in DeepSpeed's words. Through the real CLI;
every file stays byte-identical."""

from __future__ import annotations

import pytest
from cli_runner import MIGRATOR_FIXTURES, findings_of, only_warning, port_fixture_tree

FIXTURE = MIGRATOR_FIXTURES / "framework_fp16"
RULE = "torch-framework-loss-scale"


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return port_fixture_tree(tmp_path_factory.mktemp("framework_fp16"), FIXTURE)


def _warning_at(ported: dict, name: str, text: str) -> str:
    """The message of the file's one finding, checked to be this rule's warning at `text`."""
    return only_warning(ported, FIXTURE, name, text, RULE)


def test_lightning_asked_for_16_is_warned_once_at_its_first_fp16_trainer(ported) -> None:
    # the bf16 Trainer above it is passed over; the later "16-mixed" one adds no second warning
    message = _warning_at(ported, "lightning_trainer.py", "precision=16,")
    assert message.startswith("`pl.Trainer(precision=16)` trains in 16-bit mixed precision, and")
    assert "Lightning then scales the loss with a torch GradScaler" in message
    assert "scaler=npu_lossscale.torch.GradScaler()" in message  # its plugin takes one


def test_a_subclass_of_lightning_lite_in_fp16(ported) -> None:
    message = _warning_at(ported, "lightning_lite.py", "Lite(devices=1")
    assert message.startswith(
        "`Lite(precision=16)` trains in 16-bit mixed precision, and Lightning"
    )


def test_precision_chosen_by_a_test_names_the_test(ported) -> None:
    message = _warning_at(ported, "fabric_chosen.py", "Fabric(precision=")
    assert "mixed precision when `torch.cuda.is_available()` holds, and Lightning" in message


def test_a_trainer_from_the_command_line_names_its_flag(ported) -> None:
    # the file spells no `precision` outside the later override, whose fp32 adds nothing
    message = _warning_at(ported, "lightning_argparse.py", "from_argparse_args(parser")
    assert "when the command line's `--precision` asks for it" in message


def test_lightnings_command_line_tool_names_its_flag(ported) -> None:
    # LightningCLI fits by itself: the script spells no training, and is warned all the same
    message = _warning_at(ported, "lightning_cli.py", "LightningCLI(LitModel")
    assert message.startswith("`LightningCLI(...)` trains in 16-bit mixed precision when the ")
    assert "command line's `--trainer.precision` (or its config file) asks for it" in message


def test_a_trainer_given_keywords_names_the_mapping(ported) -> None:
    message = _warning_at(ported, "lightning_kwargs.py", "Trainer(**vars(args))")
    assert message.startswith("`Trainer(...)` trains in 16-bit mixed precision when `**vars(args)`")


def test_hugging_faces_parser_of_its_arguments_names_the_flag(ported) -> None:
    # the script's own TrainingArguments subclass stands for its base
    message = _warning_at(ported, "hf_argument_parser.py", "HfArgumentParser((")
    assert "when the command line's `--fp16` asks for it, and Hugging Face's Trainer" in message


def test_a_trl_config_asking_for_fp16(ported) -> None:
    message = _warning_at(ported, "trl_config.py", "SFTConfig(")
    assert message.startswith("`SFTConfig(fp16=True)` trains in 16-bit mixed precision,")


def test_lightning_under_deepspeed_is_told_of_deepspeeds_scaler(ported) -> None:
    message = _warning_at(ported, "lightning_deepspeed.py", "precision=16")
    assert "and DeepSpeed (under Lightning) then scales the loss itself" in message
    assert "looks for inf/NaN only" in message and "MixedPrecision" not in message


def test_a_computed_precision_names_the_value(ported) -> None:
    message = _warning_at(ported, "accelerate_loop.py", "Accelerator(mixed_precision=")
    assert "when `args.mixed_precision` asks for it, and accelerate then scales" in message
    assert "accelerate takes no scaler object" in message


def test_a_flag_choosing_between_a_value_and_no_names_both(ported) -> None:
    message = _warning_at(ported, "accelerate_amp_flag.py", "accelerate.Accelerator(")
    assert "when `amp` holds and `kind` asks for it" in message


def test_keywords_unpacked_from_a_dict_literal_are_read(ported) -> None:
    message = _warning_at(ported, "accelerate_kwargs_fp16.py", "Accelerator(**SETTINGS)")
    assert message.startswith("`Accelerator(mixed_precision='fp16')` trains in 16-bit mixed")


def test_accelerate_told_nothing_takes_its_precision_from_the_launcher(ported) -> None:
    message = _warning_at(ported, "accelerate_kwargs.py", "Accelerator(**accelerator_kwargs)")
    assert message.startswith("`Accelerator(...)` trains in 16-bit mixed precision when ")
    assert "`accelerate launch --mixed_precision fp16` or `accelerate config` asks" in message


def test_hugging_faces_arguments_asking_for_fp16(ported) -> None:
    message = _warning_at(ported, "hf_arguments.py", "fp16=True")
    assert message.startswith("`TrainingArguments(fp16=True)` trains in 16-bit mixed precision,")
    assert "Hugging Face's Trainer then scales" in message


def test_deepspeed_with_fp16_in_its_dict_config_is_warned_for_saturation_mode(ported) -> None:
    message = _warning_at(ported, "deepspeed_dict.py", "deepspeed.initialize(")
    assert message.startswith("`deepspeed.initialize(...)` trains in fp16, and DeepSpeed")
    assert "looks for inf/NaN only" in message and "saturation mode" in message
    assert "`deepspeed_npu`" in message


@pytest.mark.parametrize("name", ["deepspeed_args.py", "deepspeed_edited.py"])
def test_deepspeed_with_a_config_it_cannot_read_is_warned_with_the_condition(
    ported, name: str
) -> None:
    message = _warning_at(ported, name, "deepspeed.initialize(")
    assert (
        "trains in fp16 when its config (a file or a value built elsewhere) enables it" in message
    )


@pytest.mark.parametrize("name", ["lightning_bf16.py", "deepspeed_bf16.py", "own_trainer.py"])
def test_bf16_fp32_inference_and_a_projects_own_trainer_get_nothing(ported, name: str) -> None:
    assert findings_of(ported, name) == []


@pytest.mark.parametrize("name", [p.name for p in sorted(FIXTURE.glob("*.py"))])
def test_every_file_is_left_byte_identical_and_warned_again(ported, name: str) -> None:
    assert (ported["out"] / name).read_bytes() == (FIXTURE / name).read_bytes()
    assert ported["again"].returncode == 0
    assert ported["again"].stderr.count(f": {RULE}: ") == 17


def test_a_file_that_does_not_parse_is_left_to_the_full_pass() -> None:
    """The byte test passes, the parse fails: no site here (the CLI reports the syntax error)."""
    from migrator.selection import framework_fp16

    broken = b"import deepspeed\nengine = deepspeed.initialize(model=model, config={\n"
    assert framework_fp16.might_use(broken)
    assert framework_fp16.sites(broken) == []
