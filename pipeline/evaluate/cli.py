"""Evaluate a model's first attempts on one task level: no reflection, as deployed.

Usage:

    python -m pipeline.evaluate --model runs/demo/final --task arithmetic --level 1 --n 64
    python -m pipeline.evaluate --model Qwen/Qwen2.5-1.5B-Instruct --task countdown --level 2 \\
        --n 100 --task_config '{"reveal_answer": false}' --json eval.json

`--model` takes a full model folder, a PEFT adapter folder, a run's stage folder (its
latest checkpoint-N) or a hub id. An adapter trained on a 4-bit base is evaluated on that
4-bit base (its folder records it; `--load_in_4bit` quantizes a plain model or hub id
too). Prints `mean_reward: ...` and `success_rate: ...`, one line each; `--json` also
writes the result (summary and a few samples) to a file.
Prompts are held out from training: see `pipeline.evaluate.first_attempts.held_out_seed`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pipeline.models.backend import BACKENDS, activate_backend


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def parse_key_values(items: list[str], option: str) -> dict[str, Any]:
    """A dict from one JSON object or from `key=value` pairs (values parsed as JSON if
    they can be: `n=3` is 3, `reveal_answer=true` is True, `name=abc` is "abc")."""
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        value = json.loads(items[0])
        if not isinstance(value, dict):
            raise ValueError(f"{option} must be a JSON object, got {items[0]!r}")
        return value
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} expects key=value pairs or one JSON object, got {item!r}")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.evaluate",
        description="First-attempt mean reward and success rate of a model on one task level.",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="Model folder, PEFT adapter folder, run stage folder or hub id.",
    )
    parser.add_argument("--task", required=True, help="Task family name, e.g. arithmetic.")
    parser.add_argument("--level", required=True, type=int, help="Difficulty level (1..N).")
    parser.add_argument(
        "--n", type=_positive_int, default=64, help="Held-out prompts (default 64)."
    )
    parser.add_argument(
        "--task_config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Task config as one JSON object or key=value pairs.",
    )
    parser.add_argument(
        "--weights",
        nargs="+",
        default=None,
        metavar="SIGNAL=WEIGHT",
        help="Score the weighted reward of these signals (as in training) "
        "instead of the task reward; JSON object or signal=weight pairs.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="Seed of the prompts (default: the held-out seed of the level).",
    )
    parser.add_argument(
        "--max_new_tokens",
        type=_positive_int,
        default=256,
        help="Longest completion in tokens (default 256).",
    )
    parser.add_argument(
        "--batch_size",
        type=_positive_int,
        default=16,
        help="Prompts per generate call (default 16).",
    )
    parser.add_argument(
        "--do_sample", action="store_true", help="Sample instead of greedy decoding."
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Sampling temperature with --do_sample (default 1.0).",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="auto | unsloth | transformers (default: $ERL_BACKEND, else auto).",
    )
    parser.add_argument(
        "--load_in_4bit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Load the base in 4-bit NF4 (default: when the adapter folder records a 4-bit "
        "base; --load_in_4bit also quantizes a plain model or hub id, as a 4-bit run's base).",
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="Also write the result as JSON to PATH."
    )
    parser.add_argument("--no_progress", action="store_true", help="Hide the progress bar.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (argparse exits with 2 on a bad argument)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    # -- check the task, level and weights before loading anything: bad input fails in a second
    from curriculum.tasks import get_task
    from rewards import check_weights

    try:
        task = get_task(args.task, **parse_key_values(args.task_config, "--task_config"))
        task.check_level(args.level)
        weights = None
        if args.weights is not None:
            weights = check_weights(task, parse_key_values(args.weights, "--weights"))
    except ValueError as err:  # json.JSONDecodeError is one too
        parser.error(str(err))
    if args.do_sample and not args.temperature > 0:
        parser.error(f"--temperature must be > 0 with --do_sample, got {args.temperature}")

    # -- backend first: Unsloth must be imported before transformers/peft/trl
    activate_backend(args.backend)
    from pipeline.evaluate.first_attempts import evaluate_first_attempts, load_for_evaluation

    try:
        model, tokenizer = load_for_evaluation(args.model, load_in_4bit=args.load_in_4bit)
    except (ValueError, OSError) as err:
        parser.error(f"cannot load --model {args.model!r}: {err}")

    result = evaluate_first_attempts(
        model,
        tokenizer,
        task,
        args.level,
        args.n,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        do_sample=args.do_sample,
        temperature=args.temperature,
        weights=weights,
        progress=not args.no_progress,
    )

    print(f"task: {result.task}  level: {result.level}  n: {result.n}  seed: {result.seed}")
    print(f"mean_reward: {result.mean_reward:.4f}")
    print(f"success_rate: {result.success_rate:.4f}")
    if args.json:
        from curriculum.atomic import atomic_write_json

        atomic_write_json(args.json, {"model": args.model, "weights": weights, **result.to_dict()})
    return 0
