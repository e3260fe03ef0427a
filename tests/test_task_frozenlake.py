"""FrozenLake: generator, simulator, feedback and the shared move-plan parser."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks.frozenlake import LEVELS, SYSTEM_PROMPT, FrozenLakeTask
from curriculum.tasks.move_plan import MOVES, parse_plan

TASK = FrozenLakeTask()

# A hand-made map whose outcomes are easy to work out:
#   SFF      start (0,0), hole (1,1), goal (2,2); the goal is 4 moves away
#   FHF
#   FFG
HAND_MAP = ["SFF", "FHF", "FFG"]


def hand_row(task: FrozenLakeTask = TASK) -> dict:
    return task.make_row(
        1, SYSTEM_PROMPT, "\n".join(HAND_MAP), "R R D D", map=HAND_MAP, start=[0, 0], goal=[2, 2]
    )


def score(completion: str, task: FrozenLakeTask = TASK):
    return task.evaluate(hand_row(task), completion)


def grid_of(row: dict) -> list[str]:
    return json.loads(row["meta"])["map"]


# Generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_solves_every_level(level):
    for row in TASK.generate(level, 40, seed=level * 1000):
        evaluation = TASK.evaluate(row, TASK.reference(row))
        assert evaluation.reward == 1.0
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0)
        assert evaluation.feedback == {}
        assert evaluation.error is None


@pytest.mark.parametrize("level", [1, 2])
def test_reference_is_a_shortest_plan(level):
    # Exhaustive: no plan one move shorter reaches the goal (small levels only: 4^n plans).
    for row in TASK.generate(level, 10, seed=5):
        length = len(row["answer"].split())
        for plan in itertools.product("UDLR", repeat=length - 1):
            completion = "<answer>" + " ".join(plan) + "</answer>"
            assert TASK.evaluate(row, completion).reward == 0.0


def test_maps_are_well_formed_and_grow_with_level():
    previous = (0, 0.0)
    for level in TASK.levels:
        size, holes = LEVELS[level]
        for row in TASK.generate(level, 10, seed=3):
            grid = grid_of(row)
            text = "".join(grid)
            assert len(grid) == size and all(len(line) == size for line in grid)
            assert text.count("S") == 1 and text.count("G") == 1 and text.count("H") == holes
            assert set(text) <= set("SFHG")
            assert "\n".join(grid) in row["prompt"][1]["content"]
        density = holes / size**2
        assert size > previous[0] and density >= previous[1] * 0.9
        previous = (size, density)


# Simulator and feedback -------------------------------------------------------------------


def test_hole_feedback_names_the_step_and_cells():
    evaluation = score("<answer>R D</answer>")
    assert evaluation.reward == 0.0
    assert evaluation.breakdown["plausibility"] == 1.0  # falling in is legal, just fatal
    assert evaluation.breakdown["milestones"] == pytest.approx(1 - 3 / 4)  # stopped at (0,1)
    assert evaluation.feedback["correctness"] == "Step 2 (D) moves from (0,1) into a hole at (1,1)."


def test_leaving_the_map_is_implausible():
    evaluation = score("<answer>R R R D</answer>")
    assert evaluation.breakdown["plausibility"] == pytest.approx(2 / 4)
    assert evaluation.feedback["plausibility"] == "Step 3 (R) leaves the map from (0,2)."
    assert "step 3" in evaluation.feedback["correctness"]
    assert score("<answer>U</answer>").breakdown["plausibility"] == 0.0


def test_stopping_short_reports_position_and_distance():
    evaluation = score("<answer>R R D</answer>")
    assert evaluation.breakdown["milestones"] == pytest.approx(0.75)
    assert (
        evaluation.feedback["correctness"] == "The plan stops at (1,2), 1 move short of the goal."
    )
    assert "1 move from the goal" in evaluation.feedback["milestones"]


def test_any_path_to_the_goal_solves_and_later_moves_are_ignored():
    assert score("<answer>D D R R</answer>").reward == 1.0
    assert score("<answer>R R D D L L U U</answer>").reward == 1.0


def test_format_is_lenient_in_case_and_separators_but_strict_around_the_tag():
    assert score("<answer>r,r, d\nd</answer>").reward == 1.0
    loose = score("Sure! <answer>R R D D</answer>")
    assert loose.breakdown["format"] == 0.5 and loose.breakdown["milestones"] == 1.0
    assert loose.reward == 0.0 and "no text before or after" in loose.feedback["format"]
    bad_token = score("<answer>R R X D</answer>")  # replay stops at the bad token
    assert bad_token.breakdown["format"] == 0.5
    assert "Token 3 'X'" in bad_token.feedback["format"]
    assert bad_token.feedback["correctness"].startswith("The plan stops at (0,2)")
    assert score("<answer>RRDD</answer>").error is not None  # moves must be separated


def test_parser_reads_the_last_answer_tag_and_allows_no_think_block():
    # The last tag, as in every family: a model that corrects itself is scored on its fix.
    corrected = parse_plan("<answer>U</answer> no: <answer>R R D D</answer>", 200)
    assert corrected.moves == ["R", "R", "D", "D"] and not corrected.strict
    assert score("<answer>U</answer> no: <answer>R R D D</answer>").breakdown["milestones"] == 1.0
    thought = parse_plan("<think>right, then down</think><answer>R R D D</answer>", 200)
    assert thought.moves == ["R", "R", "D", "D"] and not thought.strict


def test_reveal_answer_controls_whether_feedback_shows_a_plan():
    assert "R R D D" not in score("<answer>R</answer>").feedback["correctness"]
    revealed = score("<answer>R</answer>", FrozenLakeTask(reveal_answer=True))
    assert revealed.feedback["correctness"].endswith("A shortest plan is: R R D D.")


def test_plan_length_is_capped():
    task = FrozenLakeTask(max_moves=5)
    evaluation = score("<answer>" + "D D R R " + "U " * 10 + "</answer>", task)
    assert "more than 5 moves" in evaluation.feedback["format"]
    assert evaluation.breakdown["milestones"] == 1.0 and evaluation.reward == 0.0
    assert parse_plan("<answer>" + "U " * 9 + "</answer>", 5).moves == ["U"] * 5


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True])
def test_bad_max_moves_is_rejected(bad):
    with pytest.raises(ValueError, match="max_moves"):
        FrozenLakeTask(max_moves=bad)


HOSTILE = [
    "",
    "   ",
    "I would go right, then down.",
    "\udcff\x00\ufffd",
    "<answer>",
    "</answer><answer>",
    "<answer></answer>",
    "<answer>\udcff\x00</answer>",
    "<answer>UP DOWN</answer>",
    "<answer>" * 200_000,
    "x" * 1_000_000,
    "<answer>" + "R " * 500_000 + "</answer>",
    "<answer>" + "L" * 1_000_000 + "</answer>",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_score_low_with_feedback(completion):
    row = TASK.generate(6, 1, seed=0)[0]
    began = time.perf_counter()
    evaluation = TASK.evaluate(row, completion)
    assert time.perf_counter() - began < 2.0  # big completions are read only up to the cap
    assert evaluation.reward < 1.0
    assert set(evaluation.breakdown) == set(TASK.signals)
    assert all(0.0 <= value <= 1.0 for value in evaluation.breakdown.values())
    text = evaluation.feedback_text()
    assert text and text.encode("utf-8")  # no raw lone surrogates reach the feedback


# Properties -------------------------------------------------------------------------------

ROWS = [row for level in TASK.levels for row in TASK.generate(level, 2, seed=42)]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(1, 300))
def test_parser_never_raises_and_respects_the_cap(text, cap):
    for completion in (text, f"<answer>{text}</answer>"):
        plan = parse_plan(completion, cap)
        assert len(plan.moves) <= cap and set(plan.moves) <= set(MOVES)
        assert (plan.error is None) == bool(plan.moves)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("UDLRudlr"), min_size=1, max_size=50),
    st.sampled_from([" ", ",", ", ", "\n"]),
    st.integers(1, 60),
)
def test_parser_reads_back_any_well_formed_plan(moves, separator, cap):
    plan = parse_plan("<answer>" + separator.join(moves) + "</answer>", cap)
    assert plan.moves == [move.upper() for move in moves[:cap]]
    assert plan.strict == (len(moves) <= cap)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ROWS), st.lists(st.sampled_from("UDLR"), min_size=1, max_size=60))
def test_random_plans_replay_within_bounds(row, moves):
    evaluation = TASK.evaluate(row, "<answer>" + " ".join(moves) + "</answer>")
    assert evaluation.error is None and evaluation.reward in (0.0, 1.0)
    assert all(0.0 <= evaluation.breakdown[name] <= 1.0 for name in TASK.signals)
    # Every failed signal explains itself.
    assert all(
        name in evaluation.feedback for name, value in evaluation.breakdown.items() if value < 1.0
    )
