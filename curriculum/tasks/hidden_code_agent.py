"""Hidden code played as an agent: the model enters each letter's digit with a tool call.

The agent version of `hidden_code`, the positive control for ERL on episodes: a code the
prompt never explains (which digit each letter stands for) is shared by every prompt of a
run, so a lesson from one episode ("Q=3") carries to every other episode that uses the
letter. The prompt lists a word's letters (`Q Z X`) and, after the environment's reset,
the letters left to enter; the model calls `enter(entry)` once per letter, in order, each
entry the letter, = and its digit as a lesson writes it (`enter("Q=3")`), then closes
with a plain reply.

- The tool never says whether a digit is right: "Entered Q=5. Left to enter: Z X." An
  episode alone cannot find the code; the feedback after it can, and a lesson can. An
  entry is written as a lesson is, so applying a lesson is copying, as in `hidden_code`'s
  answer. (The tiny tool model has not yet learned to copy one into a call, with either
  form of the tool: docs/results.md.)
- An entry that is not one capital letter, = and one digit raises: TRL shows the error to
  the model and the call counts as invalid; it takes no turn. Once the word's letters are
  all entered (the turn limit), further calls are refused.
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
import re
from typing import Any

from curriculum.tasks.agent import AgentTask, Played, ToolCall
from curriculum.tasks.base import Evaluation, Row
from curriculum.tasks.hidden_code import ALPHABET, LEVELS, HiddenCodeTask, wrong_letters

_ENTRY = re.compile(r"([A-Z])=([0-9])")

SYSTEM_PROMPT = (
    "Each letter stands for a digit. Enter the letters of the word in order with the enter "
    "tool, one call per letter, each entry the letter, = and the digit it stands for (Q=3). "
    "When every letter is entered, reply with a short final message."
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

    def reset(self, meta: str, **row: Any) -> str:
        self._reset_state(json.loads(meta)["symbols"])
        return f"\n{self._left()}"

    def enter(self, entry: str) -> str:
        """Enter the digit that the next letter of the word stands for.

        Args:
            entry: The letter, = and the digit it stands for, such as Q=3.
        """
        found = _ENTRY.fullmatch(entry.strip()) if isinstance(entry, str) else None
        if found is None:
            raise ValueError(
                f"entry must be a capital letter, = and a digit, such as {ALPHABET[0]}=3"
            )
        if len(self.entries) >= len(self.symbols):
            self.refused += 1
            return "Every letter is already entered. Reply with a short final message."
        self.entries.append((found[1], found[2]))
        return f"Entered {found[1]}={found[2]}. {self._left()}"

    def _left(self) -> str:
        """The letters still to enter, or that there are none."""
        left = self.symbols[len(self.entries) :]
        if not left:
            return "Every letter is entered. Reply with a short final message."
        return f"Left to enter: {' '.join(left)}."


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
            ("enter", {"entry": f"{letter}={digit}"})
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
