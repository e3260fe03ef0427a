"""Sample a policy on a task and rate each reply: on-policy ratings for a reward model.

    python -m pipeline.reward_model.collect --model runs/tiny/warmup --task arithmetic --level 1 \\
        --prompts 400 --samples 8 --output ratings.jsonl
    python -m pipeline.reward_model --pairs ratings.jsonl --base <model> --output_dir runs/rm

A reward model only helps RL if it ranks the replies the policy actually writes: one
trained on made-up pairs (the right sum against a random wrong one) ranked the tiny
policy's own mistakes, near misses, little better than chance, and RL followed them. So
this samples `--samples` replies to each of `--prompts` training prompts from the policy
(temperature `--temperature`), and writes one rating a line,
`{"prompt": ..., "completion": ..., "score": ...}`, which `pipeline.reward_model` turns
into pairs within a prompt (every higher-rated reply against every lower-rated one).

The rater here is the task's verifier (score = the task reward), a stand-in for a person
on a task a program can check; for one it cannot, a person edits the scores (or writes
the file) instead. Identical replies to a prompt are written once: copies would only
repeat the same pairs. Prompts come from training seeds (below the held-out evaluation
seeds, see `pipeline.evaluate.first_attempts.held_out_seed`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from curriculum.atomic import atomic_write_text
from pipeline.models.backend import BACKENDS, activate_backend

SEED_OFFSET = 500_000
"""Prompt seeds start here: away from the stages' and the warm-up's, below the held-out ones."""


def collect_ratings(
    model: Any,
    tokenizer: Any,
    task: Any,
    level: int,
    prompts: int,
    samples: int,
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """`samples` sampled replies to each of `prompts` prompts, rated by the task's verifier.

    Returns ratings `{"prompt", "completion", "score"}`, one per distinct reply of a prompt.
    """
    from pipeline.evaluate.first_attempts import generate_completions, score_completions
    from rewards.pairwise import prompt_key

    task.check_level(level)
    for name, value in (("prompts", prompts), ("samples", samples)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    rows = task.generate(level, prompts, seed=SEED_OFFSET + seed)
    repeated = [row for row in rows for _ in range(samples)]
    completions = generate_completions(
        model,
        tokenizer,
        [row["prompt"] for row in repeated],
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        do_sample=True,
        temperature=temperature,
        seed=seed,
        progress=progress,
    )
    # The verifier as evaluation uses it: a reply it cannot parse scores 0.
    rewards = score_completions(task, repeated, completions).rewards
    ratings, seen = [], set()
    for row, completion, reward in zip(repeated, completions, rewards, strict=True):
        key = (prompt_key(row["prompt"]), completion)
        if key not in seen:
            seen.add(key)
            ratings.append({"prompt": row["prompt"], "completion": completion, "score": reward})
    return ratings


def write_ratings(ratings: list[dict[str, Any]], output: str | os.PathLike[str]) -> None:
    """One JSON object a line, written atomically (a killed run leaves no half file)."""
    atomic_write_text(output, "".join(json.dumps(r) + "\n" for r in ratings))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of `python -m pipeline.reward_model.collect`."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.reward_model.collect", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="The policy: model or adapter folder.")
    parser.add_argument("--task", required=True, help="Task family name, e.g. arithmetic.")
    parser.add_argument("--level", required=True, type=int, help="Difficulty level (1..N).")
    parser.add_argument("--output", required=True, help="JSONL file of ratings to write.")
    parser.add_argument(
        "--prompts", type=_positive_int, default=400, help="Training prompts (default 400)."
    )
    parser.add_argument(
        "--samples", type=_positive_int, default=8, help="Sampled replies per prompt (default 8)."
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=_positive_int, default=256)
    parser.add_argument("--batch_size", type=_positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="Prompts and sampling.")
    parser.add_argument("--backend", choices=BACKENDS, default=None)
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    args = parser.parse_args(argv)
    if not args.temperature > 0:
        parser.error(f"--temperature must be > 0, got {args.temperature}")
    if not 0 <= args.seed < SEED_OFFSET:  # higher seeds would reach the held-out prompts
        parser.error(f"--seed must be in [0, {SEED_OFFSET}), got {args.seed}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    activate_backend(args.backend)  # unsloth (on a GPU) must be imported before transformers
    from curriculum.tasks import get_task
    from pipeline.evaluate.first_attempts import load_for_evaluation

    try:
        task = get_task(args.task)
        task.check_level(args.level)
        model, tokenizer = load_for_evaluation(args.model)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    ratings = collect_ratings(
        model,
        tokenizer,
        task,
        args.level,
        args.prompts,
        args.samples,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.quiet,
    )
    write_ratings(ratings, args.output)
    solved = sum(r["score"] >= 1 for r in ratings)
    print(f"ratings: {len(ratings)} distinct replies to {args.prompts} prompts ({solved} solved)")
    print(f"saved: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
