"""FrozenLake played turn by turn: the environment, the replay that scores an episode, and
hostile calls and replies."""

from __future__ import annotations

import json

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.agent import MAX_REPLAYED_CALLS, environment_tools
from curriculum.tasks.base import HELD_OUT_SEED_BASE
from curriculum.tasks.frozenlake_agent import SYSTEM_PROMPT, TURN_LIMITS, FrozenLakeEnv

TASK = get_task("frozenlake_agent")

# SFF   start (0,0), hole (1,1), goal (2,2): 4 moves away
# FHF
# FFG
HAND_MAP = ["SFF", "FHF", "FFG"]


def hand_row(level: int = 1) -> dict:
    return TASK.make_row(
        level,
        SYSTEM_PROMPT,
        "\n".join(HAND_MAP),
        "R R D D",
        map=HAND_MAP,
        start=[0, 0],
        goal=[2, 2],
    )


def call(name, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def episode(*directions, reply="Done.", answered=True) -> list[dict]:
    """An episode of move calls, each answered by the environment itself."""
    env = FrozenLakeEnv()
    env.reset(**hand_row())
    messages = []
    for direction in directions:
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("move", {"direction": direction})],
            }
        )
        if answered:
            try:
                text = env.move(direction)
            except ValueError as err:
                text = str({"error": str(err)})
            messages.append({"role": "tool", "name": "move", "content": text})
    messages.append({"role": "assistant", "content": reply})
    return messages


def test_the_only_tool_is_move_with_a_schema_trl_can_show():
    from transformers.utils import get_json_schema

    tools = environment_tools(FrozenLakeEnv())
    assert [t.__name__ for t in tools] == ["move"]
    schema = get_json_schema(tools[0])
    assert schema["function"]["parameters"]["required"] == ["direction"]


def test_rows_are_deterministic_and_every_reference_fits_its_turn_limit():
    for level in TASK.levels:
        rows = TASK.generate(level, 30, seed=level)
        assert rows == TASK.generate(level, 30, seed=level)
        for row in rows:
            assert len(row["answer"].split()) <= TASK.turn_limit(level)
            assert f"You have {TURN_LIMITS[level]} moves." in row["prompt"][-1]["content"]
            assert TASK.evaluate(row, TASK.reference(row)).solved


def test_held_out_maps_are_not_training_maps():
    """Evaluation draws from seeds no training row uses, and skips a map the run trained on:
    small levels repeat maps across seeds (4x4 with 3 holes does within 300 draws)."""
    from curriculum.tasks.base import prompt_key
    from pipeline.evaluate.held_out import held_out_rows

    for level in (1, 2, 4):
        training = TASK.generate(level, 300, seed=0)
        trained = {prompt_key(row["prompt"]) for row in training}
        rows, overlap = held_out_rows(TASK, level, 64, HELD_OUT_SEED_BASE, trained)
        assert overlap == 0 and len(rows) == 64
        assert not {row["meta"] for row in rows} & {row["meta"] for row in training}, level


def test_moves_holes_edges_and_the_goal():
    env = FrozenLakeEnv()
    env.reset(**hand_row(level=3))  # 10 moves
    assert "no effect" in env.move("up") and env.position == (0, 0)  # the edge: no effect
    assert env.move("R").startswith("You moved right to (0,1).")
    assert "P" in env.move("left").splitlines()[1]  # the board marks the player
    assert env.move("down").startswith("You moved down to (1,0).")
    assert "hole" not in env.move("down")
    assert env.move("right").startswith("You moved right to (2,1).")
    assert "reached the goal" in env.move("right")
    assert "over" in env.move("up") and env.outcome == "goal"
    env.reset(**hand_row())
    env.move("right")
    assert "fell into a hole at (1,1)" in env.move("down")
    assert env.outcome == "hole" and env.position == (0, 1)  # the last safe cell


def test_the_turn_limit_refuses_more_moves_and_a_bad_direction_takes_no_turn():
    env = FrozenLakeEnv()
    env.reset(**hand_row())
    with pytest.raises(ValueError, match="up, down, left or right"):
        env.move("north")
    assert env.turns_left == TURN_LIMITS[1]
    for _ in range(TURN_LIMITS[1]):
        env.move("up")
    assert env.move("right").startswith("No moves left")
    assert env.position == (0, 0)


def test_the_verdict_and_the_papers_feedback():
    solved = TASK.evaluate(hand_row(), episode("right", "right", "down", "down"))
    assert solved.solved and solved.breakdown == {
        "format": 1.0,
        "correctness": 1.0,
        "milestones": 1.0,
    }

    hole = TASK.evaluate(hand_row(), episode("up", "right", "down"))
    assert hole.reward == 0.0 and hole.breakdown["milestones"] == pytest.approx(0.25)
    assert hole.feedback["correctness"] == (
        "Fell into a hole. 1 action(s) had no effect. Last action taken: down. "
        "Final state: in a hole at (1,1), 3 moves from the goal."
    )
    short = TASK.evaluate(hand_row(), episode("down"))
    assert short.feedback["correctness"].startswith("Stopped before the goal.")
    spent = TASK.evaluate(hand_row(), episode(*["up"] * (TURN_LIMITS[1] + 2)))
    assert spent.feedback["correctness"].startswith("Ran out of moves. 8 action(s) had no effect.")


def test_only_answered_calls_are_replayed():
    """TRL ends an episode at its turn cap with a turn whose calls never ran: the verdict
    is on what the model saw."""
    unanswered = episode("right", "right", "down", "down", answered=False)
    evaluation = TASK.evaluate(hand_row(), unanswered)
    assert not evaluation.solved and evaluation.breakdown["milestones"] == 0.0
    _, played = TASK.play(hand_row(), unanswered)
    assert played.unanswered == 4 and played.calls == []


def test_arguments_as_a_json_string_fail_as_trls_tool_loop_fails_them():
    """Some parsers leave a call's arguments as the JSON text. TRL's loop then runs
    `move(**text)`, which raises: the model reads the error and the agent does not move. The
    replay (the reward, the feedback) and the evaluation's episodes run the call the same
    way, so an episode whose every move was such a call is not solved."""
    from pipeline.evaluate.episodes import _Episode

    moves = [call("move", json.dumps({"direction": d})) for d in ("right", "right", "down", "down")]
    messages = []
    for move in moves:
        messages.append({"role": "assistant", "content": "", "tool_calls": [move]})
        messages.append({"role": "tool", "name": "move", "content": "whatever"})
    messages.append({"role": "assistant", "content": "Done."})
    evaluation = TASK.evaluate(hand_row(), messages)
    assert not evaluation.solved and evaluation.breakdown["format"] == 0.0
    _, played = TASK.play(hand_row(), messages)
    try:  # what TRL's loop runs, and the error text it replies with
        FrozenLakeEnv().move(**moves[0]["function"]["arguments"])
    except TypeError as err:
        trl_reply = str({"error": str(err)})
    assert [c.reply for c in played.calls] == [trl_reply] * 4
    assert _Episode(TASK, hand_row(), tokenizer=None)._run(moves[0]) == ("move", trl_reply)


HOSTILE_CALLS = {
    "unknown tool": call("jump", {"direction": "up"}),
    "arguments a string": call("move", "up"),
    "arguments deeply nested JSON": call("move", "[" * 100_000),
    "arguments a list": call("move", ["up"]),
    "arguments None": call("move", None),
    "wrong keyword": call("move", {"dir": "up"}),
    "code as a direction": call("move", {"direction": "__import__('os').system('touch pwned')"}),
    "a megabyte direction": call("move", {"direction": "u" * 1_000_000}),
    "no function": {"type": "function"},
    "name not a string": call(["move"], {"direction": "up"}),
    "not a dict": "move up",
}


@pytest.mark.parametrize("kind", HOSTILE_CALLS)
def test_hostile_tool_calls_never_raise_and_count_as_invalid(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [HOSTILE_CALLS[kind]]},
        {"role": "tool", "name": "move", "content": "whatever"},
        {"role": "assistant", "content": "Done."},
    ]
    evaluation = TASK.evaluate(hand_row(), messages)
    assert evaluation.breakdown["format"] == 0.0 and not evaluation.solved
    assert "invalid" in evaluation.feedback["format"]
    assert len(evaluation.feedback["format"]) < 400  # a megabyte argument is not echoed
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "completion",
    ["", "Done.", [], [1, 2], {"role": "assistant"}, [{"role": "tool", "content": None}], None, 7],
)
def test_hostile_replies_never_raise(completion):
    evaluation = TASK.evaluate(hand_row(), completion)
    assert not evaluation.solved and 0.0 <= evaluation.reward <= 1.0
    assert evaluation.feedback_text().strip()


def test_a_flood_of_calls_is_cut_at_the_replay_cap():
    calls = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("move", {"direction": "up"})] * (MAX_REPLAYED_CALLS + 5),
        }
    ]
    calls.append({"role": "tool", "name": "move", "content": "x"})
    calls[1:1] = [{"role": "tool", "name": "move", "content": "x"}] * (MAX_REPLAYED_CALLS + 4)
    _, played = TASK.play(hand_row(), calls)
    assert len(played.calls) == MAX_REPLAYED_CALLS + 5
    assert len(played.invalid_calls) == 5


def test_meta_holds_what_reset_reads():
    row = TASK.generate(3, 1, seed=4)[0]
    meta = json.loads(row["meta"])
    env = FrozenLakeEnv()
    assert env.reset(**row) is None
    assert env.grid == meta["map"] and env.position == tuple(meta["start"])


def test_reward_functions_score_an_episode_without_the_prompt():
    """Reward functions called outside TRL may get no `prompts`: the replay needs only the
    row's columns (it once built the prompt and raised on None)."""
    from rewards import build_reward_funcs

    rows = TASK.generate(2, 4, seed=7)
    funcs, _ = build_reward_funcs(TASK, {"correctness": 1.0})
    columns = {k: [r[k] for r in rows] for k in ("task", "level", "answer", "meta")}
    completions = [TASK.reference(r) for r in rows[:2]] + [[], "no"]
    assert funcs[0](completions=completions, **columns) == [1.0, 1.0, 0.0, 0.0]
