"""The run's rewards, assembled in one place: the task's programs, the learned signals,
their weights, the feedback ERL reads, and what a stage's evaluation scores.

    rewards = build_run_rewards(task, run, device=model.device, generations_log=log)
    ERLTrainer(..., reward_funcs=rewards.funcs, feedback_func=rewards.feedback,
               args=...reward_weights=rewards.weights...)

`reward_signals` (program signal -> weight) become reward functions through
`rewards.build_reward_funcs`; `reward_models` and `preference_functions` add one function
each (`pipeline.reward_model.signals`) and a sentence to the feedback. Nothing else
writes or rewrites the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curriculum.tasks import Task
from curriculum.tasks.agent import environment_reward_weights
from pipeline.evaluate.run_folder import stage_eval_weights
from rewards import GenerationsLog, Scorer, build_feedback_func, build_reward_funcs


@dataclass
class RunRewards:
    """What a stage trains and evaluates with."""

    funcs: list[Callable]
    """TRL reward functions, programs first, then learned signals."""
    weights: list[float]
    """One weight per function: the stages' `reward_weights`."""
    feedback: Callable[..., list[str]]
    """ERL's `feedback_func`."""
    scorer: Scorer
    """The one evaluation per completion behind the program signals (its repeated warnings
    are reported once per stage)."""
    eval_weights: dict[str, float] | None
    """The signals a stage's held-out evaluation scores (as r1 weighs them), or None for
    the task's own reward: when every program weight is 0 (the programs only watch and
    learned signals train), the evaluation still reports the task's verdict."""
    environment_weight: float = 0.0
    """The weight TRL trains an agent environment's `get_reward` at (0.0 without one), which
    the evaluation adds beside `eval_weights`."""


def build_run_rewards(
    task: Task, run: Any, *, device: Any, generations_log: GenerationsLog | None
) -> RunRewards:
    """The reward functions, weights and feedback of a run's `RunConfig` `run`.

    `device`: where learned reward models score (the policy's). `generations_log`: the
    main process's sampled-generations log (None on the others).
    """
    scorer = Scorer(task)  # one evaluation per completion, shared by rewards and feedback
    funcs, weights = build_reward_funcs(
        task,
        run.reward_signals,
        fallback=run.fallback_reward,
        length_budget=run.length_budget,
        scorer=scorer,
        generations_log=generations_log,
    )
    feedback = build_feedback_func(
        task, run.reward_signals, length_budget=run.length_budget, scorer=scorer
    )
    programs_count = any(run.reward_signals.values())
    if run.reward_models or run.preference_functions:
        from pipeline.reward_model.signals import add_learned_signals

        funcs, weights, feedback = add_learned_signals(
            run.reward_models,
            run.preference_functions,
            funcs,
            weights,
            feedback,
            device=device,
            program_feedback=programs_count,
        )
    return RunRewards(
        funcs,
        weights,
        feedback,
        scorer,
        stage_eval_weights(run.reward_signals),
        sum(environment_reward_weights(task).values()),  # TRL appends its function itself
    )
