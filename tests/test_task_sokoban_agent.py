"""Sokoban played turn by turn: the environment's pushes, the turn limit, replay of hostile
episodes and the feedback, on the real classes (no model)."""

from __future__ import annotations

import json

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.agent import environment_tools
from curriculum.tasks.base import HELD_OUT_SEED_BASE
from curriculum.tasks.sokoban import LEVELS, SokobanTask
from curriculum.tasks.sokoban_agent import (
    SYSTEM_PROMPT,
    TURN_LIMITS,
    SokobanAgentTask,
    SokobanEnv,
)

TASK = SokobanAgentTask()

# sokoban's hand-made puzzle: player (2,3); boxes (2,2) and (3,3); goals (2,4) and (4,1).
HAND_MAP = [
    "######",
    "#____#",
    "#_$@.#",
    "#__$_#",
    "#.___#",
    "######",
]
HAND_SOLUTION = "R D D L L U R D R U L L L U U R D D R D L"
NAMES = {"U": "up", "D": "down", "L": "left", "R": "right"}


def hand_row(level: int = 2, rows: list[str] = HAND_MAP) -> dict:
    """A row of the hand-made puzzle; level 2 allows 28 moves, level 1 allows 12."""
    return TASK.make_row(level, SYSTEM_PROMPT, "\n".join(rows), HAND_SOLUTION, map=rows, boxes=2)


def call(name, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def episode(*calls, reply: str = "Done.") -> list[dict]:
    """An episode of one call per turn, each answered, then the closing reply. A call is a
    direction (a `move` call) or a whole tool-call object."""
    messages: list[dict] = []
    for item in calls:
        tool_call = call("move", {"direction": item}) if isinstance(item, str) else item
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append({"role": "tool", "name": "move", "content": "(reply)"})
    messages.append({"role": "assistant", "content": reply})
    return messages


def moves(plan: str) -> list[str]:
    return [NAMES[m] for m in plan.split()]


def fresh_env(row: dict | None = None) -> SokobanEnv:
    environment, _ = TASK.start(row or hand_row())
    return environment


def maps(rows: list[dict]) -> list[tuple[str, ...]]:
    return [tuple(json.loads(row["meta"])["map"]) for row in rows]


# Rows ------------------------------------------------------------------------------------


def test_registered_with_one_tool_and_turn_limits_for_every_level():
    assert isinstance(get_task("sokoban_agent"), SokobanAgentTask)
    assert TASK.num_levels == len(LEVELS) and set(TURN_LIMITS) == set(LEVELS)
    assert [TASK.turn_limit(level) for level in TASK.levels] == [12, 28, 40, 40, 60]
    assert TASK.max_turns() == 60
    # Only `move` is offered to the model: no state-setting method is a tool.
    assert [tool.__name__ for tool in environment_tools(fresh_env())] == ["move"]


def test_generation_is_deterministic_and_uses_sokobans_puzzles():
    sokoban = SokobanTask()
    for level in TASK.levels:
        rows = TASK.generate(level, 20, seed=3)
        assert rows == TASK.generate(level, 20, seed=3) == SokobanAgentTask().generate(level, 20, 3)
        assert maps(rows) != maps(TASK.generate(level, 20, seed=4))
        for row, puzzle in zip(rows, sokoban.generate(level, 20, seed=3), strict=True):
            assert row["task"] == "sokoban_agent" and row["level"] == level
            assert row["meta"] == puzzle["meta"] and row["answer"] == puzzle["answer"]
            system, user = (m["content"] for m in row["prompt"])
            assert system == SYSTEM_PROMPT and "move tool once per turn" in system
            assert (
                user == puzzle["prompt"][1]["content"] + f"\nYou have {TURN_LIMITS[level]} moves."
            )


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_plans_fit_the_turn_limit(level):
    """sokoban's own plans, training and held-out draws: the limit is above the longest
    (over 20,000 draws per level the longest were 8, 23, 31, 32 and 50 moves)."""
    sokoban = SokobanTask()
    for seed in (0, HELD_OUT_SEED_BASE):
        longest = max(len(row["answer"].split()) for row in sokoban.generate(level, 300, seed))
        assert longest <= TURN_LIMITS[level], (level, seed, longest)


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_solves_every_level_within_its_turn_limit(level):
    for row in TASK.generate(level, 60, seed=level * 1000) + TASK.generate(
        level, 20, seed=HELD_OUT_SEED_BASE
    ):
        calls, reply = TASK.solution(row)
        assert 1 <= len(calls) <= TASK.turn_limit(level) and reply == "Done."
        messages = TASK.reference(row)
        assert messages[-1] == {"role": "assistant", "content": "Done."}
        assert messages[-2]["content"].endswith(
            "All boxes are on goals! Reply with a short final message."
        )
        environment, played = TASK.play(row, messages)
        assert environment.solved and environment.no_effect == 0
        assert environment.turns_left == TASK.turn_limit(level) - len(calls) >= 0
        evaluation = TASK.judge(row, environment, played)
        assert evaluation.reward == 1.0 and evaluation.error is None
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0)
        assert evaluation.feedback == {}


def test_a_puzzle_whose_plan_would_not_fit_is_drawn_again(monkeypatch):
    """The guard behind the limits, seen with a limit below many of level 5's plans."""
    monkeypatch.setitem(TURN_LIMITS, 5, 20)
    rows = TASK.generate(5, 40, seed=0)
    assert rows == TASK.generate(5, 40, seed=0)
    assert max(len(row["answer"].split()) for row in rows) <= 20
    sokoban = SokobanTask().generate(5, 40, seed=0)
    redrawn = [a["meta"] != b["meta"] for a, b in zip(rows, sokoban, strict=True)]
    assert redrawn == [len(row["answer"].split()) > 20 for row in sokoban] and any(redrawn)
    assert all(row["prompt"][1]["content"].endswith("You have 20 moves.") for row in rows)


def test_held_out_rows_are_new_puzzles_from_level_three():
    """200 training draws against 200 held-out draws per level. Levels 1 and 2 are small
    rooms with few puzzles: at level 1 about 128 distinct puzzles exist at all (5,000
    draws), so 166 of the 200 held-out rows repeat a training map; at level 2, 10 do.
    `pipeline.evaluate.first_attempts` skips such prompts. From level 3 none repeat."""
    overlap = {}
    for level in TASK.levels:
        training = set(maps(TASK.generate(level, 200, seed=0)))
        held_out = maps(TASK.generate(level, 200, seed=HELD_OUT_SEED_BASE))
        overlap[level] = sum(m in training for m in held_out)
    assert overlap == {1: 166, 2: 10, 3: 0, 4: 0, 5: 0}


# The environment -------------------------------------------------------------------------


def test_moves_walls_and_the_board():
    environment = fresh_env()
    assert environment.turns_left == 28 and environment.boxes == {(2, 2), (3, 3)}
    assert environment.move("up") == (
        "You moved up to (1,3).\n"
        + "\n".join(["######", "#__@_#", "#_$_.#", "#__$_#", "#.___#", "######"])
        + "\nMoves left: 27."
    )
    reply = environment.move(" UP ")  # case and spaces do not matter; a wall is above
    assert reply.startswith("Your move up had no effect: a wall is there.\n")
    assert reply.endswith("Moves left: 26.")
    assert environment.player == (1, 3) and environment.no_effect == 1
    environment.move("D")
    reply = environment.move("r")  # the player onto a goal is shown as +
    assert "#_$_+#" in reply.splitlines() and environment.player == (2, 4)
    assert environment.moves == ["U", "U", "D", "R"]


def test_pushes_move_boxes_and_blocked_pushes_have_no_effect():
    environment = fresh_env()
    reply = environment.move("left")
    assert reply.startswith("You pushed the box left at (2,1).\n")
    assert environment.boxes == {(2, 1), (3, 3)} and environment.player == (2, 2)
    reply = environment.move("left")  # the box is against the wall
    assert reply.startswith("Your move left had no effect: the box cannot move there.\n")
    assert environment.boxes == {(2, 1), (3, 3)} and environment.player == (2, 2)
    assert environment.no_effect == 1 and environment.turns_left == 26

    two = fresh_env(hand_row(2, ["######", "#@$$.#", "#___.#", "######"]))
    assert two.move("right").startswith("Your move right had no effect: the box cannot move")
    assert two.boxes == {(1, 2), (1, 3)} and two.player == (1, 1)


def test_a_box_on_a_goal_counts_and_every_box_home_ends_the_episode():
    row = hand_row()
    environment = fresh_env(row)
    replies = [environment.move(m) for m in moves(HAND_SOLUTION)[:10]]
    assert replies[-1].startswith("You pushed the box up onto a goal at (2,4).")
    assert environment.boxes == {(2, 2), (2, 4)} and not environment.solved
    evaluation = TASK.evaluate(row, episode(*moves(HAND_SOLUTION)[:10]))
    assert evaluation.breakdown == {"format": 1.0, "correctness": 0.0, "milestones": 0.5}
    assert evaluation.feedback["milestones"] == "1 of 2 boxes are on goals."

    replies = [environment.move(m) for m in moves(HAND_SOLUTION)[10:]]
    assert replies[-1] == (
        "You pushed the box left onto a goal at (4,1). "
        "All boxes are on goals! Reply with a short final message."
    )
    assert environment.solved and environment.boxes == {(2, 4), (4, 1)}
    left = environment.turns_left
    assert environment.move("up") == "The episode is over; reply with a short final message."
    assert environment.turns_left == left and environment.no_effect == 1
    assert environment.boxes == {(2, 4), (4, 1)}
    # Moves after the solve change nothing: still solved, every call valid.
    evaluation = TASK.evaluate(row, episode(*moves(HAND_SOLUTION), "up", "left"))
    assert evaluation.reward == 1.0 and evaluation.breakdown["format"] == 1.0


def test_the_turn_limit_refuses_extra_moves():
    row = hand_row(level=1)
    environment = fresh_env(row)
    for _ in range(6):
        environment.move("up")
        environment.move("down")
    assert environment.turns_left == 0 and len(environment.moves) == 12
    assert environment.move("left") == "No moves left; reply with a short final message."
    assert environment.boxes == {(2, 2), (3, 3)} and environment.player == (2, 3)
    assert len(environment.moves) == 12 and environment.no_effect == 1
    evaluation = TASK.evaluate(row, episode(*["up", "down"] * 6, "left"))
    assert evaluation.reward == 0.0 and evaluation.breakdown["format"] == 1.0
    assert "Ran out of moves after 12." in evaluation.feedback["correctness"]
    assert "1 action(s) had no effect." in evaluation.feedback["correctness"]


def test_a_bad_direction_raises_one_line_and_takes_no_turn():
    environment = fresh_env()
    for bad in ("north", "", "__import__('os')", "A" * 1_000_000, None, 3, ["up"], "u p"):
        with pytest.raises(ValueError) as error:
            environment.move(bad)
        message = str(error.value)
        assert "\n" not in message and len(message) < 100, message
        assert message.startswith("direction must be up, down, left or right, got ")
    assert environment.turns_left == 28 and environment.moves == []
    assert environment.no_effect == 0


def test_reset_clears_the_last_episode():
    """Environments are pooled: a reset leaves nothing of the episode before."""
    environment = fresh_env()
    for direction in moves(HAND_SOLUTION):
        environment.move(direction)
    environment.move("up")
    assert environment.solved
    row = TASK.generate(3, 1, seed=2)[0]
    environment.reset(**row)
    start = json.loads(row["meta"])["map"]
    assert environment._board() == "\n".join(start)
    assert environment.moves == [] and environment.no_effect == 0 and not environment.solved
    assert environment.turns_left == 40


# Feedback --------------------------------------------------------------------------------


def test_feedback_is_a_summary_of_the_episode():
    evaluation = TASK.evaluate(hand_row(), episode("up", "up"))
    assert evaluation.reward == 0.0
    assert evaluation.breakdown == {"format": 1.0, "correctness": 0.0, "milestones": 0.0}
    assert evaluation.feedback == {
        "correctness": "Not solved: 0 of 2 boxes on goals. 1 action(s) had no effect. Last "
        "action taken: up. Final state: you at (1,3), boxes off the goals at (2,2), (3,3).",
        "milestones": "0 of 2 boxes are on goals.",
    }


def test_feedback_names_a_box_stuck_in_a_corner():
    evaluation = TASK.evaluate(hand_row(), episode(*moves("D L D R U")))
    assert (
        "The box at (4,4) is stuck in a corner off the goals (a deadlock)"
        in evaluation.feedback["correctness"]
    )
    # A box pushed into a corner that is a goal, (4,1), is no deadlock.
    home = TASK.evaluate(hand_row(), episode(*moves("U L D D R D L")))
    assert home.breakdown["milestones"] == 0.5
    assert "stuck" not in home.feedback["correctness"]


def test_no_tool_call_is_said_and_scores_nothing():
    evaluation = TASK.evaluate(hand_row(), "I would push the box left.")
    assert evaluation.breakdown == {"format": 0.0, "correctness": 0.0, "milestones": 0.0}
    assert evaluation.feedback["format"].startswith("No tool was called")
    assert "No move was made." in evaluation.feedback["correctness"]


# Hostile episodes -----------------------------------------------------------------------


def test_hostile_tool_calls_are_invalid_and_never_run(tmp_path):
    pwned = tmp_path / "pwned"
    hostile = {
        "unknown tool": call("push", {"direction": "up"}),
        "arguments a string": call("move", "up"),
        "arguments a list": call("move", ["up"]),
        "arguments None": call("move", None),
        "wrong keyword": call("move", {"dir": "up"}),
        "extra keyword": call("move", {"direction": "up", "force": True}),
        "code as direction": call(
            "move", {"direction": f"__import__('os').system('touch {pwned}')"}
        ),
        "1 MB direction": call("move", {"direction": "up" * 500_000}),
        "no function": {"type": "function", "name": "move"},
        "function not a dict": {"type": "function", "function": "move(up)"},
        "name not a string": call(["move"], {"direction": "up"}),
        "call not a dict": "move(direction='up')",
    }
    row = hand_row()
    for kind, bad in hostile.items():
        environment, played = TASK.play(row, episode(bad, "left"))
        assert len(played.calls) == 2, kind
        first, second = played.calls
        assert not first.valid and first.reply.startswith("{'error': "), kind
        assert len(first.reply) < 300, kind
        assert second.valid, kind
        assert environment.moves == ["L"] and environment.turns_left == 27, kind
        evaluation = TASK.judge(row, environment, played)
        assert evaluation.breakdown["format"] == 0.5, kind
        assert evaluation.feedback["format"].startswith("1 of 2 tool calls were invalid"), kind
        assert evaluation.reward == 0.0 and 0.0 <= evaluation.breakdown["milestones"] <= 1.0
    assert not pwned.exists()
    # Arguments as JSON text, as some parsers leave them, fail as TRL's tool loop fails them
    # (`move(**text)` raises): the agent did not move.
    _, played = TASK.play(row, episode(call("move", '{"direction": "up"}')))
    assert not played.calls[0].valid and "must be a mapping, not str" in played.calls[0].reply


def test_unanswered_calls_are_not_replayed():
    row = hand_row()
    messages = TASK.reference(row)
    # The last call of the solution with no tool reply: the puzzle stays unsolved.
    environment, played = TASK.play(row, messages[:-2])
    assert played.unanswered == 1 and not environment.solved
    assert len(environment.moves) == len(HAND_SOLUTION.split()) - 1
    assert TASK.evaluate(row, messages[:-2]).reward == 0.0
    # Two calls in one turn and one reply: only the first runs.
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("move", {"direction": d}) for d in ("up", "left")],
    }
    environment, played = TASK.play(row, [turn, {"role": "tool", "content": "x"}])
    assert played.unanswered == 1 and environment.moves == ["U"]


@pytest.mark.parametrize(
    ("reply", "malformed"),
    [
        ("plain text", False),
        ("", False),
        ([], False),
        ({"role": "assistant", "content": "hi"}, False),
        ({"role": "assistant", "tool_calls": "move up"}, False),
        ([{"role": "assistant", "tool_calls": {"function": {"name": "move"}}}], False),
        ([1, 2], True),
        (["a", None], True),
        (None, True),
        (42, True),
    ],
)
def test_hostile_replies_never_raise_and_score_in_range(reply, malformed):
    row = TASK.generate(2, 1, seed=7)[0]
    evaluation = TASK.evaluate(row, reply)
    assert 0.0 <= evaluation.reward < 1.0 and not evaluation.solved
    assert all(0.0 <= value <= 1.0 for value in evaluation.breakdown.values())
    assert set(evaluation.breakdown) == set(TASK.signals)
    assert evaluation.feedback_text().strip()
    if malformed:  # not messages at all: nothing replayed, every signal 0, the error said
        assert evaluation.error == "The reply is not an episode of chat messages."
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 0.0)
    else:
        assert evaluation.error is None and evaluation.feedback["format"]
