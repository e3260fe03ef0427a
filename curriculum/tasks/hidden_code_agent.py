"""Hidden code played as an agent: the model enters each letter's digit with a tool call.

The agent version of `hidden_code`, the positive control for ERL on episodes: a code the
prompt never explains (which digit each letter stands for) is shared by every prompt of a
run, so a lesson from one episode ("Q=3") carries to every other episode that uses the
letter. The prompt lists a word's letters (`Q Z X`); the model calls `enter(letter,
digit)` once per letter, in order, and then closes with a plain reply.

- The tool never says whether a digit is right: "Entered Q=5. Next letter: Z." An episode
  alone cannot find the code; the feedback after it can, and a lesson can.
- A letter that is not a single capital letter, or a digit that is not 0-9, raises: TRL
  shows the error to the model and the call counts as invalid; it takes no turn. Once the
  word's letters are all entered (the turn limit), further calls are refused.
- The feedback names the fix: the digit of every letter entered wrong or left out
  ("Entered Q=5 Z=2 X=1: wrong: Q=3 Z=8."), as `hidden_code`'s does for an answer.

The code, the levels and the held-out combinations are `hidden_code`'s (a combination is
held out for good; a row drawn with an evaluation seed comes from the held-out ones), and
so is the config (`rule_seed` picks the code). The closing reply is not scored.

Signals: `correctness` (every letter entered with its digit, in order, and nothing more),
`milestones` (the share of letters entered right; extra entries cost as much as wrong
ones) and `format` (the share of valid calls).
"""

from __future__ import annotations

import json
from typing import Any

from curriculum.tasks.agent import AgentTask, Played, ToolCall
from curriculum.tasks.base import Evaluation, Row
from curriculum.tasks.hidden_code import ALPHABET, LEVELS, HiddenCodeTask, wrong_letters

SYSTEM_PROMPT = (
    "Each letter stands for a digit. Enter the letters of the word in order with the enter "
    "tool, one call per letter, each with the digit the letter stands for. When every "
    "letter is entered, reply with a short final message."
)


class HiddenCodeEnv:
    """One word to enter, for TRL's `environment_factory`; the tool is `enter`."""

    def __init__(self) -> None:
        self._reset_state([])

    def _reset_state(self, symbols: list[str]) -> None:
        self.symbols = list(symbols)
        self.entries: list[tuple[str, str]] = []
        """(letter, digit) of each accepted call, in order."""
        self.refused = 0
        """Calls made after the last letter's turn."""

    def reset(self, meta: str, **row: Any) -> None:
        self._reset_state(json.loads(meta)["symbols"])

    def enter(self, letter: str, digit: int) -> str:
        """Enter the digit that the next letter of the word stands for.

        Args:
            letter: The letter, a capital such as Q.
            digit: The digit from 0 to 9 that the letter stands for.
        """
        if not (isinstance(letter, str) and len(letter.strip()) == 1 and letter.strip().isupper()):
            raise ValueError(f"letter must be one capital letter such as {ALPHABET[0]}")
        number = _digit(digit)
        if len(self.entries) >= len(self.symbols):
            self.refused += 1
            return "Every letter is already entered. Reply with a short final message."
        self.entries.append((letter.strip(), str(number)))
        left = self.symbols[len(self.entries) :]
        done = "Every letter is entered. Reply with a short final message."
        return f"Entered {letter.strip()}={number}. " + (
            f"Next letter: {left[0]}." if left else done
        )


def _digit(value: Any) -> int:
    """A digit 0-9 from the model's argument (an int, or the text of one); ValueError else."""
    if isinstance(value, bool):
        raise ValueError("digit must be a whole number from 0 to 9")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or not 0 <= value <= 9:
        raise ValueError("digit must be a whole number from 0 to 9")
    return value


class HiddenCodeAgentTask(AgentTask, HiddenCodeTask):
    """Words of a hidden code entered one `enter` call per letter."""

    name = "hidden_code_agent"
    environment_class = HiddenCodeEnv
    system_prompt = SYSTEM_PROMPT

    def turn_limit(self, level: int) -> int:
        """One call per letter of the word."""
        return LEVELS[level][1]

    def solution(self, row: Row) -> tuple[list[ToolCall], str]:
        symbols = self.meta(row)["symbols"]
        calls = [
            ("enter", {"letter": letter, "digit": int(digit)})
            for letter, digit in zip(symbols, str(row["answer"]))
        ]
        return calls, "Every letter is entered."

    def judge(self, row: Row, environment: HiddenCodeEnv, played: Played) -> Evaluation:
        expected = list(zip(self.meta(row)["symbols"], str(row["answer"])))
        given = environment.entries
        right = [i < len(given) and given[i] == pair for i, pair in enumerate(expected)]
        solved = all(right) and len(given) == len(expected)
        breakdown = {
            "format": played.format_score(),
            "correctness": 1.0 if solved else 0.0,
            "milestones": sum(right) / max(len(expected), len(given)),
        }
        feedback: dict[str, str] = {}
        problem = played.format_feedback()
        if problem is not None:
            feedback["format"] = problem
        if not solved:
            feedback["correctness"] = _wrong_feedback(given, expected, right)
            feedback["milestones"] = f"{sum(right)} of {len(expected)} letters are right."
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _wrong_feedback(
    given: list[tuple[str, str]], expected: list[tuple[str, str]], right: list[bool]
) -> str:
    """'Entered Q=5 Z=2 X=1: wrong: Q=3 Z=8.', or what was missing or extra."""
    meanings = wrong_letters(expected, right)
    if not given:
        return f"Nothing was entered: {meanings}."
    said = "Entered " + " ".join(f"{letter}={digit}" for letter, digit in given[:8])
    said += "..." if len(given) > 8 else ""
    if not meanings:  # every letter right, then entries past the last letter
        return f"{said}: {len(given) - len(expected)} entry(ies) too many: one per letter."
    return f"{said}: wrong: {meanings}."
