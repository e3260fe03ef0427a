"""Pairwise judging: score each completion by its win rate against the rest of its group.

The RL API reference's preference-comparison environment, as a TRL reward function: the
completions GRPO sampled for one prompt are compared two by two by a *judge*
`(prompt, a, b) -> preference`, where the preference is a number in [0, 1] (1: `a` is
better, 0: `b` is better, 0.5: a tie; True/False count as 1/0). A completion's reward is
the share of its comparisons it won, in [0, 1]; alone in its group it scores 0.5.

A judge is a reward model (see `pipeline.reward_model.signals`, Bradley–Terry:
P(a ≻ b) = σ(r_a − r_b)) or a human-feedback function named in a recipe as
`"module:function"`, imported with importlib (never evaluated as code). No torch here.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from curriculum.tasks.base import prompt_key
from rewards.scoring import completion_text

Preference = Callable[[Any, str, str], float]


def load_preference_function(spec: str) -> Preference:
    """The callable named by `"package.module:function"`, checked to take (prompt, a, b);
    ValueError naming what is wrong."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"a preference function is given as 'module:function', got {spec!r}")
    module_name, attribute = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"preference function {spec!r}: cannot import {module_name!r} ({err})"
        ) from err
    func = getattr(module, attribute, None)
    if not callable(func):
        raise ValueError(
            f"preference function {spec!r}: {module_name} has no callable {attribute!r}"
        )
    # Checked now, not at its first call: a function of other arguments (say `os:system`)
    # would otherwise pass the start and fail, or worse run, in the middle of training.
    try:
        inspect.signature(func).bind("prompt", "a", "b")
    except (TypeError, ValueError) as err:
        try:
            shown = str(inspect.signature(func))
        except (TypeError, ValueError):
            shown = "a signature that cannot be read"
        raise ValueError(
            f"preference function {spec!r} takes other arguments than (prompt, a, b) ({shown}): "
            "give a function (prompt, a, b) -> a preference in [0, 1]"
        ) from err
    return func


def group_indices(prompts: Sequence[Any]) -> dict[str, list[int]]:
    """Row indices by prompt, in first-seen order (GRPO's group = one prompt's samples)."""
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt_key(prompt), []).append(i)
    return groups


def check_preference(value: Any, judge: str) -> float:
    """`value` as a float in [0, 1]; ValueError naming the judge otherwise."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and 0 <= value <= 1:
        return float(value)
    raise ValueError(
        f"judge {judge!r} returned {value!r}; a preference must be a number in [0, 1] "
        "(1: the first completion is better, 0: the second, 0.5: a tie) or a bool"
    )


def win_rates(
    prompts: Sequence[Any], completions: Sequence[Any], prefer: Preference, judge: str = "judge"
) -> list[float]:
    """Each completion's share of wins against the other completions of its prompt.

    >>> longer = lambda prompt, a, b: len(a) > len(b)
    >>> win_rates(["p", "p", "p", "q"], ["a", "bbb", "cc", "d"], longer)
    [0.0, 1.0, 0.5, 0.5]
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    texts = [completion_text(c) for c in completions]
    rates = [0.5] * len(texts)
    for rows in group_indices(prompts).values():
        if len(rows) < 2:
            continue
        wins = dict.fromkeys(rows, 0.0)
        for x, i in enumerate(rows):
            for j in rows[x + 1 :]:
                p = check_preference(prefer(prompts[i], texts[i], texts[j]), judge)
                wins[i] += p
                wins[j] += 1 - p
        for i in rows:
            rates[i] = wins[i] / (len(rows) - 1)
    return rates


def win_rate_sentence(name: str, rate: float, group_size: int) -> str:
    """Feedback for one completion's pairwise result, in words a policy can act on.

    >>> win_rate_sentence("style", 0.25, 5)
    "Judge 'style' preferred this reply in 1 of its 4 comparisons with other replies to the same prompt (win rate 0.25); the other replies were usually judged better."
    """
    others = group_size - 1
    if others < 1:
        return f"Judge {name!r} had no other reply to compare this one with."
    wins = rate * others
    shown = f"{wins:.0f}" if abs(wins - round(wins)) < 1e-9 else f"{wins:.1f}"
    verdict = (
        "it was judged the best reply"
        if rate >= 1 - 1e-9
        else "the other replies were usually judged better"
        if rate < 0.5
        else "some other replies were judged better"
    )
    return (
        f"Judge {name!r} preferred this reply in {shown} of its {others} comparisons with other "
        f"replies to the same prompt (win rate {rate:.2f}); {verdict}."
    )
