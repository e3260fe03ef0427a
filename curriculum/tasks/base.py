"""The task API every curriculum task family implements.

A task family turns a difficulty level into rows (prompts plus the columns its verifier
needs), scores a completion against a row, and can produce a reference solution.

Rows are plain dicts that `datasets.Dataset.from_list` accepts, with one fixed schema
for every family so that rows of different levels (and families) can share a dataset:

    prompt  list[{"role": str, "content": str}]  conversational prompt
    task    str    family name, e.g. "arithmetic"
    level   int    difficulty level, 1..N
    answer  str    the expected answer (its meaning is the family's)
    meta    str    JSON object with whatever else the verifier needs

GRPOTrainer passes every dataset column to reward functions as keyword arguments, so
the verifier reads `answer` and `meta` from there; nothing is hidden inside the prompt.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

Row = dict[str, Any]

HELD_OUT_SEED_BASE = 10**6
"""Rows drawn with a seed from here on are evaluation rows; training draws stay below it.
A family whose levels have few distinct problems keeps the two apart itself: it draws
from a held-out part of its problems when `Task.held_out_seed(seed)` (hidden_rule's
operand pairs, dataset's held-out rows). `pipeline.evaluate.first_attempts` also skips
an evaluation prompt the run trained on, and says how many it could not replace."""

# The signal names a task may report in `Evaluation.breakdown`. `rewards` turns each
# into a TRL reward function; the length penalty is computed there, not by tasks.
SIGNALS = ("format", "correctness", "milestones", "plausibility", "reasoning")


def prompt_key(prompt: Any) -> str:
    """What names a prompt exactly, roles and all, as one comparable string (a list of chat
    messages or plain text): GRPO's generations of one prompt share it, the retries of one
    shared reflection too, and the held-out split compares prompts by it."""
    return json.dumps(prompt, sort_keys=True, default=str)


def is_conversation(value: Any) -> bool:
    """Whether `value` is a non-empty list of {"role": str, "content": str} messages."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )


@dataclass
class Evaluation:
    """The verdict on one completion: overall reward, per-signal values and feedback."""

    reward: float
    """Overall task reward in [0, 1]; 1.0 means solved."""
    breakdown: dict[str, float]
    """Signal name (one of `SIGNALS`) -> value in [0, 1]."""
    feedback: dict[str, str] = field(default_factory=dict)
    """Signal name -> one short sentence saying what went wrong (and where). Signals
    that passed have no entry."""
    error: str | None = None
    """Set when the completion could not be parsed at all; reward functions then score
    the configured fallback instead of the breakdown."""

    @property
    def solved(self) -> bool:
        return self.error is None and self.reward >= 1.0

    def feedback_text(self, signals: tuple[str, ...] | list[str] | None = None) -> str:
        """The feedback sentences of the given signals (all when None), or a short
        confirmation when nothing failed."""
        if self.error is not None:
            return self.error
        chosen = [
            text for name, text in self.feedback.items() if signals is None or name in signals
        ]
        return " ".join(chosen) if chosen else "The answer is correct."


@dataclass
class TaskConfig:
    """Base of every family's config dataclass; `validate` rejects bad values."""

    reveal_answer: bool = False
    """Whether feedback may state the expected answer (off: feedback only says what is wrong)."""

    def validate(self) -> None:
        """Raise ValueError naming the first bad field. Subclasses extend this."""


class Task(ABC):
    """A family of tasks with difficulty levels 1..`num_levels`."""

    name: ClassVar[str]
    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    signals: ClassVar[tuple[str, ...]] = ("format", "correctness")
    """The signals this family reports in every Evaluation's breakdown."""

    def __init__(self, **config: Any) -> None:
        known = {f.name for f in fields(self.config_class)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"unknown config key(s) {unknown} for task {self.name!r}; valid keys: {sorted(known)}"
            )
        self.config = self.config_class(**config)
        self.config.validate()

    @property
    @abstractmethod
    def num_levels(self) -> int:
        """How many difficulty levels this family has."""

    @property
    def levels(self) -> range:
        return range(1, self.num_levels + 1)

    def check_level(self, level: int) -> None:
        if not isinstance(level, int) or level not in self.levels:
            raise ValueError(
                f"level {level!r} is out of range for task {self.name!r}; valid levels: "
                f"1..{self.num_levels}"
            )

    @staticmethod
    def held_out_seed(seed: int) -> bool:
        """Whether a draw with `seed` is for evaluation (see HELD_OUT_SEED_BASE)."""
        return seed >= HELD_OUT_SEED_BASE

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows at `level`, the same for the same seed (row i uses Random(seed + i))."""
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self._generate_one(level, random.Random(seed + i)) for i in range(n)]

    @abstractmethod
    def _generate_one(self, level: int, rng: random.Random) -> Row:
        """One row at `level`, drawn with `rng`."""

    @abstractmethod
    def evaluate(self, row: Row, completion: str) -> Evaluation:
        """Score `completion` for `row`. Never raises on model output."""

    @abstractmethod
    def reference(self, row: Row) -> str:
        """A completion that solves `row` (scores reward 1.0)."""

    # Helpers shared by the families ------------------------------------------------

    def make_row(self, level: int, system: str, user: str, answer: str, **meta: Any) -> Row:
        """A row in the common schema."""
        return {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "task": self.name,
            "level": level,
            "answer": answer,
            "meta": json.dumps(meta, sort_keys=True),
        }

    @staticmethod
    def meta(row: Row) -> dict[str, Any]:
        """The decoded `meta` column of a row."""
        value = row.get("meta") or "{}"
        return json.loads(value) if isinstance(value, str) else dict(value)


class SplitTask(Task):
    """A family that holds out part of each level's problems itself (hidden_rule's operand
    pairs, hidden_code's letter combinations): its config's `split` is 'auto' (a draw with
    a held-out seed takes a held-out problem, any other a training one), 'train',
    'held_out' or 'all', and `_draw_in_split` draws one row of a split."""

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows at `level`; row i is drawn with seed + i from the split it falls in."""
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rows = []
        for draw in range(seed, seed + n):
            split = self.config.split
            if split == "auto":
                split = "held_out" if self.held_out_seed(draw) else "train"
            rows.append(self._draw_in_split(level, draw, split))
        return rows

    @abstractmethod
    def _draw_in_split(self, level: int, seed: int, split: str) -> Row:
        """One row at `level` from `split` ('train', 'held_out' or 'all'), drawn with `seed`."""

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        # Not used: `generate` picks the split from the seed, which an rng does not carry.
        raise NotImplementedError(f"{type(self).__name__}.generate draws its rows by split")
