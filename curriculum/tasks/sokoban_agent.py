"""Sokoban played turn by turn: the model calls `move(direction)` and reads the new board.

The agent version of `sokoban` (whose reply is a whole plan, replayed at once), as the
ERL paper plays it: each turn one move, then the observation, up to a turn limit.

- The puzzles are those of `sokoban` (same generator, same levels of room, boxes and
  inner walls), with a turn limit per level. The board is shown in the same symbols:
  `@` where the player stands, `+` for the player on a goal.
- Moving into a box pushes it one cell when the cell beyond is floor or a goal. A move
  into a wall, or a push of a box into a wall or another box, has no effect, and says
  so; it still takes a turn. Once every box is on a goal the episode is over; later
  moves have no effect. Once the turn limit is spent, moves are refused.
- A direction that is not up, down, left or right (or U, D, L, R) raises: TRL shows the
  error to the model and the call counts as invalid; it takes no turn.
- The episode ends with the model's plain reply. Its text is not scored: where the boxes
  ended is.

Signals: `correctness` 1 when every box is on a goal; `milestones` the share of boxes on
goals; `format` the share of valid calls. The feedback is the paper's kind of summary:
how many boxes are home, how many moves had no effect, a box stuck in a corner, the last
move and the final state.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from curriculum.tasks.agent import Played
from curriculum.tasks.base import Evaluation, Row, TaskConfig
from curriculum.tasks.move_plan import Cell, step
from curriculum.tasks.move_tool import NAMES, MoveTask, MoveTurns
from curriculum.tasks.sokoban import Puzzle, SokobanTask, _fmt, _in_corner

# level -> tool calls allowed. Reference plans vary in length: over 20,000 draws per level
# the longest were 8, 23, 31, 32 and 50 moves; the limits leave room beyond those and for
# a few mistakes. A draw whose plan would not fit is drawn again (see `_generate_one`).
TURN_LIMITS: dict[int, int] = {1: 12, 2: 28, 3: 40, 4: 40, 5: 60}

SYSTEM_PROMPT = (
    "Solve the Sokoban puzzle: push every box onto a goal. Map: # wall, _ floor, @ you, "
    "$ box, . goal, * box on a goal, + you on a goal. Call the move tool once per turn with "
    "up, down, left or right; you move one cell, and moving into a box pushes it one cell "
    "if the cell beyond is free. You cannot push a box into a wall or another box, and you "
    "cannot pull. Each call answers with the new map. When every box is on a goal, or when "
    "you are done, reply with a short final message."
)

# The generator of `sokoban`, whose rows this family reshapes; it keeps no state.
_PUZZLES = SokobanTask()
_MAX_TRIES = 100


@dataclass
class SokobanAgentConfig(TaskConfig):
    pass


class SokobanEnv(MoveTurns):
    """One Sokoban episode for TRL's `environment_factory`; the tool is `move`."""

    def __init__(self) -> None:
        self._reset_state(Puzzle(frozenset(), frozenset(), frozenset(), (0, 0), 0, 0), 0)

    def _reset_state(self, puzzle: Puzzle, turns: int) -> None:
        self.puzzle = puzzle
        """The starting position: the room, the goals and where the boxes began."""
        self.boxes: set[Cell] = set(puzzle.boxes)
        self.player = puzzle.player
        self.solved = self.boxes <= puzzle.goals
        self._start_turns(turns)

    def _over(self) -> bool:
        return self.solved

    def reset(self, meta: str, level: int, **row: Any) -> None:
        self._reset_state(Puzzle.from_rows(json.loads(meta)["map"]), TURN_LIMITS[level])

    def move(self, direction: str) -> str:
        """Move one cell in the room, pushing a box that is in the way.

        Args:
            direction: One of up, down, left, right.
        """
        letter, refused = self._begin_move(direction)
        if refused is not None:
            return refused
        name = NAMES[letter]
        target = step(self.player, letter)
        beyond = step(target, letter)
        if self.puzzle.blocked(target):
            self.no_effect += 1
            text = f"Your move {name} had no effect: a wall is there."
        elif target in self.boxes and (self.puzzle.blocked(beyond) or beyond in self.boxes):
            self.no_effect += 1
            text = f"Your move {name} had no effect: the box cannot move there."
        elif target in self.boxes:
            self.boxes.remove(target)
            self.boxes.add(beyond)
            self.player = target
            home = " onto a goal" if beyond in self.puzzle.goals else ""
            text = f"You pushed the box {name}{home} at {_fmt(beyond)}."
            if self.boxes <= self.puzzle.goals:
                self.solved = True
                return f"{text} All boxes are on goals! Reply with a short final message."
        else:
            self.player = target
            text = f"You moved {name} to {_fmt(target)}."
        return f"{text}\n{self._board()}\nMoves left: {self.turns_left}."

    def _board(self) -> str:
        """The room as it stands, in the prompt's symbols."""
        now = Puzzle(
            self.puzzle.walls,
            self.puzzle.goals,
            frozenset(self.boxes),
            self.player,
            self.puzzle.height,
            self.puzzle.width,
        )
        return "\n".join(now.rows())


class SokobanAgentTask(MoveTask):
    """Sokoban puzzles played one `move` call per turn."""

    name = "sokoban_agent"
    config_class = SokobanAgentConfig
    environment_class = SokobanEnv
    turn_limits = TURN_LIMITS

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        # sokoban's own draw, so the puzzles are its puzzles for the same seed; one whose
        # reference would not fit the turn limit (none in 20,000 draws per level) is
        # drawn again from the same rng, which keeps the rows deterministic.
        for _ in range(_MAX_TRIES):
            puzzle = _PUZZLES._generate_one(level, rng)
            if len(puzzle["answer"].split()) <= TURN_LIMITS[level]:
                break
        else:  # pragma: no cover - the tests measure the plans against the limits
            raise RuntimeError(f"no sokoban puzzle fits {TURN_LIMITS[level]} moves")
        meta = self.meta(puzzle)
        user = puzzle["prompt"][-1]["content"] + f"\nYou have {TURN_LIMITS[level]} moves."
        return self.make_row(level, SYSTEM_PROMPT, user, puzzle["answer"], **meta)

    def judge(self, row: Row, environment: SokobanEnv, played: Played) -> Evaluation:
        total = len(environment.boxes)
        on_goals = len(environment.boxes & environment.puzzle.goals)
        solved = environment.solved
        breakdown = {
            "format": played.format_score(),
            "correctness": 1.0 if solved else 0.0,
            "milestones": 1.0 if solved or not total else on_goals / total,
        }
        feedback: dict[str, str] = {}
        problem = played.format_feedback()
        if problem is not None:
            feedback["format"] = problem
        if not solved:
            feedback["correctness"] = _summary(environment, on_goals, total)
            feedback["milestones"] = f"{on_goals} of {total} boxes are on goals."
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _summary(environment: SokobanEnv, on_goals: int, total: int) -> str:
    """The paper's end-of-episode line: how far it got, what went wrong (moves with no
    effect, a box stuck in a corner), the last move, the final state."""
    puzzle = environment.puzzle
    parts = [f"Not solved: {on_goals} of {total} boxes on goals."]
    if not environment.moves:
        parts.append("No move was made.")
    elif environment.turns_left <= 0:
        parts.append(f"Ran out of moves after {len(environment.moves)}.")
    if environment.no_effect:
        parts.append(f"{environment.no_effect} action(s) had no effect.")
    off = sorted(environment.boxes - puzzle.goals)
    stuck = [cell for cell in off if _in_corner(puzzle, cell)]
    if stuck:
        parts.append(
            f"The box at {_fmt(stuck[0])} is stuck in a corner off the goals (a deadlock): "
            "it can never reach a goal."
        )
    if environment.moves:
        parts.append(f"Last action taken: {NAMES[environment.moves[-1]]}.")
    boxes = ", ".join(_fmt(cell) for cell in off)
    parts.append(
        f"Final state: you at {_fmt(environment.player)}, "
        f"box{'es' if len(off) > 1 else ''} off the goals at {boxes}."
    )
    return " ".join(parts)
