"""Train a reward model on preference pairs with TRL's RewardTrainer.

The model is the base with a sequence-classification head (`num_labels=1`), trained with
TRL's Bradley–Terry loss −log σ(r_chosen − r_rejected − margin). Pairs are split by
prompt into training and held-out sets; the summary's `heldout_pair_accuracy` is the share
of held-out pairs whose chosen completion scored higher. The output folder holds the
model (or LoRA adapter), its tokenizer and `reward_model.json` (calibration statistics
that `pipeline.reward_model.signals` uses to put scores into (0, 1), the accuracy, the
settings). It is written atomically.
"""

from __future__ import annotations

import json
import math
import shutil
from typing import Any

from curriculum.atomic import atomic_folder
from pipeline.reward_model.pairs import Pair, split_by_prompt
from pipeline.reward_model.signals import INFO_FILE


def train_reward_model(
    pairs: list[Pair],
    base: str,
    output: str,
    *,
    use_lora: bool = False,
    lora_r: int = 16,
    lora_alpha: int = 32,
    margin: bool = False,
    epochs: float = 1.0,
    learning_rate: float = 1e-4,
    batch_size: int = 16,
    max_length: int = 1024,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Train on `pairs`, save the model and its calibration to `output`; returns the summary."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed
    from transformers.utils import logging as hf_logging
    from trl import RewardConfig, RewardTrainer

    from pipeline.reward_model.signals import encode_pair, score_ids

    train, heldout = split_by_prompt(pairs, heldout_fraction, seed)
    if not train:
        raise ValueError(
            "no training pairs left after holding out prompts; lower --heldout_fraction"
        )
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def rows(subset: list[Pair]) -> list[dict[str, Any]]:
        out = []
        for p in subset:
            row = {
                "chosen_ids": encode_pair(tokenizer, p.prompt, p.chosen, max_length),
                "rejected_ids": encode_pair(tokenizer, p.prompt, p.rejected, max_length),
            }
            if margin:
                row["margin"] = p.margin
            out.append(row)
        return out

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    hf_logging.set_verbosity_error()  # a fresh head's "newly initialized weights" notice
    set_seed(seed)  # the new head's initial weights: the same run gives the same model
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=1, trust_remote_code=False, dtype=torch.bfloat16 if bf16 else None
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.id2label, model.config.label2id = {0: "reward"}, {"reward": 0}
    if use_lora:
        # Wrapped here rather than through RewardTrainer's peft_config, which casts the
        # trainable weights to bfloat16 even on a CPU.
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                task_type=TaskType.SEQ_CLS,
                r=lora_r,
                lora_alpha=lora_alpha,
                target_modules="all-linear",
            ),
        )
    with atomic_folder(output) as staging:  # a kill leaves no half-written model
        config = RewardConfig(
            output_dir=str(staging / "trainer"),
            num_train_epochs=epochs,
            per_device_train_batch_size=batch_size,
            learning_rate=learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=0.05,
            max_length=None,  # encode_pair already cut the start of long texts
            bf16=bf16,
            use_cpu=not cuda,
            seed=seed,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",  # the console shows the progress bar and the summary only
            disable_tqdm=not progress,
        )
        trainer = RewardTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(rows(train)),
            processing_class=tokenizer,
        )
        result = trainer.train()
        model = trainer.model.eval()

        # Held-out accuracy and calibration, scored exactly as signals.py scores a run.
        check = heldout or train
        ids = [
            encode_pair(tokenizer, p.prompt, c, max_length)
            for p in check
            for c in (p.chosen, p.rejected)
        ]
        scores = [s[0] for s in score_ids(model, ids, tokenizer.pad_token_id, batch_size)]
        chosen, rejected = scores[0::2], scores[1::2]
        wins = [1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)]
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) or 1.0
        summary = {
            "base": base,
            "objectives": ["reward"],
            "calibration": {
                "mean": [mean],
                "std": [std],
                "source": "heldout" if heldout else "train",
            },
            "train_pairs": len(train),
            "heldout_pairs": len(heldout),
            "train_loss": result.training_loss,
            "mean_margin": sum(c - r for c, r in zip(chosen, rejected)) / len(chosen),
            "heldout_pair_accuracy": sum(wins) / len(wins) if heldout else None,
            "train_pair_accuracy": None if heldout else sum(wins) / len(wins),
            "use_lora": use_lora,
            "margin": margin,
        }
        trainer.save_model(str(staging))
        tokenizer.save_pretrained(staging)
        (staging / INFO_FILE).write_text(json.dumps(summary, indent=2))
        shutil.rmtree(staging / "trainer", ignore_errors=True)
    return summary
