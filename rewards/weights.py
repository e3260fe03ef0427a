"""The signal weights: which names are valid for a task, and checking a weights dict.

Weights live in config (`{"correctness": 1.0, "format": 0.2, "length": 0.1}`), never in
code. Their order is the order of the reward functions and of `GRPOConfig.reward_weights`.
A weight of 0 is allowed: TRL still logs the signal, which then only watches.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

from curriculum.tasks.base import Task
from rewards.length import LENGTH


def valid_signals(task: Task) -> tuple[str, ...]:
    """The signal names a weights dict may use for `task`: its own signals plus `length`."""
    return (*task.signals, LENGTH)


def check_weights(task: Task, weights: Mapping[str, float]) -> dict[str, float]:
    """`weights` as a dict of floats; ValueError naming a bad signal or weight."""
    valid = valid_signals(task)
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(
            f"weights must be a non-empty dict of signal -> weight; valid signals for task "
            f"{task.name!r}: {list(valid)}"
        )
    checked = {}
    for name, weight in weights.items():
        if name not in valid:
            raise ValueError(
                f"signal {name!r} is not reported by task {task.name!r}; valid signals: {list(valid)}"
            )
        finite = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
        if not finite or not math.isfinite(weight):
            raise ValueError(f"weight of signal {name!r} must be a finite number, got {weight!r}")
        checked[name] = float(weight)
    return checked


# TRL 1.15.0, GRPOTrainer._compute_advantages ("sum_then_normalize"): the scalar reward, a
# weighted nansum over the reward functions, NaN where every function returned None. Here,
# not in pipeline/erl/upstream.py beside TRL's other copies, because ERL, the run's GRPO
# and SDPO trainers all read it (tests/test_trl_guard.py follows it all the same).


def weighted_reward(rewards_per_func, reward_weights):
    """GRPO's scalar reward of each row (a tensor of rows x functions, and the functions'
    weights): the weighted nansum over functions, NaN where every function gave NaN."""
    weights = reward_weights.to(rewards_per_func.device).unsqueeze(0)
    rewards = (rewards_per_func * weights).nansum(dim=1)
    rewards[rewards_per_func.isnan().all(dim=1)] = float("nan")
    return rewards
