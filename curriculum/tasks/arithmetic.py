"""Arithmetic: evaluate a short integer expression; levels grow digits and terms.

Level 1 (two single-digit numbers added) is easy enough that the project's tiny model
learns it on a CPU in minutes, which the offline demo relies on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from curriculum.tasks.answer_tags import extract_answer, shorten
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig

# level -> (digits per number, number of terms, operators drawn from)
LEVELS: dict[int, tuple[int, int, str]] = {
    1: (1, 2, "+"),
    2: (1, 3, "+-"),
    3: (2, 2, "+-"),
    4: (2, 3, "+-"),
    5: (2, 3, "+-*"),
    6: (3, 4, "+-*"),
}

SYSTEM_PROMPT = "Compute the result. Reply only with <answer>N</answer>."

# Strict means exactly `<answer>N</answer>`, no think block: a lenient match taught the
# project's tiny model not to stop after the answer.
_STRICT = re.compile(r"\s*<answer>\s*(-?\d+)\s*</answer>\s*")
# Answers with more significant digits are scored as far off without being converted:
# `int()` refuses strings over 4,300 digits. No level's answer comes near this many.
MAX_DIGITS = 100


@dataclass
class ArithmeticConfig(TaskConfig):
    pass


class ArithmeticTask(Task):
    """Integer expressions such as `3+4` or `12-7*3`; the reply is `<answer>N</answer>`."""

    name = "arithmetic"
    config_class = ArithmeticConfig
    signals = ("format", "correctness", "milestones")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        digits, terms, ops = LEVELS[level]
        low = 0 if digits == 1 else 10 ** (digits - 1)
        numbers = [rng.randint(low, 10**digits - 1) for _ in range(terms)]
        operators = [rng.choice(ops) for _ in range(terms - 1)]
        expression = str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(operators, numbers[1:]))
        return self.make_row(level, SYSTEM_PROMPT, expression, str(_calculate(numbers, operators)))

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        return evaluate_integer(completion, int(row["answer"]), self.config.reveal_answer)


def evaluate_integer(
    completion: str, expected: int, reveal_answer: bool, *, state_gap: bool = False
) -> Evaluation:
    """The verdict on an `<answer>N</answer>` reply to a question whose answer is `expected`:
    format, correctness and milestones (closeness), with feedback that says the direction
    of the error ("too low"), and its size too when `state_gap` ("3 too low"). The answer
    itself only with `reveal_answer`. Shared by the integer-answer families."""
    tag = extract_answer(completion)
    if tag is None:
        return Evaluation(
            0.0,
            {"format": 0.0, "correctness": 0.0, "milestones": 0.0},
            error="No <answer>...</answer> tag found; reply exactly <answer>N</answer>.",
        )
    strict = _STRICT.fullmatch(completion)
    content = tag.text
    feedback: dict[str, str] = {}
    if strict is None:
        feedback["format"] = (
            "The reply must be exactly <answer>N</answer> with an integer N and nothing else."
        )
    if not re.fullmatch(r"-?\d+", content):
        feedback["correctness"] = f"The answer {shorten(content)!r} is not an integer."
        return Evaluation(0.0, {"format": 0.0, "correctness": 0.0, "milestones": 0.0}, feedback)
    negative = content.startswith("-")
    digits = content.lstrip("-").lstrip("0")
    if len(digits) > MAX_DIGITS:
        side = "too low" if negative else "too high"
        feedback["correctness"] = f"The answer has {len(digits)} digits: it is far {side}."
        feedback["milestones"] = f"An answer of {len(digits)} digits is nowhere near."
        breakdown = {"format": 1.0 if strict is not None else 0.5, "correctness": 0.0}
        return Evaluation(0.0, {**breakdown, "milestones": 0.0}, feedback)
    value = -int(digits or "0") if negative else int(digits or "0")
    correct = strict is not None and value == expected
    if value != expected:
        direction = "too low" if value < expected else "too high"
        gap = abs(value - expected)
        size = f"{gap} " if state_gap else ""
        feedback["correctness"] = f"The answer {value} is wrong: it is {size}{direction}."
        if reveal_answer:
            feedback["correctness"] += f" The correct answer is {expected}."
        feedback["milestones"] = f"The answer {value} is off by {gap}."
    breakdown = {
        "format": 1.0 if strict is not None else 0.5,
        "correctness": 1.0 if correct else 0.0,
        "milestones": closeness(value, expected),
    }
    return Evaluation(breakdown["correctness"], breakdown, feedback)


def closeness(value: int, expected: int) -> float:
    """Partial credit: 1 - |value - expected| / max(10, |expected|), floored at 0.

    Exact integer arithmetic, so a huge `value` cannot overflow a float division.

    >>> closeness(95, 100)
    0.95
    """
    gap, scale = abs(value - expected), max(10, abs(expected))
    return 0.0 if gap >= scale else 1.0 - gap / scale


def _calculate(numbers: list[int], operators: list[str]) -> int:
    """Value of the expression with the usual precedence (× before + and −)."""
    # Fold multiplications into the term they belong to, then add the signed terms.
    terms = [numbers[0]]
    signs = [1]
    for op, n in zip(operators, numbers[1:]):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))
