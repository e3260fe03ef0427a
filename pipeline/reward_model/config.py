"""The reward-model command's options: RewardConfig's own, plus the project's few.

    python -m pipeline.reward_model --config rm.yaml --learning_rate 3e-3

Two dataclasses share one command line: TRL's `RewardConfig` (every TrainingArguments
option, plus `max_length`, `center_rewards_coefficient`, ...) and `RewardModelArguments`
(the base model, where the pairs come from, the held-out share, margins, LoRA). They are
parsed as `pipeline.run` parses its own (`pipeline.options`): a `--config` YAML recipe,
then command-line overrides, an unknown option refused by name, a bad value a one-line
UsageError. `--base` is the old spelling of `--model_name_or_path` (an alias, with a
notice).

Where RewardConfig's defaults differ from what a reward model on this project wants, the
parser starts from the project's (`project_defaults()`: 1 epoch, batch 16, a cosine
schedule with 5% warm-up, no checkpoints, no logging, seed 0, bf16 only on a CUDA GPU
with bf16); a value from the recipe or the command line reaches `RewardTrainer` unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PROG = "python -m pipeline.reward_model"
ALIASES = {"--base": ["--model_name_or_path"]}

_DEFAULTS: dict[str, Any] = {
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 16,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,
    "save_strategy": "no",  # the model is saved once, with its calibration, at the end
    "logging_strategy": "no",  # the console shows the progress bar and the summary only
    "seed": 0,
}


def project_defaults() -> dict[str, Any]:
    """The RewardConfig options whose project default differs from TRL's.

    bf16 only on a CUDA GPU that has it (None lets TRL choose it there unless fp16 is
    set), and the CPU when there is no CUDA GPU. The command line starts from these;
    in code, `RewardConfig(**{**project_defaults(), "output_dir": ..., ...})`.
    """
    import torch

    from pipeline.options import cuda_bf16

    return {
        **_DEFAULTS,
        "bf16": None if cuda_bf16() else False,
        "use_cpu": not torch.cuda.is_available(),
    }


@dataclass
class RewardModelArguments:
    """The project's additions to RewardConfig: base model, data source, held-out share, LoRA."""

    model_name_or_path: str = field(
        metadata={"help": "Base model: hub id or local folder (e.g. the SFT policy). Was --base."}
    )
    pairs: str | None = field(
        default=None,
        metadata={
            "help": "JSONL of preference pairs (any TRL preference format) and/or "
            "{prompt, completion, score} ratings."
        },
    )
    from_run: str | None = field(
        default=None,
        metadata={"help": "A pipeline.run output folder: pairs from its generations.jsonl."},
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A datasets dataset of preference pairs or ratings: a folder saved with "
            "save_to_disk, a .parquet/.json/.jsonl/.csv file, or a hub id."
        },
    )
    dataset_config: str | None = field(
        default=None,
        metadata={"help": "The dataset's configuration name (load_dataset's `name`)."},
    )
    dataset_train_split: str = field(
        default="train", metadata={"help": "The split of --dataset_name to read."}
    )
    heldout_fraction: float = field(
        default=0.1,
        metadata={"help": "Share of prompts held out for the accuracy and the calibration."},
    )
    margin: bool = field(
        default=False,
        metadata={
            "help": "Bradley–Terry with margins: a pair's 'margin', or the rating difference."
        },
    )
    use_lora: bool = field(
        default=False, metadata={"help": "Train a LoRA adapter (plus the head)."}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})

    def validate(self) -> None:
        """Reject a bad value, naming it."""
        sources = [
            f"--{name}"
            for name in ("pairs", "from_run", "dataset_name")
            if getattr(self, name) is not None
        ]
        if len(sources) != 1:
            raise ValueError(
                "give exactly one of --pairs, --from_run and --dataset_name"
                + (f", not {' and '.join(sources)}" if sources else "")
            )
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"--heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        for name in ("lora_r", "lora_alpha"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be > 0, got {getattr(self, name)}")


def reward_model_parser():
    """The command's TrlParser, as `--help` shows it (no machine-dependent defaults).

    Call after `activate_backend`: this imports trl.
    """
    from trl import RewardConfig

    from pipeline.options import options_parser

    return options_parser(
        (RewardModelArguments, RewardConfig), PROG, defaults=_DEFAULTS, required=("output_dir",)
    )


def parse_reward_model_config(argv: list[str]):
    """(RewardModelArguments, RewardConfig) from a recipe and overrides; UsageError on a bad
    value. Call after `activate_backend`: this imports trl.
    """
    from trl import RewardConfig

    from pipeline.options import UsageError, check_output_path, parse_options, usage_errors

    options, args = parse_options(
        (RewardModelArguments, RewardConfig),
        argv,
        prog=PROG,
        defaults=project_defaults(),
        required=("output_dir",),
        aliases=ALIASES,
    )
    with usage_errors():
        options.validate()
    check_output_path(args.output_dir, "--output_dir")
    for name in ("num_train_epochs", "learning_rate", "per_device_train_batch_size"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{name} must be a finite number > 0", value, "give a positive one")
    if args.max_length is not None and args.max_length < 1:
        raise UsageError("--max_length must be >= 1 (or None)", args.max_length, "e.g. 1024")
    if args.eval_strategy != "no" and options.heldout_fraction == 0:
        raise UsageError(
            "--eval_strategy evaluates the held-out pairs, and none are held out",
            "--heldout_fraction 0",
            "set --heldout_fraction > 0, or --eval_strategy no",
        )
    return options, args
