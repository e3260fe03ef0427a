"""The `length` signal: a penalty computed here from the completion, not by the task.

0 for a reply of at most `length_budget` characters, falling linearly to -1 at twice the
budget and staying there. Characters rather than tokens, so that it needs no tokenizer and
means the same for every model; about 4 characters make a token in English text.
"""

from __future__ import annotations

LENGTH = "length"

# ~500 tokens: room for a short chain of thought before the answer.
DEFAULT_LENGTH_BUDGET = 2000


def check_length_budget(length_budget: int) -> None:
    """ValueError unless `length_budget` is a positive int."""
    if not isinstance(length_budget, int) or isinstance(length_budget, bool) or length_budget < 1:
        raise ValueError(f"length_budget must be an int >= 1 (characters), got {length_budget!r}")


def length_penalty(num_chars: int, length_budget: int) -> float:
    """0 within `length_budget` characters, then linearly down to -1 at twice the budget.

    >>> length_penalty(100, 100), length_penalty(150, 100), length_penalty(900, 100)
    (0.0, -0.5, -1.0)
    """
    if num_chars <= length_budget:
        return 0.0
    return max(-1.0, -(num_chars - length_budget) / length_budget)
