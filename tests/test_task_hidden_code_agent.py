"""Hidden code played as an agent: the code and splits it shares with hidden_code, the
environment, the replay that scores an episode, and hostile calls."""

from __future__ import annotations

import json

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.agent import environment_tools
from curriculum.tasks.base import HELD_OUT_SEED_BASE
from curriculum.tasks.hidden_code import LEVELS
from curriculum.tasks.hidden_code_agent import HiddenCodeEnv

TASK = get_task("hidden_code_agent")


def call(name, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def episode(row: dict, entries: list, reply: str = "Done.") -> list[dict]:
    """An episode of enter calls, each answered as TRL's tool loop answers it."""
    env = HiddenCodeEnv()
    env.reset(**row)
    messages = []
    for arguments in entries:
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [call("enter", arguments)]}
        )
        try:
            text = env.enter(**arguments)
        except Exception as err:  # TRL shows the error to the model
            text = str({"error": str(err)})
        messages.append({"role": "tool", "name": "enter", "content": text})
    messages.append({"role": "assistant", "content": reply})
    return messages


def row_and_code(level: int = 1, seed: int = 3):
    row = TASK.generate(level, 1, seed=seed)[0]
    symbols = TASK.meta(row)["symbols"]
    return row, list(zip(symbols, str(row["answer"])))


def test_rows_are_hidden_codes_rows_with_an_agents_prompt():
    """Same code, same combinations and splits as hidden_code; the same rows for a seed."""
    code_task = get_task("hidden_code", rule_seed=4)
    agent = get_task("hidden_code_agent", rule_seed=4)
    for level in (1, 2, 3):
        assert agent.code(level) == code_task.code(level)
        for seed in (0, HELD_OUT_SEED_BASE + 7):
            mine, theirs = agent.generate(level, 20, seed), code_task.generate(level, 20, seed)
            assert [r["prompt"][1:] for r in mine] == [r["prompt"][1:] for r in theirs]
            assert [r["answer"] for r in mine] == [r["answer"] for r in theirs]
            assert mine == agent.generate(level, 20, seed)  # deterministic
        assert "enter tool" in agent.generate(level, 1)[0]["prompt"][0]["content"]
        assert agent.turn_limit(level) == LEVELS[level][1]
    assert get_task("hidden_code_agent", rule_seed=5).code(1) != agent.code(1)


def test_held_out_combinations_are_never_trained_on():
    for level in (1, 2):
        train = {tuple(TASK.meta(r)["symbols"]) for r in TASK.generate(level, 400, seed=0)}
        held = {
            tuple(TASK.meta(r)["symbols"])
            for r in TASK.generate(level, 200, seed=HELD_OUT_SEED_BASE)
        }
        assert train and held and not train & held
        assert held <= set(TASK.combinations(level, "held_out"))


def test_the_solution_solves_and_each_wrong_digit_is_named_with_its_fix():
    row, code = row_and_code()
    letters = " ".join(letter for letter, _ in code)
    assert TASK.start(row)[1][-1]["content"] == f"{letters}\nLeft to enter: {letters}."
    assert TASK.evaluate(row, TASK.reference(row)).breakdown == {
        "format": 1.0, "correctness": 1.0, "milestones": 1.0,
    }  # fmt: skip
    wrong = [{"entry": f"{letter}={(int(d) + 1) % 10}"} for letter, d in code[:1]]
    wrong += [{"entry": f"{letter}={d}"} for letter, d in code[1:]]
    result = TASK.evaluate(row, episode(row, wrong))
    assert result.reward == 0.0 and result.breakdown["milestones"] == pytest.approx(2 / 3)
    entered = " ".join(e["entry"] for e in wrong)
    letter, digit = code[0]
    assert result.feedback["correctness"] == f"Entered {entered}: wrong: {letter}={digit}."
    # the tool never tells: its replies are the same for a right and a wrong digit
    assert "wrong" not in json.dumps(episode(row, wrong)).lower()


def test_nothing_entered_names_every_letter():
    row, code = row_and_code()
    result = TASK.evaluate(row, "I do not know.")
    named = " ".join(dict.fromkeys(f"{letter}={digit}" for letter, digit in code))
    assert result.feedback["correctness"] == f"Nothing was entered: {named}."
    assert result.breakdown["format"] == 0.0


def test_hostile_calls_are_invalid_and_never_raise():
    row, code = row_and_code()
    (letter, digit), rest = code[0], code[1:]
    good = [{"entry": f"{x}={d}"} for x, d in rest]
    right = f"{letter}={digit}"
    hostile = [
        [call("enter", json.dumps({"entry": right}))],  # a JSON string
        [call("enter", {"entry": right.lower()})],
        [call("enter", {"entry": f"{letter}=12"})],
        [call("enter", {"entry": f"{letter}={digit} {letter}={digit}"})],
        [call("enter", {"entry": 3})],
        [call("enter", {})],  # a missing argument
        [call("enter", {"entry": right, "extra": 1})],
        [call("unlock", {"entry": right})],
        ["not a call"],
        [call("enter", {"entry": "x" * 10**6})],
    ]
    for calls in hostile:
        messages = [{"role": "assistant", "content": "", "tool_calls": calls},
                    {"role": "tool", "name": "enter", "content": "?"}]  # fmt: skip
        messages += episode(row, good)
        result = TASK.evaluate(row, messages)
        assert result.reward == 0.0 and result.breakdown["format"] < 1.0, calls
        assert "invalid" in result.feedback["format"]
    # spaces around an entry are no error
    spaced = [{"entry": f" {x}={d} "} for x, d in code]
    assert TASK.evaluate(row, episode(row, spaced)).reward == 1.0


def test_entries_past_the_word_are_refused_and_extra_ones_cost():
    row, code = row_and_code()
    entries = [{"entry": f"{x}={d}"} for x, d in code]
    played = episode(row, entries + entries[:1])
    assert "already entered" in played[-2]["content"]
    result = TASK.evaluate(row, played)
    assert result.reward == 1.0  # the refused call entered nothing
    env = HiddenCodeEnv()
    env.reset(**row)
    assert [t.__name__ for t in environment_tools(env)] == ["enter"]
    env.reset(**row)  # a reused instance starts clean
    assert env.entries == [] and env.refused == 0
