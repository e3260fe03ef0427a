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
plan is a shortest one. The plan parser here is shared with the Sokoban family.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass

from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig

Cell = tuple[int, int]

# Move letter -> (row step, column step). Order matters: BFS and reference plans try
# moves in this order, which keeps them deterministic.
MOVES: dict[str, Cell] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
MOVE_FORMAT = "the moves U (up), D (down), L (left) and R (right) separated by spaces"

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

_OPEN, _CLOSE = "<answer>", "</answer>"
_TOKEN = re.compile(r"[^\s,]+")
_MAX_TRIES = 1000


# Plan parsing (shared with sokoban) ---------------------------------------------------


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


def parse_plan(completion: object, max_moves: int) -> Plan:
    """Read the move plan in `<answer>...</answer>`; never raises, linear in the text length.

    >>> parse_plan("<answer>r, D d</answer>", 200).moves
    ['R', 'D', 'D']
    """
    if not isinstance(completion, str):
        return Plan(
            [],
            False,
            error=f"The reply is not text; reply <answer>moves</answer> with {MOVE_FORMAT}.",
        )
    # str.find instead of a lazy regex: a regex rescans the tail for every "<answer>",
    # which is quadratic on a hostile completion full of them.
    start = completion.find(_OPEN)
    end = completion.find(_CLOSE, start + len(_OPEN)) if start >= 0 else -1
    if end < 0:
        return Plan(
            [],
            False,
            error=f"No <answer>...</answer> tag found; reply <answer>moves</answer> with {MOVE_FORMAT}.",
        )
    content = completion[start + len(_OPEN) : end]
    moves: list[str] = []
    problem = None
    for index, match in enumerate(_TOKEN.finditer(content), start=1):
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
    if problem is None and (completion[:start].strip() or completion[end + len(_CLOSE) :].strip()):
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


# Config, generator, verifier ----------------------------------------------------------


@dataclass
class PlanConfig(TaskConfig):
    """Config of the move-plan families (this one and sokoban)."""

    max_moves: int = 200
    """Moves read from a plan; the rest is ignored (and the format marked down)."""

    def validate(self) -> None:
        super().validate()
        # bool is an int subclass; max_moves=True is a config mistake, not 1.
        bad_type = isinstance(self.max_moves, bool) or not isinstance(self.max_moves, int)
        if bad_type or self.max_moves < 1:
            raise ValueError(f"max_moves must be an integer >= 1, got {self.max_moves!r}")


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
        cells = [(r, c) for r in range(size) for c in range(size)]
        for _ in range(_MAX_TRIES):
            start, goal = rng.sample(cells, 2)
            # Far enough apart that the walk is never a single move.
            if abs(start[0] - goal[0]) + abs(start[1] - goal[1]) < size - 1:
                continue
            hole_cells = set(rng.sample([c for c in cells if c not in (start, goal)], holes))
            grid = [
                "".join(_symbol((r, c), start, goal, hole_cells) for c in range(size))
                for r in range(size)
            ]
            distances = _distances(grid, goal)
            if start in distances:
                break
        else:  # pragma: no cover - at these hole densities a path exists within a few tries
            raise RuntimeError(f"no solvable {size}x{size} map in {_MAX_TRIES} tries")
        plan = _shortest_plan(distances, start)
        user = (
            f"Map ({size}x{size}):\n"
            + "\n".join(grid)
            + f"\nStart S is at {_fmt(start)}, goal G is at "
            f"{_fmt(goal)}; cells are (row, column) counted from 0 at the top-left."
        )
        return self.make_row(
            level, SYSTEM_PROMPT, user, " ".join(plan), map=grid, start=start, goal=goal
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
