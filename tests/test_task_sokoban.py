"""Sokoban: reverse-play generator, push simulator and feedback."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks.sokoban import LEVELS, SYSTEM_PROMPT, Puzzle, SokobanTask, _replay

TASK = SokobanTask()

# A hand-made puzzle: player (2,3); boxes (2,2) and (3,3); goals (2,4) and (4,1).
HAND_MAP = [
    "######",
    "#____#",
    "#_$@.#",
    "#__$_#",
    "#.___#",
    "######",
]
# Worked out by hand: box (3,3) right then up onto (2,4); box (2,2) down twice, then left.
HAND_SOLUTION = "R D D L L U R D R U L L L U U R D D R D L"


def hand_row(rows: list[str] = HAND_MAP) -> dict:
    return TASK.make_row(1, SYSTEM_PROMPT, "\n".join(rows), HAND_SOLUTION, map=rows, boxes=2)


def score(plan: str, rows: list[str] = HAND_MAP):
    return TASK.evaluate(hand_row(rows), f"<answer>{plan}</answer>")


def puzzle_of(row: dict) -> Puzzle:
    return Puzzle.from_rows(json.loads(row["meta"])["map"])


# Generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_solves_every_level(level):
    for row in TASK.generate(level, 30, seed=level * 1000):
        evaluation = TASK.evaluate(row, TASK.reference(row))
        assert evaluation.reward == 1.0
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0)
        assert evaluation.feedback == {} and evaluation.error is None


def test_puzzles_are_well_formed_and_grow_with_level():
    previous = (0, 0, 0)
    for level in TASK.levels:
        height, width, boxes, inner_walls, _ = LEVELS[level]
        for row in TASK.generate(level, 10, seed=4):
            puzzle = puzzle_of(row)
            assert puzzle.rows() == json.loads(row["meta"])["map"]  # map text round-trips
            assert (puzzle.height, puzzle.width) == (height, width)
            assert len(puzzle.boxes) == len(puzzle.goals) == boxes
            assert not puzzle.boxes & puzzle.goals  # doing nothing puts no box on a goal
            border = {
                (r, c)
                for r in range(height)
                for c in range(width)
                if r in (0, height - 1) or c in (0, width - 1)
            }
            assert border <= puzzle.walls and len(puzzle.walls - border) == inner_walls
            assert "\n".join(puzzle.rows()) in row["prompt"][1]["content"]
        size = (height * width, boxes, inner_walls)
        assert all(a >= b for a, b in zip(size, previous, strict=True)) and size != previous
        previous = size


# Simulator and feedback -------------------------------------------------------------------


def test_hand_solution_solves_and_later_moves_are_ignored():
    assert score(HAND_SOLUTION).reward == 1.0
    assert score(HAND_SOLUTION + " U U U U L").reward == 1.0


def test_boxes_on_goals_are_counted():
    evaluation = score("R D D L L U R D R U")  # the first box is home
    assert evaluation.breakdown["milestones"] == 0.5 and evaluation.reward == 0.0
    assert evaluation.feedback["milestones"] == "1 of 2 boxes are on goals."
    assert "ends after 10 moves" in evaluation.feedback["correctness"]


def test_push_into_a_wall_is_the_first_illegal_move():
    evaluation = score("L L R R")
    assert evaluation.breakdown["plausibility"] == pytest.approx(1 / 4)
    assert evaluation.feedback["plausibility"] == "Move 2 (L) pushes the box at (2,1) into a wall."
    assert "illegal move 2" in evaluation.feedback["correctness"]


def test_walking_into_a_wall_is_illegal():
    evaluation = score("U U")
    assert evaluation.feedback["plausibility"] == "Move 2 (U) walks into a wall at (0,3)."


def test_push_into_another_box_is_illegal():
    rows = ["######", "#@$$.#", "#___.#", "######"]
    evaluation = score("R", rows)
    assert evaluation.breakdown["plausibility"] == 0.0
    assert (
        evaluation.feedback["plausibility"]
        == "Move 1 (R) pushes the box at (1,2) into another box at (1,3)."
    )


def test_corner_deadlock_is_named():
    evaluation = score("D L D R U")
    assert evaluation.breakdown["plausibility"] == 1.0  # a deadlock is legal, just hopeless
    assert evaluation.feedback["correctness"] == (
        "Move 4 (R) pushes a box into the corner at (4,4), where it can never reach a goal."
    )
    # A box pushed into a corner that is a goal, (4,1), is no deadlock.
    home = score("U L D D R D L")
    assert home.breakdown["milestones"] == 0.5
    assert (
        home.feedback["correctness"]
        == "The plan ends after 7 moves, before every box is on a goal."
    )


def test_reveal_answer_controls_whether_feedback_shows_a_solution():
    assert HAND_SOLUTION not in score("D").feedback["correctness"]
    revealed = SokobanTask(reveal_answer=True).evaluate(hand_row(), "<answer>D</answer>")
    assert revealed.feedback["correctness"].endswith(f"One solution is: {HAND_SOLUTION}.")


def test_format_problems_cost_correctness_not_progress():
    evaluation = TASK.evaluate(hand_row(), f"Plan: <answer>{HAND_SOLUTION.lower()}</answer>")
    assert evaluation.breakdown["format"] == 0.5 and evaluation.breakdown["milestones"] == 1.0
    assert evaluation.reward == 0.0 and "not exactly" in evaluation.feedback["correctness"]


def test_a_puzzle_solved_at_the_start_is_solved_by_any_plan():
    """Moves after the solve are ignored, so here every move is; feedback agrees (issue 8)."""
    solved = ["#####", "#@*_#", "#####"]  # the one box already stands on its goal
    for plan in ("U", "R", "L L"):  # into a wall, the box pushed off its goal, ...
        evaluation = score(plan, solved)
        assert evaluation.reward == 1.0 and evaluation.error is None, plan
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0), plan
        assert evaluation.feedback == {}, plan
    loose = TASK.evaluate(hand_row(solved), "Easy: <answer>U</answer>")
    assert loose.breakdown["milestones"] == 1.0 and loose.reward == 0.0
    assert "before every box" not in loose.feedback_text()
    assert loose.feedback["correctness"].startswith("Every box reaches a goal")


# Rules against reasoning-gym's sokoban scorer -----------------------------------------------

# Our map symbols -> reasoning-gym's (its prompt: * player, % player on a goal, @ box,
# X goal, $ box on a goal, + wall, - empty).
TO_REASONING_GYM = str.maketrans(
    {"#": "+", "_": "-", "@": "*", "+": "%", "$": "@", ".": "X", "*": "$"}
)
# One box right of the player with its goal beyond it, and floor beyond the goal.
LINE = ["#######", "#_@$._#", "#_____#", "#######"]


@pytest.mark.parametrize(
    ("plan", "ours", "theirs"),
    [
        ("R", 1.0, 1.0),  # a plain solution
        ("L R R", 1.0, 1.0),
        # An illegal move (U walks into the wall) ends the plan here; reasoning-gym skips it.
        ("U R", 0.0, 1.0),
        # Moves after the solve are ignored here; reasoning-gym replays them (R pushes the
        # box off its goal again).
        ("R R", 1.0, 0.0),
        # Moves must be separated here ("LRR" is one unreadable token); reasoning-gym reads
        # one move per character.
        ("LRR", 0.0, 1.0),
    ],
)
def test_rules_differ_from_reasoning_gym_as_the_readme_says(plan, ours, theirs):
    reasoning_gym = pytest.importorskip("reasoning_gym")
    scorer = reasoning_gym.create_dataset("sokoban", size=1, seed=0)
    gamestr = "\n".join(line.translate(TO_REASONING_GYM) for line in LINE)
    assert scorer.score_answer(plan, {"metadata": {"gamestr": gamestr}}) == theirs
    assert score(plan, LINE).reward == ours


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_bad_max_moves_is_rejected(bad):
    with pytest.raises(ValueError, match="max_moves"):
        SokobanTask(max_moves=bad)


HOSTILE = [
    "",
    "push the boxes",
    "\udcff\x00\ufffd",
    "<answer></answer>",
    "<answer>\ufffd \udcff</answer>",
    "<answer>" * 200_000,
    "y" * 1_000_000,
    "<answer>" + "U D " * 250_000 + "</answer>",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_score_low_with_feedback(completion):
    row = TASK.generate(5, 1, seed=0)[0]
    began = time.perf_counter()
    evaluation = TASK.evaluate(row, completion)
    assert time.perf_counter() - began < 2.0
    assert evaluation.reward < 1.0
    assert set(evaluation.breakdown) == set(TASK.signals)
    assert all(0.0 <= value <= 1.0 for value in evaluation.breakdown.values())
    text = evaluation.feedback_text()
    assert text and text.encode("utf-8")


# Properties -------------------------------------------------------------------------------

ROWS = [row for level in TASK.levels for row in TASK.generate(level, 2, seed=42)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ROWS), st.lists(st.sampled_from("UDLR"), min_size=1, max_size=80))
def test_random_plans_replay_within_bounds(row, moves):
    evaluation = TASK.evaluate(row, "<answer>" + " ".join(moves) + "</answer>")
    assert evaluation.error is None and evaluation.reward in (0.0, 1.0)
    assert all(0.0 <= evaluation.breakdown[name] <= 1.0 for name in TASK.signals)
    assert all(
        name in evaluation.feedback for name, value in evaluation.breakdown.items() if value < 1.0
    )


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ROWS), st.lists(st.sampled_from("UDLR"), max_size=80))
def test_pushes_keep_every_box_on_the_floor(row, moves):
    puzzle = puzzle_of(row)
    result = _replay(puzzle, moves)
    assert len(result.boxes) == len(puzzle.boxes)
    assert not any(puzzle.blocked(box) for box in result.boxes)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_in_the_tag_never_raises(text):
    evaluation = TASK.evaluate(ROWS[0], f"<answer>{text}</answer>")
    assert 0.0 <= evaluation.reward <= 1.0 and evaluation.feedback_text()
