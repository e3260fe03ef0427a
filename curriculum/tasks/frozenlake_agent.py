"""FrozenLake played turn by turn: the model calls `move(direction)` and reads the new board.

The agent version of `frozenlake` (whose reply is a whole plan, replayed at once), as the
ERL paper plays it: each turn one move, then the observation, up to a turn limit.

- The map and the rules are those of `frozenlake` (same generator, same levels of map
  size and holes), with a turn limit per level. The board is shown with `P` where the
  player stands.
- A move off the map has no effect (as in gymnasium), and says so. Stepping into a hole
  or onto the goal ends the episode; later moves have no effect. Once the turn limit is
  spent, moves are refused.
- A direction that is not up, down, left or right (or U, D, L, R) raises: TRL shows the
  error to the model and the call counts as invalid; it takes no turn.
- The episode ends with the model's plain reply. Its text is not scored: where the walk
  ended is.

Signals: `correctness` 1 when the goal was reached; `milestones` how much closer to the
goal the walk ended than it started; `format` the share of valid calls. The feedback is
the paper's kind of summary: what happened, how many moves had no effect, the last move
and the final state.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from curriculum.tasks.agent import Played
from curriculum.tasks.base import Evaluation, Row, TaskConfig
from curriculum.tasks.frozenlake import (
    LEVELS as MAP_LEVELS,
)
from curriculum.tasks.frozenlake import (
    _distances,
    _fmt,
    _moves,
    _on_map,
    _shortest_plan,
    draw_map,
    map_text,
)
from curriculum.tasks.move_plan import step
from curriculum.tasks.move_tool import NAMES, MoveTask, MoveTurns

# level -> tool calls allowed: the map's levels, with room for a few mistakes.
TURN_LIMITS: dict[int, int] = {1: 6, 2: 8, 3: 10, 4: 12, 5: 14, 6: 16}

SYSTEM_PROMPT = (
    "You are on a frozen lake. Walk from the start S to the goal G without stepping into a "
    "hole H; F is safe ice. Call the move tool once per turn with up, down, left or right; "
    "each call answers with the new map, P marking where you stand. When the walk is over, "
    "reply with a short final message."
)


@dataclass
class FrozenLakeAgentConfig(TaskConfig):
    pass


class FrozenLakeEnv(MoveTurns):
    """One FrozenLake episode for TRL's `environment_factory`; the tool is `move`."""

    def __init__(self) -> None:
        self._reset_state([], (0, 0), (0, 0), 0)

    def _reset_state(self, grid: list[str], start, goal, turns: int) -> None:
        self.grid = grid
        self.position = tuple(start)
        self.goal = tuple(goal)
        self.outcome = "playing"  # or "goal", "hole"
        self.hole: tuple[int, int] | None = None
        """The hole fallen into; `position` stays the last safe cell."""
        self._start_turns(turns)

    def _over(self) -> bool:
        return self.outcome != "playing"

    def reset(self, meta: str, level: int, **row: Any) -> None:
        data = json.loads(meta)
        self._reset_state(data["map"], data["start"], data["goal"], TURN_LIMITS[level])

    def move(self, direction: str) -> str:
        """Move one cell on the lake.

        Args:
            direction: One of up, down, left, right.
        """
        letter, refused = self._begin_move(direction)
        if refused is not None:
            return refused
        target = step(self.position, letter)
        if not _on_map(self.grid, target):
            self.no_effect += 1
            text = f"Your move {NAMES[letter]} had no effect: the edge of the map is there."
        else:
            symbol = self.grid[target[0]][target[1]]
            if symbol == "H":
                self.outcome, self.hole = "hole", target
                return f"You fell into a hole at {_fmt(target)}. The episode is over."
            self.position = target
            if symbol == "G":
                self.outcome = "goal"
                return f"You reached the goal at {_fmt(target)}! Reply with a short final message."
            text = f"You moved {NAMES[letter]} to {_fmt(target)}."
        return f"{text}\n{self._board()}\nMoves left: {self.turns_left}."

    def _board(self) -> str:
        """The map with P where the player stands."""
        rows = [list(line) for line in self.grid]
        r, c = self.position
        rows[r][c] = "P"
        return "\n".join("".join(line) for line in rows)


class FrozenLakeAgentTask(MoveTask):
    """FrozenLake walks played one `move` call per turn."""

    name = "frozenlake_agent"
    config_class = FrozenLakeAgentConfig
    environment_class = FrozenLakeEnv
    turn_limits = TURN_LIMITS

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        size, holes = MAP_LEVELS[level]
        grid, start, goal = draw_map(size, holes, rng)
        plan = _shortest_plan(_distances(grid, goal), start)
        user = map_text(grid, start, goal) + f"\nYou have {TURN_LIMITS[level]} moves."
        return self.make_row(
            level, SYSTEM_PROMPT, user, " ".join(plan), map=grid, start=start, goal=goal
        )

    def judge(self, row: Row, environment: FrozenLakeEnv, played: Played) -> Evaluation:
        meta = self.meta(row)
        distances = _distances(meta["map"], tuple(meta["goal"]))
        initial = distances[tuple(meta["start"])]
        remaining = 0 if environment.outcome == "goal" else distances[environment.position]
        reached = environment.outcome == "goal"
        breakdown = {
            "format": played.format_score(),
            "correctness": 1.0 if reached else 0.0,
            "milestones": 1.0 if reached else max(0.0, 1.0 - remaining / initial),
        }
        feedback: dict[str, str] = {}
        problem = played.format_feedback()
        if problem is not None:
            feedback["format"] = problem
        if not reached:
            feedback["correctness"] = _summary(environment, remaining, initial)
            feedback["milestones"] = (
                f"The walk ends {_moves(remaining)} from the goal; the start was "
                f"{_moves(initial)} away."
            )
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _summary(environment: FrozenLakeEnv, remaining: int, initial: int) -> str:
    """The paper's end-of-episode line: what happened, moves with no effect, the last move,
    the final state."""
    if environment.outcome == "hole":
        what = "Fell into a hole."
        state = f"in a hole at {_fmt(environment.hole)}, {_moves(remaining)} from the goal"
    elif not environment.moves:
        what = "No move was made."
        state = f"at the start, {_moves(remaining)} from the goal"
    elif environment.turns_left <= 0:
        what = "Ran out of moves."
        state = f"at {_fmt(environment.position)}, {_moves(remaining)} from the goal"
    else:
        what = "Stopped before the goal."
        state = f"at {_fmt(environment.position)}, {_moves(remaining)} from the goal"
    parts = [what]
    if environment.no_effect:
        parts.append(f"{environment.no_effect} action(s) had no effect.")
    if environment.moves:
        parts.append(f"Last action taken: {NAMES[environment.moves[-1]]}.")
    parts.append(f"Final state: {state}.")
    return " ".join(parts)
