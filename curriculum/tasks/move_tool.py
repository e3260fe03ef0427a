"""The `move(direction)` tool of the grid agent tasks (`frozenlake_agent`, `sokoban_agent`):
reading a direction, the turn limit, the moves an episode took, and `MoveTask`, what the
two tasks share (turn limits per level, the reference plan played as move calls).

An environment subclasses `MoveTurns`, defines its own `move` tool (its docstring is what
the model is shown) and starts it with `_begin_move`, which reads the direction and
spends a turn, or says why the move is refused:

    def move(self, direction: str) -> str:
        letter, refused = self._begin_move(direction)
        if refused is not None:
            return refused
        ...  # the move itself
"""

from __future__ import annotations

from typing import Any, ClassVar

from curriculum.tasks.agent import AgentTask, ToolCall
from curriculum.tasks.base import Row

DIRECTIONS = {"up": "U", "down": "D", "left": "L", "right": "R"}
NAMES = {letter: name for name, letter in DIRECTIONS.items()}
"""Move letter (as in `move_plan.MOVES`) -> the direction's name the tool takes."""


def read_direction(direction: Any) -> str:
    """The move letter of `direction`: up, down, left or right, or U, D, L, R, in any case
    and with spaces around. Anything else raises ValueError: TRL shows the error to the
    model and the replay counts the call invalid."""
    key = str(direction).strip().lower()
    letter = DIRECTIONS.get(key) or (key.upper() if key.upper() in NAMES else None)
    if letter is None:
        raise ValueError(
            f"direction must be up, down, left or right, got {ascii(str(direction)[:20])}"
        )
    return letter


def plan_calls(plan: str) -> list[ToolCall]:
    """A move plan such as "R R D" (a row's `answer`) as `move` calls."""
    return [("move", {"direction": NAMES[letter]}) for letter in plan.split()]


class MoveTurns:
    """The turn accounting of an environment played with `move`: `turns_left`, `moves`
    (every move taken, effective or not) and `no_effect` (moves that changed nothing,
    refused ones included). A subclass says when its episode is over (`_over`)."""

    def _start_turns(self, turns: int) -> None:
        self.turns_left = turns
        self.moves: list[str] = []
        self.no_effect = 0

    def _over(self) -> bool:
        """Whether the episode has ended (the goal reached, a hole, every box home)."""
        raise NotImplementedError

    def _begin_move(self, direction: Any) -> tuple[str, str | None]:
        """(the move letter, None) with a turn spent for it, or (letter, the refusal) when
        the episode is over or out of moves; a bad direction raises and takes no turn."""
        letter = read_direction(direction)
        if self._over():
            self.no_effect += 1
            return letter, "The episode is over; reply with a short final message."
        if self.turns_left <= 0:
            self.no_effect += 1
            return letter, "No moves left; reply with a short final message."
        self.turns_left -= 1
        self.moves.append(letter)
        return letter, None


class MoveTask(AgentTask):
    """An agent task played with `move`, whose rows' `answer` is a move plan that solves
    them (e.g. "R R D"). Its levels are those of `turn_limits`."""

    signals = ("format", "correctness", "milestones")
    turn_limits: ClassVar[dict[int, int]]
    """Level -> tool calls an episode may make (the environment refuses more)."""
    final_reply: ClassVar[str] = "Done."
    """The reference episode's closing reply (its text is not scored)."""

    @property
    def num_levels(self) -> int:
        return len(self.turn_limits)

    def turn_limit(self, level: int) -> int:
        return self.turn_limits[level]

    def solution(self, row: Row) -> tuple[list[ToolCall], str]:
        return plan_calls(row["answer"]), self.final_reply
