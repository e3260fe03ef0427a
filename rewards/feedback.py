"""The ERL feedback function: one short, specific paragraph per completion.

`build_feedback_func(task, weights)` returns `ERLTrainer`'s `feedback_func`. It takes the
same keyword arguments as a reward function and returns one string per completion:

- the parse error, for a completion the task could not parse at all;
- otherwise the task's sentence for each failed signal among the weighted ones;
- a length sentence when `length` is weighted and the reply is over its budget.

The expected answer never appears unless the task's own `reveal_answer` is on: the
sentences come from the task, which decides that. Pass the `Scorer` the reward functions
use (`scorer=`) and the feedback costs no second evaluation of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from curriculum.tasks.base import Task
from rewards.length import DEFAULT_LENGTH_BUDGET, LENGTH, check_length_budget
from rewards.scoring import Scored, Scorer, shared_scorer
from rewards.weights import check_weights

FeedbackFunc = Callable[..., list[str]]


def feedback_sentence(
    scored: Scored, text: str, signals: tuple[str, ...], length_budget: int | None
) -> str:
    """The feedback for one scored completion; `length_budget` None leaves length out."""
    if scored.failure is not None:
        sentence = scored.failure
    else:
        evaluation = scored.evaluation
        chosen = [evaluation.feedback[name] for name in signals if name in evaluation.feedback]
        if chosen:
            sentence = " ".join(chosen)
        elif evaluation.solved or not evaluation.feedback:
            # Not solved but no sentence at all would be the task's omission; say what we know.
            sentence = (
                "The answer is correct." if evaluation.solved else "The answer is not right yet."
            )
        else:
            # Something unweighted failed while every weighted signal passed: saying "correct"
            # would be false, so give the task's full feedback instead.
            sentence = evaluation.feedback_text()
    if length_budget is not None and len(text) > length_budget:
        sentence += f" The reply is {len(text):,} characters long; keep it under {length_budget:,}."
    return sentence


def feedback_scope(
    weights: Mapping[str, float], length_budget: int
) -> tuple[tuple[str, ...], int | None]:
    """The task signals feedback reports (nonzero weight) and the length budget, or None
    when `length` has no weight."""
    signals = tuple(name for name, w in weights.items() if w != 0 and name != LENGTH)
    return signals, (length_budget if weights.get(LENGTH, 0) != 0 else None)


def build_feedback_func(
    task: Task,
    weights: Mapping[str, float],
    *,
    length_budget: int = DEFAULT_LENGTH_BUDGET,
    scorer: Scorer | None = None,
) -> FeedbackFunc:
    """ERLTrainer's `feedback_func` for `task`: one feedback string per completion.

    Only signals with a nonzero weight are reported; pass the reward functions' `scorer`
    to reuse their Evaluations.

    >>> from curriculum.tasks import get_task
    >>> feedback = build_feedback_func(get_task("arithmetic"), {"correctness": 1.0})
    >>> cols = dict(task=["arithmetic"] * 2, level=[1] * 2, answer=["7"] * 2, meta=["{}"] * 2)
    >>> feedback(completions=["<answer>7</answer>", "<answer>9</answer>"], **cols)
    ['The answer is correct.', 'The answer 9 is wrong: it is too high.']
    """
    weights = check_weights(task, weights)
    check_length_budget(length_budget)
    scorer = shared_scorer(task, scorer)
    signals, budget = feedback_scope(weights, length_budget)

    def feedback(completions: list[Any], **kwargs: Any) -> list[str]:
        """One feedback string per completion: what failed, never the answer."""
        batch = scorer.score("feedback", completions, kwargs, count=False)
        return [
            feedback_sentence(scored, text, signals, budget)
            for scored, text in zip(batch.results, batch.texts, strict=True)
        ]

    return feedback
