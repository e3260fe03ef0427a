"""Arithmetic: answers of any size are scored, never raised on (issue 8)."""

from __future__ import annotations

import pytest

from curriculum.tasks.arithmetic import MAX_DIGITS, SYSTEM_PROMPT, ArithmeticTask, closeness

TASK = ArithmeticTask()


def row(answer: int = 12) -> dict:
    return TASK.make_row(2, SYSTEM_PROMPT, "5+9-2", str(answer))


def score(text: str, expected: int = 12):
    return TASK.evaluate(row(expected), f"<answer>{text}</answer>")


def test_closeness_is_relative_to_the_answer_and_exact_for_huge_values():
    assert closeness(12, 12) == 1.0
    assert closeness(95, 100) == pytest.approx(0.95)
    assert closeness(7, 2) == pytest.approx(0.5)  # at least 10 wide for small answers
    assert closeness(-40, 12) == 0.0
    # Once a float division that overflowed past 308 digits.
    assert closeness(10**400, 12) == 0.0 and closeness(-(10**400), 12) == 0.0


@pytest.mark.parametrize(
    ("text", "side"),
    [
        ("9" * 310, "too high"),  # raised OverflowError
        ("9" * 4301, "too high"),  # raised ValueError: int() refuses > 4,300 digits
        ("-" + "9" * 5000, "too low"),
        ("9" * (MAX_DIGITS + 1), "too high"),
    ],
    ids=["310 digits", "4301 digits", "negative 5000 digits", "just over the cap"],
)
def test_huge_answers_are_wrong_with_short_feedback(text, side):
    evaluation = score(text)
    assert evaluation.error is None and evaluation.reward == 0.0
    assert evaluation.breakdown == {"format": 1.0, "correctness": 0.0, "milestones": 0.0}
    assert side in evaluation.feedback["correctness"]
    assert all(len(sentence) < 100 for sentence in evaluation.feedback.values())


def test_leading_zeros_do_not_count_as_digits():
    assert score("0" * 5000 + "12").reward == 1.0  # the value is 12, as "012" always was
    assert score("-" + "0" * 5000, expected=7).breakdown["milestones"] == pytest.approx(0.3)
    near = score("9" * MAX_DIGITS)  # at the cap: converted and compared exactly
    assert near.breakdown["milestones"] == 0.0 and "too high" in near.feedback["correctness"]


def test_partial_credit_and_format():
    assert score("12").reward == 1.0
    close = score("11")
    assert close.breakdown["milestones"] == pytest.approx(1 - 1 / 12) and close.reward == 0.0
    assert close.feedback["milestones"] == "The answer 11 is off by 1."
    loose = TASK.evaluate(row(), "So: <answer>12</answer>")
    assert loose.breakdown == {"format": 0.5, "correctness": 0.0, "milestones": 1.0}
