"""Train a reward model on preference pairs with TRL's RewardTrainer.

The model is the base with a sequence-classification head (`num_labels=1`), trained with
TRL's Bradley–Terry loss −log σ(r_chosen − r_rejected − margin) under the `RewardConfig`
given (`pipeline.reward_model.config` parses it). Pairs are split by prompt into training
and held-out sets; the summary's `heldout_pair_accuracy` is the share of held-out pairs
whose chosen completion scored higher. Every pair is tokenized by `signals.encode_pair`,
the function that scores a run's completions, so the model scores the text it learned.

The output folder (`args.output_dir`) holds the model (or LoRA adapter), its tokenizer and
`reward_model.json` (calibration statistics that `pipeline.reward_model.signals` uses to
put scores into (0, 1), the accuracy, the options), plus whatever the trainer was asked to
write there (checkpoints, TensorBoard's `runs/`). It is written atomically.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from curriculum.atomic import atomic_folder
from pipeline.reward_model.pairs import Pair, split_by_prompt
from pipeline.reward_model.signals import INFO_FILE

if TYPE_CHECKING:
    from trl import RewardConfig

    from pipeline.reward_model.config import RewardModelArguments


def train_reward_model(
    pairs: list[Pair], options: RewardModelArguments, args: RewardConfig
) -> dict[str, Any]:
    """Train on `pairs`, save the model and its calibration to `args.output_dir`; returns
    the summary."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import RewardTrainer

    from pipeline.reward_model.signals import encode_pair

    output = args.output_dir
    train, heldout = split_by_prompt(pairs, options.heldout_fraction, args.seed)
    if not train:
        raise ValueError(
            "no training pairs left after holding out prompts; lower --heldout_fraction"
        )
    tokenizer = AutoTokenizer.from_pretrained(options.model_name_or_path, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def rows(subset: list[Pair]) -> Dataset:
        """Tokenized here, cut to max_length at the start: TRL's own filter drops nothing."""
        out = []
        for p in subset:
            row = {
                "chosen_ids": encode_pair(tokenizer, p.prompt, p.chosen, args.max_length),
                "rejected_ids": encode_pair(tokenizer, p.prompt, p.rejected, args.max_length),
            }
            if options.margin:
                row["margin"] = p.margin
            out.append(row)
        return Dataset.from_list(out)

    model = _new_reward_model(options, args, tokenizer)
    with atomic_folder(output) as staging:  # a kill leaves no half-written model
        # The user's options, unchanged, but for the folder: the trainer writes the staging
        # copy that becomes `output` (checkpoints, runs/ and the model alike).
        config = copy.copy(args)
        config.output_dir = str(staging)
        trainer = RewardTrainer(
            model=model,
            args=config,
            train_dataset=rows(train),
            eval_dataset=rows(heldout) if args.eval_strategy != "no" and heldout else None,
            processing_class=tokenizer,
        )
        result = trainer.train()
        summary = {
            "base": options.model_name_or_path,
            "objectives": ["reward"],
            **_calibration(trainer.model.eval(), tokenizer, train, heldout, args),
            "train_loss": result.training_loss,
            "use_lora": options.use_lora,
            "margin": options.margin,
            "options": asdict(options),
            # What RewardTrainer ran with: every RewardConfig field after its own checks.
            "reward_config": {**json.loads(trainer.args.to_json_string()), "output_dir": output},
        }
        trainer.save_model(str(staging))
        tokenizer.save_pretrained(staging)
        (staging / INFO_FILE).write_text(json.dumps(summary, indent=2))
    return summary


def _new_reward_model(options: RewardModelArguments, args: RewardConfig, tokenizer):
    """The base with a fresh one-output head (seeded: the same run gives the same model),
    LoRA-wrapped when asked."""
    import torch
    from transformers import AutoModelForSequenceClassification, set_seed
    from transformers.utils import logging as hf_logging

    set_seed(args.seed)  # the new head's initial weights
    verbosity = hf_logging.get_verbosity()
    # Quiet only for the load (a fresh head's "newly initialized weights" notice): left at
    # error, it would also turn on the next TrainingArguments' disable_tqdm in this process.
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            options.model_name_or_path,
            num_labels=1,
            trust_remote_code=False,
            dtype=torch.bfloat16 if args.bf16 else None,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.id2label, model.config.label2id = {0: "reward"}, {"reward": 0}
    if not options.use_lora:
        return model
    # Wrapped here rather than through RewardTrainer's peft_config, which casts the
    # trainable weights to bfloat16 even on a CPU.
    from peft import LoraConfig, TaskType, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            task_type=TaskType.SEQ_CLS,
            r=options.lora_r,
            lora_alpha=options.lora_alpha,
            target_modules="all-linear",
        ),
    )


def _calibration(model, tokenizer, train, heldout, args: RewardConfig) -> dict[str, Any]:
    """Held-out accuracy and calibration (the training pairs' where none are held out),
    scored exactly as signals.py scores a run."""
    from pipeline.reward_model.signals import encode_pair, score_ids

    check = heldout or train
    ids = [
        encode_pair(tokenizer, p.prompt, c, args.max_length)
        for p in check
        for c in (p.chosen, p.rejected)
    ]
    batch = args.per_device_eval_batch_size
    scores = [s[0] for s in score_ids(model, ids, tokenizer.pad_token_id, batch)]
    chosen, rejected = scores[0::2], scores[1::2]
    wins = [1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) or 1.0
    return {
        "calibration": {"mean": [mean], "std": [std], "source": "heldout" if heldout else "train"},
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        "mean_margin": sum(c - r for c, r in zip(chosen, rejected)) / len(chosen),
        "heldout_pair_accuracy": sum(wins) / len(wins) if heldout else None,
        "train_pair_accuracy": None if heldout else sum(wins) / len(wins),
    }
