"""Sample a policy on a task and rate each reply: on-policy ratings for a reward model.

    python -m pipeline.reward_model.collect --model_name_or_path runs/tiny/warmup --task arithmetic \\
        --level 1 --prompts 400 --samples 8 --output ratings.jsonl
    python -m pipeline.reward_model --pairs ratings.jsonl --model_name_or_path <model> --output_dir runs/rm

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

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from curriculum.atomic import atomic_write_text
from pipeline.models.backend import activate_backend
from pipeline.options import UsageError, check_output_path, run_command, usage_errors

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
    from curriculum.tasks.base import prompt_key
    from pipeline.evaluate.first_attempts import generate_completions, score_completions

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


@dataclass
class CollectArguments:
    """The options of `python -m pipeline.reward_model.collect`."""

    model_name_or_path: str = field(
        metadata={"help": "The policy: model or adapter folder (or hub id). Was --model."}
    )
    task: str = field(metadata={"help": "Task family name, e.g. arithmetic."})
    level: int = field(metadata={"help": "Difficulty level (1..N)."})
    output: str = field(metadata={"help": "JSONL file of ratings to write."})
    prompts: int = field(default=400, metadata={"help": "Training prompts."})
    samples: int = field(default=8, metadata={"help": "Sampled replies per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    max_new_tokens: int = field(default=256, metadata={"help": "Longest reply in tokens."})
    batch_size: int = field(default=64, metadata={"help": "Prompts per generate call."})
    seed: int = field(default=0, metadata={"help": f"Prompts and sampling, in [0, {SEED_OFFSET})."})
    backend: Literal["auto", "unsloth", "transformers"] | None = field(
        default=None,
        metadata={"help": "auto | unsloth | transformers (None: $ERL_BACKEND, else auto)."},
    )
    disable_tqdm: bool = field(
        default=False, metadata={"help": "Hide the progress bar. Was --quiet."}
    )
    log_level: Literal["passive", "debug", "info", "warning", "error", "critical"] = field(
        default="passive", metadata={"help": "debug: a refused option also prints its traceback."}
    )

    def validate(self) -> None:
        """Reject a bad count, temperature or seed, naming it."""
        for name in ("prompts", "samples", "max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name} must be >= 1", getattr(self, name), "give a positive count"
                )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise UsageError(
                "--temperature must be a finite number > 0", self.temperature, "e.g. 1.0"
            )
        if not 0 <= self.seed < SEED_OFFSET:  # higher seeds would reach the held-out prompts
            raise UsageError(f"--seed must be in [0, {SEED_OFFSET})", self.seed, "e.g. 0")
        check_output_path(self.output, "--output", folder=False)


PROG = "python -m pipeline.reward_model.collect"
USAGE = f"{PROG} --model_name_or_path PATH --task NAME --level N --output FILE [--option VALUE ...]"
ALIASES = {"--model": ["--model_name_or_path"], "--quiet": ["--disable_tqdm", "true"]}


def collector_parser():
    """The command's TrlParser (imports trl)."""
    from pipeline.options import options_parser

    return options_parser((CollectArguments,), PROG, usage=USAGE)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.reward_model.collect`; returns the exit code (2: refused)."""
    return run_command(collect_from_command_line, argv, _help, _help_all)


def _help() -> str:
    from pipeline.options import project_help, stored_help
    from pipeline.reward_model import help_text as stored

    return stored_help(stored, PROG) or project_help(collector_parser())


def _help_all() -> str:
    return collector_parser().format_help()


def collect_from_command_line(argv: list[str]) -> int:
    """Check every option, load the policy, sample, rate and write the ratings."""
    from pipeline.options import (
        check_level,
        check_local_model_early,
        check_model_source,
        check_task,
        parse_options,
        peek_option,
    )

    check_local_model_early(argv, "model_name_or_path", "model")  # before the slow imports
    activate_backend(peek_option(argv, "backend"))  # unsloth (GPU) must precede transformers
    (args,) = parse_options((CollectArguments,), argv, PROG, aliases=ALIASES)
    args.validate()
    if args.disable_tqdm:  # transformers' own bars too (loading the weights)
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
    from pipeline.evaluate.first_attempts import load_for_evaluation

    task = check_task(args.task)
    check_level(task, args.level)
    check_model_source(args.model_name_or_path, "--model_name_or_path")
    with usage_errors(OSError, ValueError):
        model, tokenizer = load_for_evaluation(args.model_name_or_path)
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
        progress=not args.disable_tqdm,
    )
    write_ratings(ratings, args.output)
    solved = sum(r["score"] >= 1 for r in ratings)
    print(f"ratings: {len(ratings)} distinct replies to {args.prompts} prompts ({solved} solved)")
    print(f"saved: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
