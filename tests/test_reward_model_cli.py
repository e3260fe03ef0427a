"""The reward-model command line speaks TRL: RewardConfig's options, recipes, datasets."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from pipeline.options import UsageError
from pipeline.reward_model.cli import main

BASIC = ["--base", "b", "--pairs", "pairs.jsonl", "--output_dir", "out"]


def parse(*argv: str):
    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl
    from pipeline.reward_model.config import parse_reward_model_config

    return parse_reward_model_config(list(argv))


def test_the_options_are_reward_configs_own_from_the_projects_defaults():
    import torch
    from trl import RewardConfig

    from pipeline.reward_model.config import RewardModelArguments

    options, args = parse(*BASIC)
    assert options == RewardModelArguments(model_name_or_path="b", pairs="pairs.jsonl")
    assert isinstance(args, RewardConfig) and args.output_dir == "out"
    defaults = {
        "num_train_epochs": 1.0,
        "learning_rate": 1e-4,
        "per_device_train_batch_size": 16,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.05,
        "save_strategy": "no",
        "logging_strategy": "no",
        "report_to": [],
        "seed": 0,
        "max_length": 1024,
        "disable_tqdm": False,
        "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    }
    assert {name: getattr(args, name) for name in defaults} == defaults
    # A value the user gives wins over the project's default, and every RewardConfig
    # field is reachable.
    _, args = parse(
        *BASIC, "--num_train_epochs", "3", "--seed", "42", "--lr_scheduler_type", "linear",
        "--save_strategy", "epoch", "--center_rewards_coefficient", "0.01",
        "--gradient_checkpointing", "false", "--report_to", "tensorboard", "--max_length", "64",
    )  # fmt: skip
    assert (args.num_train_epochs, args.seed, args.lr_scheduler_type, args.save_strategy) == (
        3.0,
        42,
        "linear",
        "epoch",
    )
    assert args.center_rewards_coefficient == 0.01 and args.max_length == 64
    assert args.gradient_checkpointing is False and args.report_to == ["tensorboard"]


def test_a_recipe_with_a_command_line_override(tmp_path):
    recipe = tmp_path / "rm.yaml"
    recipe.write_text(
        "base: runs/tiny/final\npairs: pairs.jsonl\noutput_dir: runs/rm\nnum_train_epochs: 12\n"
        "learning_rate: 3.0e-3\nper_device_train_batch_size: 64\nheldout_fraction: 0.2\n"
    )
    options, args = parse("--config", str(recipe), "--learning_rate", "1e-3", "--margin", "true")
    assert (
        options.model_name_or_path,
        options.pairs,
        options.heldout_fraction,
        options.margin,
    ) == (
        "runs/tiny/final",
        "pairs.jsonl",
        0.2,
        True,
    )
    assert (args.output_dir, args.num_train_epochs, args.per_device_train_batch_size) == (
        "runs/rm",
        12,
        64,
    )
    assert args.learning_rate == 1e-3  # the command line wins over the recipe
    recipe.write_text(recipe.read_text() + "epochs: 3\n")
    with pytest.raises(UsageError, match=r"unknown option\(s\) in the recipe \(epochs\)"):
        parse("--config", str(recipe))


@pytest.mark.parametrize(
    "argv, message",
    [
        # The options the command had before it spoke TRL: one spelling each now.
        ([*BASIC, "--epochs", "3"], "unknown option(s) (--epochs)"),
        ([*BASIC, "--batch_size", "8"], "unknown option(s) (--batch_size)"),
        ([*BASIC, "--quiet"], "unknown option(s) (--quiet)"),
        ([*BASIC, "--output", "runs/rm"], "unknown option(s) (--output)"),
        ([*BASIC, "--max_len", "64"], "unknown option(s) (--max_len)"),  # no abbreviations
        (["--base", "b", "--pairs", "p"], "the following arguments are required: --output_dir"),
    ],
)
def test_an_unknown_option_is_refused_by_name(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--from_run", "runs/x"], "give exactly one of --pairs, --from_run and --dataset_name"),
        (["--heldout_fraction", "1"], "--heldout_fraction must be in [0, 1), got 1.0"),
        (["--num_train_epochs", "0"], "--num_train_epochs must be a finite number > 0 (0.0)"),
        (["--lora_r", "0"], "--lora_r must be > 0, got 0"),
        (
            ["--eval_strategy", "epoch", "--heldout_fraction", "0"],
            "--eval_strategy evaluates the held-out pairs, and none are held out",
        ),
    ],
)
def test_a_bad_value_is_named_and_trains_nothing(tmp_path, extra, message, capsys):
    argv = ["--base", "b", "--pairs", "p.jsonl", "--output_dir", str(tmp_path / "rm"), *extra]
    assert main(argv) == 2
    assert f"error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


def test_reward_config_options_reach_the_trainer(tiny_model_dir, tmp_path):
    """Conversational pairs from a parquet file, RewardConfig options on the command line:
    the trainer's own TensorBoard record holds them, and the saved model scores a run's
    completions (text or assistant messages) exactly as training scored the held-out pairs."""
    from datasets import Dataset
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeline.reward_model.pairs import read_dataset, split_by_prompt
    from pipeline.reward_model.signals import RewardModel

    rows = [
        {
            "prompt": [{"role": "user", "content": f"{a}+1"}],
            "chosen": [{"role": "assistant", "content": f"<answer>{a + 1}</answer>"}],
            "rejected": [{"role": "assistant", "content": "no"}],
        }
        for a in range(30)
    ]
    data = tmp_path / "pairs.parquet"
    Dataset.from_list(rows).to_parquet(data)
    out = tmp_path / "rm"
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(
            [
                "--dataset_name", str(data), "--base", tiny_model_dir, "--output_dir", str(out),
                "--per_device_train_batch_size", "8", "--heldout_fraction", "0.2",
                "--center_rewards_coefficient", "0.01", "--gradient_checkpointing", "false",
                "--max_length", "64", "--report_to", "tensorboard",
                "--logging_strategy", "steps", "--logging_steps", "1", "--disable_tqdm", "true",
            ]
        )  # fmt: skip
    assert code == 0
    last = stdout.getvalue().strip().splitlines()[-1]
    assert last.startswith("heldout_pair_accuracy: ")
    # Training leaves transformers' verbosity as it found it: left at error, it turned on
    # the next TrainingArguments' disable_tqdm in the same process (a CI failure).
    assert hf_logging.get_verbosity() == verbosity

    [logs] = (out / "runs").iterdir()  # report_to and logging_* reached the trainer
    events = EventAccumulator(str(logs), size_guidance={"tensors": 0})
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"]
    [text] = events.Tensors("args/text_summary")  # the args RewardTrainer ran with
    ran_with = json.loads(text.tensor_proto.string_val[0].decode())
    assert ran_with["center_rewards_coefficient"] == 0.01
    assert ran_with["gradient_checkpointing"] is False and ran_with["max_length"] == 64
    assert (ran_with["num_train_epochs"], ran_with["lr_scheduler_type"]) == (1.0, "cosine")
    info = json.loads((out / "reward_model.json").read_text())
    assert info["reward_config"]["center_rewards_coefficient"] == 0.01
    assert info["options"]["dataset_name"] == str(data)

    # One encoding at training and at scoring time, messages or text alike.
    model = RewardModel(str(out), max_length=64)
    _, held = split_by_prompt(read_dataset(str(data)), 0.2, seed=0)
    assert len(held) == info["heldout_pairs"] == 6
    prompts = [p.prompt for p in held]
    as_text = [p.chosen[0]["content"] for p in held]
    assert [model.encode(p, c) for p, c in zip(prompts, as_text)] == [
        model.encode(p.prompt, p.chosen) for p in held
    ]
    chosen = model.raw_scores(prompts, [p.chosen for p in held])
    rejected = model.raw_scores(prompts, [p.rejected for p in held])
    wins = [1.0 if c > r else 0.5 if c == r else 0.0 for [c], [r] in zip(chosen, rejected)]
    assert sum(wins) / len(wins) == pytest.approx(info["heldout_pair_accuracy"])
    assert last == f"heldout_pair_accuracy: {info['heldout_pair_accuracy']:.4f}"
    assert (out / "model.safetensors").exists() and not out.with_name(".rm.partial").exists()
