"""FrozenLake: walk from S to G across a frozen lake without falling into a hole.

The prompt shows a square map, one row per line, top row first: S start, F frozen (safe),
H hole, G goal. Cells are named (row, column), counted from 0 at the top-left.

The reply is a move plan such as `<answer>R R D D</answer>`: the letters U (up), D (down),
L (left) and R (right), case-insensitive, separated by spaces and/or commas. The simulator
replays it with no slipping. Replay stops at the first move that leaves the map (illegal)
or steps into a hole (legal but fatal). Reaching G ends the walk, as in gymnasium: moves
after it are ignored. Only the first `max_moves` moves are read, so a huge completion
costs no more than a long plan.

Levels grow the map from 3x3 to 8x8 and its number of holes; start and goal are placed at
random. Maps come from a small generator of our own (deterministic for a seed, unlike
gymnasium's across versions) that keeps only maps where BFS finds a path; the reference
plan is a shortest one. The plan format and its parser (`move_plan`) are shared with Sokoban.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from curriculum.tasks.base import Evaluation, Row, Task
from curriculum.tasks.move_plan import MOVES, Cell, Plan, PlanConfig, parse_plan, step, unreadable

# level -> (map side, number of holes)
LEVELS: dict[int, tuple[int, int]] = {
    1: (3, 1),
    2: (4, 3),
    3: (5, 5),
    4: (6, 7),
    5: (7, 10),
    6: (8, 14),
}

SYSTEM_PROMPT = (
    "You are on a frozen lake. Walk from the start S to the goal G without stepping into a "
    "hole H; F is safe ice and you may not leave the map. Each move goes one cell: U (up), "
    "D (down), L (left), R (right). Reply only with the whole plan as "
    "<answer>moves</answer>, moves separated by spaces, for example <answer>R R D</answer>."
)

_MAX_TRIES = 1000


# Config, generator, verifier ----------------------------------------------------------


@dataclass
class FrozenLakeConfig(PlanConfig):
    pass


@dataclass
class _Walk:
    """Where a replayed plan ended and why."""

    position: Cell
    """The last safe cell the walker stood on."""
    outcome: str
    """'goal', 'hole', 'off_map' or 'stopped' (plan ran out)."""
    failed_step: int | None = None
    """1-based step that fell into a hole or left the map."""


class FrozenLakeTask(Task):
    """Grid walks from S to G avoiding holes; the reply is `<answer>R R D ...</answer>`."""

    name = "frozenlake"
    config_class = FrozenLakeConfig
    signals = ("format", "correctness", "milestones", "plausibility")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        size, holes = LEVELS[level]
        grid, start, goal = draw_map(size, holes, rng)
        plan = _shortest_plan(_distances(grid, goal), start)
        return self.make_row(
            level,
            SYSTEM_PROMPT,
            map_text(grid, start, goal),
            " ".join(plan),
            map=grid,
            start=start,
            goal=goal,
        )

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        plan = parse_plan(completion, self.config.max_moves)
        if plan.error is not None:
            return unreadable(self.signals, plan.error)
        meta = self.meta(row)
        grid: list[str] = meta["map"]
        start, goal = tuple(meta["start"]), tuple(meta["goal"])
        distances = _distances(grid, goal)
        walk = _replay(grid, start, plan.moves)
        initial = distances[start]
        remaining = distances.get(walk.position, initial)
        reached = walk.outcome == "goal"
        breakdown = {
            "format": 1.0 if plan.strict else 0.5,
            "correctness": 1.0 if reached and plan.strict else 0.0,
            "milestones": 1.0 if reached else max(0.0, 1.0 - remaining / initial),
            "plausibility": 1.0,
        }
        feedback: dict[str, str] = {}
        if plan.problem is not None:
            feedback["format"] = plan.problem
        k = walk.failed_step
        if walk.outcome == "off_map":
            # Legal moves are those before the first one that leaves the map.
            breakdown["plausibility"] = (k - 1) / len(plan.moves)
            feedback["plausibility"] = (
                f"Step {k} ({plan.moves[k - 1]}) leaves the map from {_fmt(walk.position)}."
            )
        if breakdown["milestones"] < 1.0:
            feedback["milestones"] = (
                f"The walk ends {_moves(remaining)} from the goal; the start was {_moves(initial)} away."
            )
        if breakdown["correctness"] < 1.0:
            feedback["correctness"] = self._correctness_feedback(walk, plan, remaining, row)
        return Evaluation(breakdown["correctness"], breakdown, feedback)

    def _correctness_feedback(self, walk: _Walk, plan: Plan, remaining: int, row: Row) -> str:
        """One sentence on why the walk did not count as solved."""
        k = walk.failed_step
        if walk.outcome == "goal":
            return "The walk reaches the goal, but the reply is not exactly <answer>moves</answer>."
        if walk.outcome == "hole":
            move = plan.moves[k - 1]
            text = f"Step {k} ({move}) moves from {_fmt(walk.position)} into a hole at {_fmt(step(walk.position, move))}."
        elif walk.outcome == "off_map":
            text = (
                f"The walk is lost at step {k}, off the map, {_moves(remaining)} short of the goal."
            )
        else:
            text = (
                f"The plan stops at {_fmt(walk.position)}, {_moves(remaining)} short of the goal."
            )
        if self.config.reveal_answer:
            text += f" A shortest plan is: {row['answer']}."
        return text


def draw_map(size: int, holes: int, rng: random.Random) -> tuple[list[str], Cell, Cell]:
    """A solvable `size` x `size` map with `holes` holes: its rows, start and goal. Start and
    goal are far enough apart that the walk is never a single move."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(_MAX_TRIES):
        start, goal = rng.sample(cells, 2)
        if abs(start[0] - goal[0]) + abs(start[1] - goal[1]) < size - 1:
            continue
        hole_cells = set(rng.sample([c for c in cells if c not in (start, goal)], holes))
        grid = [
            "".join(_symbol((r, c), start, goal, hole_cells) for c in range(size))
            for r in range(size)
        ]
        if start in _distances(grid, goal):
            return grid, start, goal
    # pragma: no cover - at these hole densities a path exists within a few tries
    raise RuntimeError(f"no solvable {size}x{size} map in {_MAX_TRIES} tries")


def map_text(grid: list[str], start: Cell, goal: Cell) -> str:
    """The map as the prompts show it, with where start and goal are."""
    size = len(grid)
    return (
        f"Map ({size}x{size}):\n"
        + "\n".join(grid)
        + f"\nStart S is at {_fmt(start)}, goal G is at "
        f"{_fmt(goal)}; cells are (row, column) counted from 0 at the top-left."
    )


def _symbol(cell: Cell, start: Cell, goal: Cell, holes: set[Cell]) -> str:
    if cell == start:
        return "S"
    if cell == goal:
        return "G"
    return "H" if cell in holes else "F"


def _fmt(cell: Cell) -> str:
    return f"({cell[0]},{cell[1]})"


def _moves(count: int) -> str:
    return f"{count} move" if count == 1 else f"{count} moves"


def _on_map(grid: list[str], cell: Cell) -> bool:
    return 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[cell[0]])


def _distances(grid: list[str], goal: Cell) -> dict[Cell, int]:
    """Moves from each safe cell to `goal` (BFS over non-hole cells); unreachable cells absent."""
    distances = {goal: 0}
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        for move in MOVES:
            nxt = step(cell, move)
            if nxt not in distances and _on_map(grid, nxt) and grid[nxt[0]][nxt[1]] != "H":
                distances[nxt] = distances[cell] + 1
                queue.append(nxt)
    return distances


def _shortest_plan(distances: dict[Cell, int], start: Cell) -> list[str]:
    """A shortest plan from `start`: always the first move (in MOVES order) one cell closer."""
    plan, cell = [], start
    while distances[cell] > 0:
        move = next(m for m in MOVES if distances.get(step(cell, m)) == distances[cell] - 1)
        plan.append(move)
        cell = step(cell, move)
    return plan


def _replay(grid: list[str], start: Cell, moves: list[str]) -> _Walk:
    """Replay `moves` from `start` with no slipping; stop at the goal, a hole or the edge."""
    cell = start
    for k, move in enumerate(moves, start=1):
        nxt = step(cell, move)
        if not _on_map(grid, nxt):
            return _Walk(cell, "off_map", k)
        symbol = grid[nxt[0]][nxt[1]]
        if symbol == "H":
            return _Walk(cell, "hole", k)
        cell = nxt
        if symbol == "G":
            return _Walk(cell, "goal")
    return _Walk(cell, "stopped")
