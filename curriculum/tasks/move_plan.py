"""Move plans such as `<answer>R R D D</answer>`: the reply format of frozenlake and sokoban.

A plan is the letters U (up), D (down), L (left) and R (right), case-insensitive,
separated by spaces and/or commas, inside the last answer tag (`answer_tags`). Reading
stops at the first token that is not a move and after `max_moves` moves, so a huge
completion costs no more than a long plan. A strict reply is the tag alone: unlike the
free-form families, no `<think>` block is allowed before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from curriculum.tasks.answer_tags import extract_answer
from curriculum.tasks.base import Evaluation, TaskConfig

Cell = tuple[int, int]

# Move letter -> (row step, column step). Order matters: BFS and reference plans try
# moves in this order, which keeps them deterministic.
MOVES: dict[str, Cell] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
MOVE_FORMAT = "the moves U (up), D (down), L (left) and R (right) separated by spaces"

_TOKEN = re.compile(r"[^\s,]+")


@dataclass
class Plan:
    """A move plan read from a completion."""

    moves: list[str]
    """Upper-case move letters, at most `max_moves`; reading stops at the first bad token."""
    strict: bool
    """The reply is exactly `<answer>moves</answer>` with every token a move, within the cap."""
    problem: str | None = None
    """Why the format is not strict: one sentence of feedback."""
    error: str | None = None
    """Set when no move could be read at all."""


@dataclass
class PlanConfig(TaskConfig):
    """Config of the move-plan families (frozenlake and sokoban)."""

    max_moves: int = 200
    """Moves read from a plan; the rest is ignored (and the format marked down)."""

    def validate(self) -> None:
        super().validate()
        # bool is an int subclass; max_moves=True is a config mistake, not 1.
        bad_type = isinstance(self.max_moves, bool) or not isinstance(self.max_moves, int)
        if bad_type or self.max_moves < 1:
            raise ValueError(f"max_moves must be an integer >= 1, got {self.max_moves!r}")


def parse_plan(completion: object, max_moves: int) -> Plan:
    """Read the move plan in the last `<answer>...</answer>`; never raises, linear time.

    >>> parse_plan("<answer>r, D d</answer>", 200).moves
    ['R', 'D', 'D']
    """
    if not isinstance(completion, str):
        return Plan(
            [],
            False,
            error=f"The reply is not text; reply <answer>moves</answer> with {MOVE_FORMAT}.",
        )
    answer = extract_answer(completion)
    if answer is None:
        return Plan(
            [],
            False,
            error=f"No <answer>...</answer> tag found; reply <answer>moves</answer> with {MOVE_FORMAT}.",
        )
    moves: list[str] = []
    problem = None
    for index, match in enumerate(_TOKEN.finditer(answer.text), start=1):
        token = match.group()
        if len(token) != 1 or token.upper() not in MOVES:
            # ascii() so that odd model text (lone surrogates, NULs) never reaches feedback raw.
            problem = f"Token {index} {ascii(token[:20])} is not a move; use {MOVE_FORMAT}."
            break
        if len(moves) == max_moves:
            problem = f"The plan has more than {max_moves} moves; only the first {max_moves} are replayed."
            break
        moves.append(token.upper())
    if not moves:
        return Plan(
            [], False, problem, error=problem or f"The answer holds no moves; use {MOVE_FORMAT}."
        )
    if problem is None and not answer.bare:
        problem = "The reply must be only <answer>moves</answer>, with no text before or after it."
    return Plan(moves, problem is None, problem)


def unreadable(signals: tuple[str, ...], error: str) -> Evaluation:
    """The Evaluation of a completion whose plan cannot be read: every signal fails."""
    feedback = {name: "No plan could be read, so nothing was replayed." for name in signals}
    feedback["format"] = error
    return Evaluation(0.0, dict.fromkeys(signals, 0.0), feedback, error=error)


def step(cell: Cell, move: str) -> Cell:
    """The cell one `move` away from `cell` (maybe off the map)."""
    dr, dc = MOVES[move]
    return (cell[0] + dr, cell[1] + dc)
