"""Countdown: generator, AST-only expression evaluator, verifier and feedback."""

from __future__ import annotations

import itertools
import json
import time
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from curriculum.tasks.countdown import (
    LEVELS,
    MAX_DEPTH,
    SYSTEM_PROMPT,
    CountdownTask,
    evaluate_expression,
    usage_problem,
)

TASK = CountdownTask()
HAND_NUMBERS = [3, 7, 25, 50]  # 82 = 50 + 25 + 7


def hand_row(numbers: list[int] = HAND_NUMBERS, target: int = 82) -> dict:
    return TASK.make_row(
        3, SYSTEM_PROMPT, "hand-made", "50 + 25 + 7", numbers=numbers, target=target
    )


def score(expression: str, task: CountdownTask = TASK, **row):
    return task.evaluate(hand_row(**row), f"<answer>{expression}</answer>")


# Generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_solves_every_level(level):
    spec = LEVELS[level]
    for row in TASK.generate(level, 60, seed=level * 100):
        meta = json.loads(row["meta"])
        assert len(meta["numbers"]) == spec.count
        assert spec.target[0] <= meta["target"] <= spec.target[1]
        assert meta["target"] not in meta["numbers"]  # no one-number answers
        assert f"Target: {meta['target']}" in row["prompt"][1]["content"]
        evaluation = TASK.evaluate(row, TASK.reference(row))
        assert evaluation.reward == 1.0
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0)
        assert evaluation.feedback == {}
        assert evaluation.error is None


def test_difficulty_grows_with_level():
    def averages(level):
        rows = TASK.generate(level, 60, seed=1)
        metas = [json.loads(r["meta"]) for r in rows]
        used = [len(evaluate_expression(r["answer"]).numbers) for r in rows]
        return (
            sum(len(m["numbers"]) for m in metas) / len(rows),
            sum(used) / len(rows),
            sum(m["target"] for m in metas) / len(rows),
        )

    stats = [averages(level) for level in TASK.levels]
    for easier, harder in itertools.pairwise(stats):
        assert harder[0] >= easier[0]  # numbers given
        assert harder[1] >= easier[1]  # numbers the solution needs
    assert stats[-1][0] > stats[0][0] and stats[-1][1] > stats[0][1]
    assert stats[-1][2] > 10 * stats[0][2]  # targets grow by more than an order of magnitude


def test_bad_config_raises_naming_the_key():
    with pytest.raises(ValueError, match="max_expression_chars"):
        CountdownTask(max_expression_chars=5)
    with pytest.raises(ValueError, match="unknown config key"):
        CountdownTask(max_numbers=3)
    with pytest.raises(ValueError, match="level 0"):
        TASK.generate(0, 1)


# Expression evaluator --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("2 + 3 * 4", 14, (2, 3, 4)),
        ("(2 + 3) * 4", 20, (2, 3, 4)),
        ("-3 + 10", 7, (3, 10)),
        ("7 / 2", Fraction(7, 2), (7, 2)),
        ("100 - 25 - 50", 25, (100, 25, 50)),
        ("((((8))))", 8, (8,)),
    ],
)
def test_evaluator_follows_arithmetic_rules(text, value, numbers):
    result = evaluate_expression(text)
    assert (result.value, result.numbers) == (value, numbers)
    assert result.syntax_error is result.rule_error is result.math_error is None


@pytest.mark.parametrize(
    "text, kind, words",
    [
        ("__import__('os').system('ls')", "rule_error", "Function calls"),
        ("9**9**9**9", "rule_error", "**"),
        ("7 % 3", "rule_error", "%"),
        ("7 // 3", "rule_error", "//"),
        ("x + 1", "rule_error", "'x'"),
        ("(1).real", "rule_error", "Attribute"),
        ("2.5 * 4", "rule_error", "2.5"),
        ("True + 1", "rule_error", "True"),
        ("'ab' * 3", "rule_error", "'ab'"),
        ("[1, 2]", "rule_error", "List"),
        ("~5", "rule_error", "unary minus"),
        ("-" * 120 + "1", "rule_error", "more than"),
        ("3 × 4", "syntax_error", "'×'"),
        ("2 + 3 = 5", "syntax_error", "'='"),
        ("(2 + 3", "syntax_error", "well-formed"),
        ("", "syntax_error", "empty"),
        ("1+" * 150 + "1", "syntax_error", "limit is 200"),
        ("5 / (3 - 3)", "math_error", "3 - 3 is 0"),
    ],
)
def test_evaluator_rejects_what_is_not_plain_arithmetic(text, kind, words):
    result = evaluate_expression(text)
    assert result.value is None
    assert words in getattr(result, kind)


def test_hostile_expression_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    evaluation = score(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    assert not marker.exists()
    assert evaluation.breakdown["plausibility"] == 0.0


def test_nesting_beyond_the_depth_cap_is_rejected():
    deep = "-(" * (MAX_DEPTH + 1) + "7" + ")" * (MAX_DEPTH + 1)
    assert "nested" in evaluate_expression(deep).rule_error
    assert evaluate_expression("-(" * 3 + "7" + ")" * 3).value == -7


def test_usage_counts_numbers_as_a_multiset():
    assert usage_problem((7, 7), [7, 7, 3]) is None
    assert usage_problem((7, 7, 7), [7, 7, 3]) == "The number 7 is used 3 times but given twice."
    assert usage_problem((4,), [7, 3]) == "The number 4 is not among the given numbers."


# Verifier and feedback -------------------------------------------------------------------


def test_wrong_value_reports_the_value_reached():
    evaluation = score("50 + 25 + 3")
    assert evaluation.reward == 0.0
    assert (
        evaluation.feedback["correctness"] == "Your expression evaluates to 78, not the target 82."
    )
    assert "4 below the target 82" in evaluation.feedback["milestones"]
    assert evaluation.breakdown["plausibility"] == 1.0
    assert evaluation.breakdown["milestones"] == pytest.approx(1 - 4 / 82)


def test_closer_values_earn_more_milestone_credit():
    values = [
        score(e).breakdown["milestones"] for e in ("50 + 25 + 7", "50 + 25 + 3", "50 + 7", "3")
    ]
    assert values == sorted(values, reverse=True) and values[0] == 1.0 and values[-1] < values[-2]


def test_number_not_given_is_a_rule_break():
    evaluation = score("50 + 25 + 7 - 8 + 8")
    assert evaluation.feedback["plausibility"] == "The number 8 is not among the given numbers."
    assert evaluation.breakdown["plausibility"] == 0.0
    assert evaluation.reward == 0.0


def test_number_used_twice_is_a_rule_break():
    evaluation = score("7 * 7 + 25 + 3")
    assert evaluation.feedback["plausibility"] == "The number 7 is used twice but given once."
    assert "evaluates to 77" in evaluation.feedback["correctness"]


def test_writing_the_target_itself_earns_no_closeness():
    evaluation = score("82")
    assert evaluation.breakdown["milestones"] == 0.0
    assert "not among the given numbers" in evaluation.feedback["plausibility"]
    assert "breaks a rule" in evaluation.feedback["correctness"]


@pytest.mark.parametrize(
    ("expression", "ours", "theirs"),
    [
        ("50 - 25 - 7 - 3", 1.0, 1.0),  # every given number used: both accept
        ("25 - 7 - 3", 1.0, 0.05),  # a subset: accepted here, refused by reasoning-gym
    ],
)
def test_subset_rule_differs_from_reasoning_gym_as_the_readme_says(expression, ours, theirs):
    reasoning_gym = pytest.importorskip("reasoning_gym")
    # Its scorer parses with sympy (which uses eval): the adapter refuses it for model
    # output; here it only sees these fixed strings.
    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0)
    entry = {"metadata": {"numbers": HAND_NUMBERS, "target": 15}}
    assert scorer.score_answer(expression, entry) == theirs
    assert score(expression, target=15).reward == ours


def test_huge_values_are_scored_exactly_and_named_briefly():
    task = CountdownTask(max_expression_chars=1000)
    evaluation = score("9" * 400, task)  # 10**400 is too big for a float
    assert evaluation.breakdown["milestones"] == 0.0 and evaluation.reward == 0.0
    assert all(len(sentence) < 120 for sentence in evaluation.feedback.values())
    assert "999..." in evaluation.feedback["correctness"]
    assert "999..." in evaluation.feedback["plausibility"]


def test_duplicated_given_numbers_may_each_be_used():
    assert score("7 * 7 + 3", numbers=[3, 7, 7], target=52).reward == 1.0
    assert "used 3 times" in score("7 * 7 - 7", numbers=[3, 7, 7], target=42).feedback_text()


def test_division_by_zero_gives_feedback_not_a_crash():
    evaluation = score("50 / (25 - 25)", numbers=[25, 25, 50], target=2)
    assert evaluation.reward == 0.0
    assert "divides by zero" in evaluation.feedback["milestones"]


def test_fractional_value_is_named_as_such():
    evaluation = score("7 / 3 + 50")
    assert "157/3 (not a whole number)" in evaluation.feedback["correctness"]


def test_exact_fractions_may_reach_the_target():
    assert score("(50 + 7 / 7) * 3", numbers=[3, 7, 7, 50], target=153).reward == 1.0


def test_format_strictness():
    row = hand_row()
    thought = TASK.evaluate(row, "<think>50 + 25 = 75</think>\n<answer>50 + 25 + 7</answer>")
    assert thought.reward == 1.0
    chatty = TASK.evaluate(row, "Sure! <answer>50 + 25 + 7</answer> Done.")
    assert chatty.breakdown["format"] == 0.5 and chatty.reward == 0.0
    assert "outside the answer tag" in chatty.feedback["correctness"]
    missing = TASK.evaluate(row, "50 + 25 + 7")
    assert missing.error is not None and missing.reward == 0.0


def test_reveal_answer_adds_a_solution_only_when_enabled():
    assert "One solution" not in score("3").feedback["correctness"]
    revealing = CountdownTask(reveal_answer=True)
    assert "One solution is 50 + 25 + 7." in score("3", task=revealing).feedback["correctness"]


HOSTILE = [
    "",
    "<answer></answer>",
    "<answer>   </answer>",
    "x" * 1_000_000,
    "<answer>" * 200_000,
    "<answer>" + "1+" * 500_000 + "1</answer>",
    "\udcff\x00\ufffd",
    "<answer>\udcff\x00\ufffd</answer>",
    "<answer>__import__('os').system('echo hacked')</answer>",
    "<answer>9**9**9**9</answer>",
    "<answer>" + "(" * 99 + "7" + ")" * 99 + "</answer>",
    "<answer>" + "-" * 199 + "7</answer>",
    "<answer>lambda: 1</answer>",
    "<answer>{1: 2}</answer>",
    "</answer><answer>",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_score_low_with_feedback(completion):
    start = time.perf_counter()
    evaluation = TASK.evaluate(hand_row(), completion)
    assert time.perf_counter() - start < 1.0
    assert evaluation.reward < 1.0
    assert evaluation.feedback_text()
    assert set(evaluation.breakdown) == set(TASK.signals)
    assert all(0.0 <= v <= 1.0 for v in evaluation.breakdown.values())


# Property tests --------------------------------------------------------------------------

_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from("0123456789+-*/() .=x_'\"[]{}<>\\\n\x00\udcff\ufffd×÷"),
        st.characters(),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_random_text_never_raises(text):
    result = evaluate_expression(text)
    errors = [result.syntax_error, result.rule_error, result.math_error]
    assert (result.value is None) == any(e is not None for e in errors)
    evaluation = TASK.evaluate(hand_row(), f"<answer>{text}</answer>")
    assert evaluation.feedback_text()
    assert all(0.0 <= v <= 1.0 for v in evaluation.breakdown.values())


def _trees(numbers: list[int]):
    leaves = st.sampled_from(numbers)
    return st.recursive(
        leaves,
        lambda sub: st.one_of(
            st.tuples(st.sampled_from("+-*/"), sub, sub),
            st.tuples(st.just("neg"), sub),
        ),
        max_leaves=8,
    )


def _compute(tree) -> Fraction:
    """An independent evaluation of the generated tree."""
    if isinstance(tree, int):
        return Fraction(tree)
    if tree[0] == "neg":
        return -_compute(tree[1])
    op, left, right = tree[0], _compute(tree[1]), _compute(tree[2])
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise ZeroDivisionError
    return left / right


def _depth(tree) -> int:
    return 1 if isinstance(tree, int) else 1 + max(_depth(t) for t in tree[1:])


def _render(tree, spaces: str) -> str:
    if isinstance(tree, int):
        return str(tree)
    if tree[0] == "neg":
        return f"-({_render(tree[1], spaces)})"
    return f"({_render(tree[1], spaces)}{spaces}{tree[0]}{spaces}{_render(tree[2], spaces)})"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_expressions_evaluate_exactly(data):
    numbers = data.draw(st.lists(st.integers(0, 100), min_size=1, max_size=6))
    tree = data.draw(_trees(numbers))
    text = _render(tree, data.draw(st.sampled_from(["", " ", "  "])))
    assume(len(text) <= 200 and _depth(tree) < MAX_DEPTH)  # within the caps
    result = evaluate_expression(text)
    try:
        expected = _compute(tree)
    except ZeroDivisionError:
        assert result.value is None and "divides by zero" in result.math_error
    else:
        assert result.value == expected
        assert result.syntax_error is result.rule_error is result.math_error is None
