"""Train a reward model from preference pairs or ratings with TRL's RewardTrainer.

    python -m pipeline.reward_model --pairs pairs.jsonl --base <model> --output runs/rm
    python -m pipeline.reward_model --from_run runs/x --base <model> --output runs/rm --use_lora true

The model is the base with a sequence-classification head (`num_labels=1`), trained with
TRL's Bradley–Terry loss −log σ(r_chosen − r_rejected − margin). Pairs are split by
prompt into training and held-out sets; the last line printed is
`heldout_pair_accuracy: X` (the share of held-out pairs whose chosen completion scored
higher). The output folder holds the model (or LoRA adapter), its tokenizer and
`reward_model.json` (calibration statistics that `pipeline.learned_rewards` uses to put
scores into (0, 1), the accuracy, the settings). It is written atomically.

Input, one JSON object a line:
    {"prompt": ..., "chosen": ..., "rejected": ..., "margin": 0.5}   # margin optional
    {"prompt": ..., "completion": ..., "score": 4}                   # a rating
A prompt is a string or a list of chat messages; completions are strings. Ratings of the
same prompt become pairs (every higher-rated completion against every lower-rated one).
`--from_run runs/x` reads the run's `generations.jsonl` instead: completions of the same
prompt, higher reward against lower; where a person added a `"rating"` (a number, higher
is better) to records of a prompt, those ratings are used for that prompt instead.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.learned_rewards import INFO_FILE
from rewards.generations_log import FILENAME as GENERATIONS_FILE
from rewards.pairwise import prompt_key

RATING_FIELD = "rating"
"""A person's score for a record of generations.jsonl (any numeric scale, higher is better)."""


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is better than `rejected` as a reply to `prompt`."""

    prompt: Any
    chosen: str
    rejected: str
    margin: float = 0.0


# Reading pairs ---------------------------------------------------------------------


def read_pairs(path: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a JSONL file of pairs and/or ratings; ValueError naming the bad line."""
    pairs, ratings = [], []
    for where, record in _records(path):
        if "chosen" in record or "rejected" in record:
            _require(where, record, ("prompt", "chosen", "rejected"))
            margin = record.get("margin", 0.0)
            pairs.append(
                Pair(
                    _prompt(where, record["prompt"]),
                    _text(where, record, "chosen"),
                    _text(where, record, "rejected"),
                    _finite(where, "margin", margin),
                )
            )
        elif "completion" in record or "score" in record:
            _require(where, record, ("prompt", "completion", "score"))
            ratings.append(
                (
                    _prompt(where, record["prompt"]),
                    _text(where, record, "completion"),
                    _finite(where, "score", record["score"]),
                )
            )
        else:
            raise ValueError(
                f"{where}: expected a pair {{prompt, chosen, rejected}} or a rating "
                f"{{prompt, completion, score}}, got keys {sorted(record)}"
            )
    pairs += ratings_to_pairs(ratings)
    if not pairs:
        raise ValueError(
            f"{path}: no preference pairs (ratings of a prompt need two different scores)"
        )
    return pairs


def pairs_from_run(run_dir: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a run's generations.jsonl: ratings where a person rated, else rewards."""
    path = Path(run_dir) / GENERATIONS_FILE
    if not path.exists():
        raise ValueError(
            f"{run_dir} has no {GENERATIONS_FILE}: is it a pipeline.run output folder?"
        )
    by_prompt: dict[str, list[tuple[Any, str, float, bool]]] = {}
    for where, record in _records(path):
        _require(where, record, ("prompt", "completion", "reward"))
        rated = record.get(RATING_FIELD) is not None
        score = record[RATING_FIELD] if rated else record["reward"]
        if not rated and not isinstance(score, numbers.Real):
            continue  # a reward logged as "nan": nothing to learn from
        entry = (
            record["prompt"],
            _text(where, record, "completion"),
            _finite(where, "score", score),
            rated,
        )
        by_prompt.setdefault(prompt_key(record["prompt"]), []).append(entry)
    ratings = []
    for entries in by_prompt.values():
        rated = [e for e in entries if e[3]]
        ratings += [(p, c, s) for p, c, s, _ in (rated or entries)]
    pairs = ratings_to_pairs(ratings)
    if not pairs:
        raise ValueError(f"{path}: no prompt has two completions with different rewards or ratings")
    return pairs


def ratings_to_pairs(ratings: list[tuple[Any, str, float]]) -> list[Pair]:
    """Every higher-scored completion of a prompt against every lower-scored one.

    The margin is the score difference (used only with `--margin true`).
    """
    groups: dict[str, list[tuple[Any, str, float]]] = {}
    for rating in ratings:
        groups.setdefault(prompt_key(rating[0]), []).append(rating)
    pairs = []
    for group in groups.values():
        for prompt, a, score_a in group:
            pairs += [
                Pair(prompt, a, b, score_a - score_b)
                for _, b, score_b in group
                if score_a > score_b
            ]
    return pairs


def _records(path: str | os.PathLike[str]):
    """(where, record) for each non-empty line; `where` is "file, line N"."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{where}: not valid JSON ({err.msg} at column {err.colno})"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _require(where: str, record: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{where}: missing {missing} (has {sorted(record)})")


def _prompt(where: str, prompt: Any) -> Any:
    if isinstance(prompt, str):
        return prompt
    ok = isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not ok or not prompt:
        raise ValueError(
            f"{where}: 'prompt' must be a string or a list of {{role, content}} messages"
        )
    return prompt


def _text(where: str, record: dict, key: str) -> str:
    if not isinstance(record[key], str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(record[key]).__name__}")
    return record[key]


def _finite(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def split_by_prompt(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): held-out pairs have prompts the training pairs never show."""
    keys = sorted({prompt_key(p.prompt) for p in pairs})
    random.Random(seed).shuffle(keys)
    count = round(fraction * len(keys))
    if fraction > 0 and len(keys) >= 2:
        count = min(max(count, 1), len(keys) - 1)
    held = set(keys[:count])
    return (
        [p for p in pairs if prompt_key(p.prompt) not in held],
        [p for p in pairs if prompt_key(p.prompt) in held],
    )


# Training --------------------------------------------------------------------------


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

    from pipeline.learned_rewards import encode_pair, score_ids

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
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
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

    # Held-out accuracy and calibration, scored exactly as learned_rewards scores a run.
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
        "calibration": {"mean": [mean], "std": [std], "source": "heldout" if heldout else "train"},
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
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return summary


# Command line ----------------------------------------------------------------------


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of `python -m pipeline.reward_model`."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.reward_model", description=__doc__.split("\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--pairs",
        help="JSONL of {prompt, chosen, rejected} pairs and/or {prompt, completion, score} ratings.",
    )
    source.add_argument(
        "--from_run", help="A pipeline.run output folder: pairs from its generations.jsonl."
    )
    parser.add_argument(
        "--base", required=True, help="Base model: hub id or local folder (e.g. the SFT policy)."
    )
    parser.add_argument("--output", required=True, help="Folder to write the reward model to.")
    parser.add_argument(
        "--use_lora", type=_bool, default=False, help="Train a LoRA adapter (plus the head)."
    )
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--lora_alpha", type=int, default=32)
    parser.add_argument(
        "--margin",
        type=_bool,
        default=False,
        help="Bradley–Terry with margins: a pair's 'margin', or the rating difference.",
    )
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument(
        "--max_length",
        type=int,
        default=1024,
        help="Tokens per prompt + completion (the start is cut).",
    )
    parser.add_argument(
        "--heldout_fraction",
        type=float,
        default=0.1,
        help="Share of prompts held out for the accuracy.",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    args = parser.parse_args(argv)
    if not 0 <= args.heldout_fraction < 1:
        parser.error(f"--heldout_fraction must be in [0, 1), got {args.heldout_fraction}")
    for name in ("epochs", "learning_rate", "batch_size", "max_length", "lora_r", "lora_alpha"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    from pipeline.backend import activate_backend

    activate_backend()  # unsloth (on a GPU) must be imported before trl and transformers
    try:
        pairs = pairs_from_run(args.from_run) if args.from_run else read_pairs(args.pairs)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = train_reward_model(
        pairs,
        args.base,
        args.output,
        use_lora=args.use_lora,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        margin=args.margin,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        max_length=args.max_length,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(f"pairs: {summary['train_pairs']} train, {summary['heldout_pairs']} held out")
    print(f"train_loss: {summary['train_loss']:.4f}")
    print(f"saved: {args.output}")
    accuracy = summary["heldout_pair_accuracy"]
    if accuracy is None:
        print(f"train_pair_accuracy: {summary['train_pair_accuracy']:.4f} (nothing held out)")
        print("heldout_pair_accuracy: n/a")
    else:
        print(f"heldout_pair_accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
