"""One TRL reward function per signal, built from a task and a weights dict.

    scorer = Scorer(task)  # shared: one evaluation per completion per step
    reward_funcs, reward_weights = build_reward_funcs(task, weights, scorer=scorer)
    feedback_func = build_feedback_func(task, weights, scorer=scorer)
    # GRPOConfig(reward_weights=reward_weights), ERLTrainer(reward_funcs=..., feedback_func=...)

Each function is named `<signal>_reward`, so TRL logs `rewards/<signal>_reward/mean`. A
task signal's value is the Evaluation's breakdown entry, in [0, 1]; `length` is the
penalty of `rewards.length`, in [-1, 0].

A completion that cannot be scored (parse error, a verifier that raised, a value that is
not a finite number in [0, 1]) scores `fallback` (default -0.5, as in seed 001) in EVERY
signal function, `length` included: with positive weights that puts it below any reply
that parsed, however wrong, so GRPO first teaches the format. The failure rate goes to
TRL as `rewards/fallback_rate` and is kept on the scorer (`scorer.failures`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from curriculum.tasks.base import Task
from rewards.feedback import feedback_scope, feedback_sentence
from rewards.generations_log import GenerationsLog
from rewards.length import DEFAULT_LENGTH_BUDGET, LENGTH, check_length_budget, length_penalty
from rewards.scoring import Scored, ScoredBatch, Scorer, shared_scorer
from rewards.weights import check_weights

RewardFunc = Callable[..., list[float]]

# The docstring of each signal's function. The examples use arithmetic where it reports
# the signal, else countdown or schedule; `tests/test_rewards.py` runs them all.
_EXAMPLE = """

    >>> from curriculum.tasks import get_task
    >>> cols = dict(task=["arithmetic"] * 3, level=[1] * 3, answer=["7"] * 3, meta=["{{}}"] * 3)
    >>> (func,), _ = build_reward_funcs(get_task("arithmetic"), {{"{signal}": 1.0}}{extra})
    >>> func(completions={completions}, **cols)
    {result}
"""
_ARITHMETIC = '["<answer>7</answer>", "<answer>9</answer>!", "seven"]'
_DOCS = {
    "format": "Reward for following the reply format: 1 exact, partial when close."
    + _EXAMPLE.format(
        signal="format", extra="", completions=_ARITHMETIC, result="[1.0, 0.5, -0.5]"
    ),
    "correctness": "Reward for solving the task: 1 when solved, else 0 (or partial credit)."
    + _EXAMPLE.format(
        signal="correctness", extra="", completions=_ARITHMETIC, result="[1.0, 0.0, -0.5]"
    ),
    "milestones": "Reward for progress towards the solution, e.g. closeness to the answer."
    + _EXAMPLE.format(
        signal="milestones", extra="", completions=_ARITHMETIC, result="[1.0, 0.8, -0.5]"
    ),
    "length": "Penalty for a reply over the length budget: 0 within it, -1 at twice it."
    + _EXAMPLE.format(
        signal="length",
        extra=", length_budget=18",
        completions='["<answer>7</answer>", "<answer>7</answer>" + " " * 9, "seven"]',
        result="[0.0, -0.5, -0.5]",
    ),
    "plausibility": "Reward for a plausible reply: legal moves, real ids, allowed numbers."
    + """

    >>> from curriculum.tasks import get_task
    >>> meta = '{"numbers": [7, 1, 7], "target": 8}'
    >>> cols = dict(task=["countdown"] * 3, level=[1] * 3, answer=["7 + 1"] * 3, meta=[meta] * 3)
    >>> (func,), _ = build_reward_funcs(get_task("countdown"), {"plausibility": 1.0})
    >>> func(completions=["<answer>7 + 1</answer>", "<answer>7 + 7 + 7</answer>", "8"], **cols)
    [1.0, 0.0, -0.5]
""",
    "reasoning": "Reward for a rationale that is present and consistent with the answer."
    + """

    >>> from curriculum.tasks import get_task
    >>> task = get_task("schedule")
    >>> row = task.generate(1, 1)[0]
    >>> cols = {name: [row[name]] * 3 for name in ("task", "level", "answer", "meta")}
    >>> (func,), _ = build_reward_funcs(task, {"reasoning": 1.0})
    >>> no_rationale = '<answer>{"actions": [], "rationale": ""}</answer>'
    >>> func(completions=[task.reference(row), no_rationale, "no plan"], **cols)
    [1.0, 0.0, -0.5]
""",
}


def build_reward_funcs(
    task: Task,
    weights: Mapping[str, float],
    *,
    fallback: float = -0.5,
    length_budget: int = DEFAULT_LENGTH_BUDGET,
    log_dir: str | None = None,
    log_every: int = 20,
    log_samples: int = 2,
    scorer: Scorer | None = None,
    generations_log: GenerationsLog | None = None,
) -> tuple[list[RewardFunc], list[float]]:
    """One TRL reward function per weighted signal, and the weights in the same order.

    `weights` maps signal names (the task's `signals` plus `length`) to finite weights.
    `log_dir` set: every `log_every`-th batch, `log_samples` completions go to
    `<log_dir>/generations.jsonl`; or pass your own `generations_log` (the curriculum run
    tells its log the stage). `scorer`: a `Scorer` to share with `build_feedback_func`.
    """
    weights = check_weights(task, weights)
    if not _is_number(fallback) or not math.isfinite(fallback):
        raise ValueError(f"fallback must be a finite number, got {fallback!r}")
    check_length_budget(length_budget)
    scorer = shared_scorer(task, scorer)
    log = generations_log
    if log is None and log_dir is not None:
        log = GenerationsLog(log_dir, log_every, log_samples)
    fallback = float(fallback)
    feedback_targets = feedback_scope(weights, length_budget)

    def signal_values(batch: ScoredBatch, signal: str) -> list[float]:
        return [
            _signal_value(scored, text, signal, fallback, length_budget)
            for scored, text in zip(batch.results, batch.texts, strict=True)
        ]

    def write_samples(batch: ScoredBatch, kwargs: dict[str, Any]) -> None:
        state = kwargs.get("trainer_state")
        step = state.global_step if state is not None else None
        records = []
        for i in log.pick([row["prompt"] for row in batch.rows]):
            row, text, scored = batch.rows[i], batch.texts[i], batch.results[i]
            breakdown = {
                s: _signal_value(scored, text, s, fallback, length_budget) for s in weights
            }
            record = {"step": step, "task": row["task"], "level": row["level"]}
            record |= {"prompt": row["prompt"], "completion": text}
            if not isinstance(batch.completions[i], str):  # an agent's episode, message by message
                record["episode"] = batch.completions[i]
            record["reward"] = sum(weights[s] * v for s, v in breakdown.items())
            record["breakdown"] = breakdown
            record["feedback"] = feedback_sentence(scored, text, *feedback_targets)
            record["failure"] = scored.kind
            # ERLTrainer scores retries through the same functions and marks them attempt=2.
            record["attempt"] = kwargs.get("attempt", [1] * len(batch.results))[i]
            records.append(record)
        log.write(batch.index, records)

    def make(signal: str) -> RewardFunc:
        name = f"{signal}_reward"

        def reward(completions: list[Any], **kwargs: Any) -> list[float]:
            batch = scorer.score(name, completions, kwargs)
            # ERLTrainer scores retries with an `attempt` column of 2s.
            retry = 2 in kwargs.get("attempt", ())
            if log is not None and log.due(batch.index, retry=retry):
                write_samples(batch, kwargs)
            return signal_values(batch, signal)

        reward.__name__ = reward.__qualname__ = name
        reward.__doc__ = _DOCS[signal]
        return reward

    return [make(signal) for signal in weights], list(weights.values())


def _signal_value(
    scored: Scored, text: str, signal: str, fallback: float, length_budget: int
) -> float:
    """The value one signal function returns for one scored completion."""
    if scored.kind is not None:
        return fallback
    if signal == LENGTH:
        return length_penalty(len(text), length_budget)
    return float(scored.evaluation.breakdown[signal])


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
