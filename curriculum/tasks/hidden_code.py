"""Hidden code: letters that stand for digits, a code the prompt never explains.

`Q Z X` asks for the digit each letter stands for, each letter with its digit:
`<answer>Q=3 Z=8 X=1</answer>`. The code (which letter is which digit) is drawn once per
`rule_seed` and is the same for every prompt of a run, so a lesson learned on one prompt
("Q=3") carries to every other prompt that uses the letter. Unlike `hidden_rule`, whose
feedback names only the size of an error, a wrong answer's feedback here names the digit
of every letter it got wrong ("The answer Q=5 Z=2 X=1 is wrong: Q=3 Z=8."), and nothing
about letters the prompt does not use. Each digit follows its letter in the reply, as in a
lesson, so applying a lesson is copying.
Applying that lesson needs no arithmetic, only copying: the project's positive control for
ERL, where a model that can read a lesson should gain from reflection and retry.

The levels grow the code and the symbols per prompt; a higher level's code extends a lower
one's (the same letters keep their digits), so what one stage learned carries to the next:

| Level | Code (letters) | Symbols per prompt | Combinations |
|---|---|---|---|
| 1 | 5 | 3 | 125 |
| 2 | 6 | 3 | 216 |
| 3 | 7 | 4 | 2,401 |
| 4 | 8 | 5 | 32,768 |
| 5 | 10 | 6 | 1,000,000 |

Held-out prompts are combinations never trained on: a combination is held out when a fixed
weighted sum of its letters' positions in the code is divisible by `held_out_mod`, so every
letter, at every place, is trained in some combinations and held out in others. A row drawn
with seed `>= HELD_OUT_SEED_BASE` (the project's evaluation seeds) comes from the held-out
combinations, every other row from the training ones. Held-out success therefore measures
whether the code was learned, not whether training answers were memorised.

Signals: `format` (the reply is the tag alone), `correctness` (every digit right) and
`milestones` (partial credit: the share of symbols decoded right).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from dataclasses import dataclass

from curriculum.tasks.answer_tags import extract_answer, shorten
from curriculum.tasks.base import Evaluation, Row, SplitTask, TaskConfig

ALPHABET = "QZXJKVWYGH"
"""The code's letters (a rule seed orders them and gives each a digit): capitals that
are no digit and no word here, so a prompt's symbols explain nothing by themselves."""
# level -> (letters in the code, symbols per prompt)
LEVELS: dict[int, tuple[int, int]] = {1: (5, 3), 2: (6, 3), 3: (7, 4), 4: (8, 5), 5: (10, 6)}
SPLITS = ("auto", "train", "held_out", "all")
# The weights of the held-out test: none divisible by a small modulus, so that fixing all
# but one place leaves that place's letters in both splits.
_WEIGHTS = (3, 7, 11, 13, 17, 19)
_ENUMERATE_LIMIT = 100_000  # `split_rows` lists a split whole only up to this many combinations
_PAIR = re.compile(r"([A-Z])=(\d)")
SHAPE = "A=d B=d"  # what a reply looks like: each letter, =, its digit


@dataclass
class HiddenCodeConfig(TaskConfig):
    rule_seed: int = 0
    """Picks the code: which letters a level uses and the digit of each (see `rule_text`)."""
    split: str = "auto"
    """Which combinations rows use: 'auto' (seed >= HELD_OUT_SEED_BASE: held-out ones, else
    training ones), 'train', 'held_out' or 'all'."""
    held_out_mod: int = 5
    """1 in `held_out_mod` combinations is held out (2..7)."""

    def validate(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        if not isinstance(self.rule_seed, int) or isinstance(self.rule_seed, bool):
            raise ValueError(f"rule_seed must be an integer, got {self.rule_seed!r}")
        if (
            not isinstance(self.held_out_mod, int)
            or isinstance(self.held_out_mod, bool)
            or not 2 <= self.held_out_mod <= 7
        ):
            raise ValueError(f"held_out_mod must be an integer in 2..7, got {self.held_out_mod!r}")


class HiddenCodeTask(SplitTask):
    """Decode letters of a hidden code into digits; the reply is `<answer>Q=3 Z=8</answer>`."""

    name = "hidden_code"
    config_class = HiddenCodeConfig
    signals = ("format", "correctness", "milestones")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    # The code ---------------------------------------------------------------------------

    def code(self, level: int) -> dict[str, str]:
        """The level's code, letter -> digit, in the code's order (a prefix of level 5's)."""
        self.check_level(level)
        return dict(itertools.islice(_full_code(self.config.rule_seed).items(), LEVELS[level][0]))

    def rule_text(self, level: int) -> str:
        """The whole code as a lesson would state it: 'Q=3 Z=8 X=1 J=0 K=5'."""
        return " ".join(f"{letter}={digit}" for letter, digit in self.code(level).items())

    # Combinations -----------------------------------------------------------------------

    def combinations(self, level: int, split: str) -> list[tuple[str, ...]]:
        """Every combination of `split` ('train', 'held_out' or 'all') at `level`, in order;
        ValueError past 100,000 (levels 4 and 5 draw theirs instead)."""
        self.check_level(level)
        if split not in SPLITS[1:]:
            raise ValueError(f"split must be 'train', 'held_out' or 'all', got {split!r}")
        letters, width = LEVELS[level]
        if letters**width > _ENUMERATE_LIMIT:
            raise ValueError(
                f"level {level} has {letters**width:,} combinations; only levels with at most "
                f"{_ENUMERATE_LIMIT:,} are listed whole"
            )
        return [
            self._letters(level, places)
            for places in itertools.product(range(letters), repeat=width)
            if split == "all" or self._held_out(places) == (split == "held_out")
        ]

    def split_rows(self, level: int, split: str) -> list[Row]:
        """One row per combination of `split`, in order (a whole split, e.g. to evaluate)."""
        return [self._row(level, combo, split) for combo in self.combinations(level, split)]

    def _held_out(self, places: tuple[int, ...]) -> bool:
        return sum(w * p for w, p in zip(_WEIGHTS, places)) % self.config.held_out_mod == 0

    def _letters(self, level: int, places: tuple[int, ...]) -> tuple[str, ...]:
        order = list(self.code(level))
        return tuple(order[p] for p in places)

    # The task API -----------------------------------------------------------------------

    def _draw_in_split(self, level: int, seed: int, split: str) -> Row:
        letters, width = LEVELS[level]
        rng = random.Random(f"hidden_code:{seed}")
        while True:  # rejection: a held-out combination turns up 1 time in `held_out_mod`
            places = tuple(rng.randrange(letters) for _ in range(width))
            if split == "all" or self._held_out(places) == (split == "held_out"):
                return self._row(level, self._letters(level, places), split)

    system_prompt = (
        "Each letter stands for a digit. Decode the letters in order. Reply only with "
        f"<answer>{SHAPE}</answer>: each letter, = and its digit."
    )

    def _row(self, level: int, combo: tuple[str, ...], split: str) -> Row:
        code = self.code(level)
        answer = "".join(code[letter] for letter in combo)
        return self.make_row(
            level, self.system_prompt, " ".join(combo), answer, symbols=list(combo), split=split
        )

    def reference(self, row: Row) -> str:
        return f"<answer>{_pairs(self.meta(row)['symbols'], row['answer'])}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        symbols = self.meta(row)["symbols"]
        expected = list(zip(symbols, str(row["answer"])))
        tag = extract_answer(completion)
        if tag is None:
            return Evaluation(
                0.0,
                {"format": 0.0, "correctness": 0.0, "milestones": 0.0},
                error=f"No <answer>...</answer> tag found; reply <answer>{SHAPE}</answer>, each "
                "letter with its digit.",
            )
        feedback: dict[str, str] = {}
        if not tag.bare:
            feedback["format"] = (
                f"Reply with only <answer>{SHAPE}</answer>, each letter with its digit, and no "
                "other text."
            )
        given = _read_pairs(tag.text)
        right = [i < len(given) and given[i] == pair for i, pair in enumerate(expected)]
        solved = all(right) and len(given) == len(expected)
        if not solved:
            feedback["correctness"] = _wrong_feedback(tag.text, given, expected, right)
            if self.config.reveal_answer:
                feedback["correctness"] += f" The correct answer is {_pairs(*zip(*expected))}."
            feedback["milestones"] = f"{sum(right)} of {len(expected)} letters are right."
        elif not tag.bare:
            feedback["correctness"] = (
                "The digits are right but count only in a reply that is the tag alone."
            )
        breakdown = {
            "format": 1.0 if tag.bare else 0.5,
            "correctness": 1.0 if solved and tag.bare else 0.0,
            # Extra pairs cost as much as wrong ones, so padding cannot farm partial credit.
            "milestones": sum(right) / max(len(expected), len(given)),
        }
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _pairs(symbols, digits) -> str:
    """'Q=3 Z=8 X=1': each letter with its digit, in order."""
    return " ".join(f"{letter}={digit}" for letter, digit in zip(symbols, digits))


def _read_pairs(text: str) -> list[tuple[str, str]]:
    """The (letter, digit) pairs of an answer, in order; [] unless every word is one."""
    found = [_PAIR.fullmatch(word) for word in text.split()]
    return [m.groups() for m in found] if all(found) else []


def wrong_letters(expected: list[tuple[str, str]], right: list[bool]) -> str:
    """'Q=3 Z=8': the digit of each letter that was got wrong (or left out), each letter
    once, in the prompt's order; nothing about letters the prompt lacks."""
    named: dict[str, str] = {}
    for (letter, digit), ok in zip(expected, right):
        if not ok:
            named.setdefault(letter, digit)
    return _pairs(named, named.values())


def _wrong_feedback(
    text: str, given: list[tuple[str, str]], expected: list[tuple[str, str]], right: list[bool]
) -> str:
    """'The answer Q=5 Z=2 X=1 is wrong: Q=3 Z=8.': the digit of each letter the answer got
    wrong (or left out), each letter once; nothing about letters the prompt lacks."""
    meanings = wrong_letters(expected, right)
    if not given:
        shown = "is empty" if not text else f"{shorten(text, 20)!r} is not {SHAPE} pairs"
        return f"The answer {shown}: {meanings}."
    said = f"The answer {_pairs(*zip(*given[:8]))}{'...' if len(given) > 8 else ''}"
    if not meanings:  # every letter right, but pairs past the last letter
        return f"{said} has {len(given) - len(expected)} pair(s) too many: one per letter."
    return f"{said} is wrong: {meanings}."


@functools.lru_cache(maxsize=64)
def _full_code(rule_seed: int) -> dict[str, str]:
    """Rule seed -> the whole code: every letter of ALPHABET in a seeded order, each with a
    distinct digit. Every level's code is a prefix of it."""
    rng = random.Random(f"hidden_code:{rule_seed}")
    letters, digits = list(ALPHABET), list("0123456789")
    rng.shuffle(letters)
    rng.shuffle(digits)
    return dict(zip(letters, digits))
