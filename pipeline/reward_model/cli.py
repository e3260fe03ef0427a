"""Train a reward model from preference pairs or ratings: `python -m pipeline.reward_model`.

    python -m pipeline.reward_model --pairs pairs.jsonl --base <model> --output runs/rm
    python -m pipeline.reward_model --from_run runs/x --base <model> --output runs/rm --use_lora true

Pairs: see `pipeline.reward_model.pairs`; training: `pipeline.reward_model.train`. The
last line printed is `heldout_pair_accuracy: X`.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.reward_model.pairs import pairs_from_run, read_pairs
from pipeline.reward_model.train import train_reward_model


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of `python -m pipeline.reward_model`."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.reward_model", description=__doc__.split("\n")[0].split(":")[0]
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
    from pipeline.models.backend import activate_backend

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
