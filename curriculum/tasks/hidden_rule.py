"""Hidden rule: an operation whose definition the prompt never states; levels make it harder.

`3#4` asks for `a # b` under a rule such as `a + b + k`. The rule and its constants are the
same for every prompt of a run and level, so what one prompt teaches carries over to every
other prompt. That is the regime in which the ERL paper reports its gains (game symbols
that nobody explains, one global rulebook). The feedback names the error's direction and
size ("it is 3 too low"), never the answer (unless `reveal_answer`) and never the rule.

Held-out prompts are disjoint from training prompts. The operand pairs are split once,
deterministically (1 in `held_out_mod` held out), and a row drawn with seed
`>= HELD_OUT_SEED_BASE` (the project's evaluation seeds) comes from the held-out pairs,
every other row from the training pairs. So held-out success measures whether the rule was
learned, not whether the training answers were memorised.

| Level | Rule | Constants | Operands |
|---|---|---|---|
| 1 | a+b+k | k in 1..5 | one digit |
| 2 | a*k+b | k in 2..4 | one digit |
| 3 | a*b+k | k in 1..9 | one digit |
| 4 | a*k+b*m | k, m in 2..4 | one digit |
| 5 | a*k+b | k in 2..4 | two digits |

`max_operand` widens (or narrows) the operands of every level to `low..max_operand`, `low`
being the level's smallest operand (0, or 10 at level 5): the same rules over more pairs,
so a held-out set can hold more items (`max_operand=24` gives level 1 125 held-out pairs).
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass, field

from curriculum.tasks.arithmetic import evaluate_integer
from curriculum.tasks.base import HELD_OUT_SEED_BASE, Evaluation, Row, SplitTask, TaskConfig  # noqa: F401 (re-exported)

# level -> (rule: a sum of products of a, b and the constants; digits per operand;
#           {constant: (low, high)})
LEVELS: dict[int, tuple[str, int, dict[str, tuple[int, int]]]] = {
    1: ("a+b+k", 1, {"k": (1, 5)}),
    2: ("a*k+b", 1, {"k": (2, 4)}),
    3: ("a*b+k", 1, {"k": (1, 9)}),
    4: ("a*k+b*m", 1, {"k": (2, 4), "m": (2, 4)}),
    5: ("a*k+b", 2, {"k": (2, 4)}),
}
SPLITS = ("auto", "train", "held_out", "all")


@dataclass
class HiddenRuleConfig(TaskConfig):
    rule_seed: int = 0
    """Picks the rule's constants, the same for every prompt of a level (rule_seed 5: level 1
    is a#b = a+b+3; see `HiddenRuleTask.rule_text`)."""
    symbol: str = "#"
    """The unexplained operator shown in prompts."""
    split: str = "auto"
    """Which operand pairs rows use: 'auto' (seed >= HELD_OUT_SEED_BASE: held-out pairs, else
    training pairs), 'train', 'held_out' or 'all'."""
    held_out_mod: int = 5
    """1 in `held_out_mod` operand pairs is held out."""
    max_operand: int = 0
    """The largest operand; 0 keeps each level's own (9, or 99 at level 5)."""
    constants: dict[str, int] = field(default_factory=dict)
    """Fixes constants instead of drawing them from `rule_seed`, at any level whose rule
    uses them and at any value >= 1 (e.g. {"k": 17}: level 1 is a#b = a+b+17)."""

    def validate(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        if not isinstance(self.rule_seed, int) or isinstance(self.rule_seed, bool):
            raise ValueError(f"rule_seed must be an integer, got {self.rule_seed!r}")
        if (
            not isinstance(self.symbol, str)
            or not self.symbol
            or len(self.symbol) > 3
            or any(c.isalnum() or c.isspace() or c in "<>+-*" for c in self.symbol)
        ):
            raise ValueError(
                "symbol must be 1-3 characters, none a letter, digit, space, <, >, +, - or *, "
                f"got {self.symbol!r}"
            )
        for name, value in self.constants.items():
            if name not in {"k", "m"}:
                raise ValueError(f"constants: {name!r} is not a rule constant (k or m)")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"constants: {name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.held_out_mod, int) or self.held_out_mod < 2:
            raise ValueError(f"held_out_mod must be an integer >= 2, got {self.held_out_mod!r}")
        if (
            not isinstance(self.max_operand, int)
            or isinstance(self.max_operand, bool)
            or not (self.max_operand == 0 or 1 <= self.max_operand <= 999)
        ):
            raise ValueError(
                "max_operand must be 0 (each level's own operands) or an integer in 1..999, "
                f"got {self.max_operand!r}"
            )


class HiddenRuleTask(SplitTask):
    """`a # b` under a rule the prompt never states; the reply is `<answer>N</answer>`."""

    name = "hidden_rule"
    config_class = HiddenRuleConfig
    signals = ("format", "correctness", "milestones")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    # The rule ---------------------------------------------------------------------------

    def constants(self, level: int) -> dict[str, int]:
        """The level's constants: drawn for this config's `rule_seed`, or fixed by `constants`."""
        self.check_level(level)
        rng = random.Random(f"hidden_rule:{self.config.rule_seed}:{level}")
        drawn = {name: rng.randint(lo, hi) for name, (lo, hi) in sorted(LEVELS[level][2].items())}
        return {name: self.config.constants.get(name, value) for name, value in drawn.items()}

    def apply(self, level: int, a: int, b: int) -> int:
        """`a # b` at `level`: the formula is a sum of products, evaluated without `eval`."""
        values = {"a": a, "b": b, **self.constants(level)}
        return sum(
            math.prod(values[name] for name in term.split("*"))
            for term in LEVELS[level][0].split("+")
        )

    def rule_text(self, level: int) -> str:
        """The rule as a reflection (or a rulebook) would state it: 'a#b = a+b+3'."""
        formula = LEVELS[level][0]
        for name, value in self.constants(level).items():
            formula = re.sub(rf"\b{name}\b", str(value), formula)
        return f"a{self.config.symbol}b = {formula}"

    # Operand pairs ----------------------------------------------------------------------

    def pairs(self, level: int, split: str) -> list[tuple[int, int]]:
        """The operand pairs of `split` ('train', 'held_out' or 'all') at `level`."""
        self.check_level(level)
        if split not in SPLITS[1:]:
            raise ValueError(f"split must be 'train', 'held_out' or 'all', got {split!r}")
        return list(self._pairs(level, split))

    def split_rows(self, level: int, split: str) -> list[Row]:
        """One row per operand pair of `split`, in order (a whole split, e.g. to evaluate)."""
        return [self._row(level, a, b, split) for a, b in self.pairs(level, split)]

    # The task API -----------------------------------------------------------------------

    def _draw_in_split(self, level: int, seed: int, split: str) -> Row:
        a, b = random.Random(seed).choice(self._pairs(level, split))
        return self._row(level, a, b, split)

    def _pairs(self, level: int, split: str) -> tuple[tuple[int, int], ...]:
        digits = LEVELS[level][1]
        low = 0 if digits == 1 else 10 ** (digits - 1)
        high = self.config.max_operand or 10**digits - 1
        if high <= low:
            raise ValueError(
                f"max_operand {high} leaves level {level} no operands: it must exceed {low}"
            )
        return _pairs(low, high, self.config.held_out_mod, split)

    def _row(self, level: int, a: int, b: int, split: str) -> Row:
        symbol = self.config.symbol
        system = f"The operation {symbol} is hidden. Reply only with <answer>N</answer>."
        answer = str(self.apply(level, a, b))
        return self.make_row(level, system, f"{a}{symbol}{b}", answer, a=a, b=b, split=split)

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        # "3 too low": the size lets a reflection infer the constant, never the answer itself.
        return evaluate_integer(
            completion, int(row["answer"]), self.config.reveal_answer, state_gap=True
        )


@functools.lru_cache(maxsize=32)
def _pairs(low: int, high: int, held_out_mod: int, split: str) -> tuple[tuple[int, int], ...]:
    """Operand pairs in low..high; (a, b) is held out when (3a + 7b) % mod == 0, so every a
    and every b is held out in some pairs and seen in others."""
    every = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    if split == "all":
        return tuple(every)
    held = split == "held_out"
    return tuple(p for p in every if ((3 * p[0] + 7 * p[1]) % held_out_mod == 0) == held)
