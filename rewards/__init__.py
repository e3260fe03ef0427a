"""Rewards: multi-signal TRL reward functions and ERL feedback built from task evaluations.

    from rewards import Scorer, build_feedback_func, build_reward_funcs

    scorer = Scorer(task)
    reward_funcs, reward_weights = build_reward_funcs(task, weights, scorer=scorer, log_dir=out)
    feedback_func = build_feedback_func(task, weights, scorer=scorer)

Sharing the scorer makes the reward functions and the feedback function use one
evaluation per completion. No torch or trl is imported here.
"""

from rewards.feedback import build_feedback_func, feedback_sentence
from rewards.generations_log import GenerationsLog
from rewards.length import DEFAULT_LENGTH_BUDGET, LENGTH, length_penalty
from rewards.scoring import FAILURE_METRIC, Scored, ScoredBatch, Scorer, completion_text
from rewards.signals import build_reward_funcs
from rewards.weights import check_weights, valid_signals

__all__ = [
    "DEFAULT_LENGTH_BUDGET",
    "FAILURE_METRIC",
    "LENGTH",
    "GenerationsLog",
    "Scored",
    "ScoredBatch",
    "Scorer",
    "build_feedback_func",
    "build_reward_funcs",
    "check_weights",
    "completion_text",
    "feedback_sentence",
    "length_penalty",
    "valid_signals",
]
