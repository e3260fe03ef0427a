"""Reasoning-gym: any of its procedural datasets as a curriculum task.

`get_task("reasoning_gym", dataset="chain_sum")`. The dataset's reasoning-gym curriculum
gives the levels: level k sets every attribute to its k-th level (clamped to the
attribute's last level); curriculum levels whose configuration reasoning-gym rejects are
skipped. A dataset without a curriculum has one level. The reply is
`<answer>...</answer>` and `correctness` is the dataset's own `score_answer`.

Rows keep the entry (question, answer, JSON metadata) in `meta` so that it can be
rescored. Where the JSON copy does not rescore like the original (ARC grids are tuples,
which JSON turns into lists), the entry is regenerated from its seed and index instead.

`reasoning_gym` is imported inside the class, so this module imports without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from curriculum.tasks.answer_tags import (
    NO_ANSWER,
    extract_answer,
    failed_evaluation,
    free_answer_verdict,
    shorten,
)
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig
from curriculum.tasks.dataset_task import SYSTEM_PROMPT

# Datasets refused, audited in reasoning-gym 0.1.25. Most have a `score_answer` that hands
# the answer to `eval` or `sympy.parse_expr` (a test re-checks the sources of all others):
# model output never reaches eval in this project. "composite" mixes other datasets:
# combine tasks in the pipeline config instead.
REFUSED_DATASETS: dict[str, str] = {
    **dict.fromkeys(
        ("binary_matrix", "n_queens", "spiral_matrix", "string_insertion"),
        "its score_answer passes the model's answer to eval()",
    ),
    **dict.fromkeys(
        (
            "countdown",
            "intermediate_integration",
            "polynomial_multiplication",
            "puzzle24",
            "simple_integration",
        ),
        "its score_answer passes the model's answer to sympy.parse_expr (which uses eval)",
    ),
    "composite": "it mixes other datasets; list several tasks in the pipeline config instead",
    # Its scorer compares bool(answer) with bool(expected): any non-empty reply scores 1.
    "game_of_life_halting": "its score_answer gives 1.0 to any non-empty answer",
}
RANGE_MODES = ("upper_bound", "inclusive")
# Answers longer than this (or than 4x the expected answer) are not scored: some scorers
# are slow on huge inputs, and no solution is that long.
MAX_ANSWER_CHARS = 10_000
# A number with a 4+ digit exponent ("1e99999999"): `Fraction` and `int` expand it into a
# gigantic integer inside C code that no timeout interrupts (coin_flip's scorer does this).
_HUGE_EXPONENT = re.compile(r"[\d.][eE][+-]?[\d_]{4,}")


@dataclass
class ReasoningGymConfig(TaskConfig):
    dataset: str = ""
    """A reasoning-gym dataset name, e.g. "chain_sum"."""
    config: dict[str, Any] = field(default_factory=dict)
    """Overrides of the dataset's config fields, applied on top of every level."""
    range_mode: str = "upper_bound"
    """How a level sets range attributes: "upper_bound" (only the k-th value) or
    "inclusive" (values of levels 1..k), as in reasoning-gym's curriculum context."""
    system_prompt: str = SYSTEM_PROMPT

    def validate(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ValueError(
                f"dataset must name a reasoning-gym dataset, e.g. 'chain_sum'; got {self.dataset!r}"
            )
        if not isinstance(self.config, dict):
            raise ValueError(
                f"config must be a dict of dataset config overrides, got {self.config!r}"
            )
        reserved = sorted({"seed", "size"} & set(self.config))
        if reserved:
            raise ValueError(f"config keys {reserved} are set by the task itself; remove them")
        if self.range_mode not in RANGE_MODES:
            raise ValueError(
                f"range_mode={self.range_mode!r} is not valid; valid values: {list(RANGE_MODES)}"
            )
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {self.system_prompt!r}")


class ReasoningGymTask(Task):
    """A reasoning-gym dataset whose curriculum levels are our levels."""

    name = "reasoning_gym"
    config_class = ReasoningGymConfig
    signals = ("format", "correctness")

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        from reasoning_gym.factory import DATASETS

        name = self.config.dataset
        if name in REFUSED_DATASETS:
            raise ValueError(
                f"reasoning-gym dataset {name!r} is not supported: {REFUSED_DATASETS[name]}"
            )
        if name not in DATASETS:
            valid = sorted(set(DATASETS) - set(REFUSED_DATASETS))
            raise ValueError(f"unknown reasoning-gym dataset {name!r}; valid datasets: {valid}")
        config_class = DATASETS[name][1]
        valid_keys = sorted({f.name for f in dataclasses.fields(config_class)} - {"seed", "size"})
        unknown = sorted(set(self.config.config) - set(valid_keys))
        if unknown:
            raise ValueError(
                f"unknown config key(s) {unknown} for dataset {name!r}; valid keys: {valid_keys}"
            )
        self._level_kwargs = self._valid_level_kwargs()
        # Both caches are per instance: they hold datasets built from this config.
        self._scorer = lru_cache(maxsize=None)(self._make_scorer)
        self._regenerated = lru_cache(maxsize=1024)(self._regenerate)

    # -------------------------------------------------------------------------- levels

    def _valid_level_kwargs(self) -> list[dict[str, Any]]:
        """Dataset config kwargs per level: the curriculum's levels that validate."""
        from reasoning_gym.coaching.base_curriculum import (
            DefaultCurriculumContext,
            RangeAttributeMode,
        )
        from reasoning_gym.factory import CURRICULA, DATASETS, create_curriculum

        name, overrides = self.config.dataset, self.config.config
        config_class = DATASETS[name][1]
        if name not in CURRICULA:
            candidates = [dict(overrides)]
        else:
            context = DefaultCurriculumContext(mode=RangeAttributeMode(self.config.range_mode))
            count = max(len(a.levels) for a in create_curriculum(name).attributes.values())
            candidates = []
            for index in range(count):
                curriculum = create_curriculum(name)
                curriculum.set_global_level(index)  # clamps each attribute to its last level
                level_config = curriculum.generate_configuration(context=context)
                changed = {f: getattr(level_config, f) for f in _curriculum_fields(curriculum)}
                candidates.append({**changed, **overrides})
        valid, errors = [], []
        for kwargs in candidates:
            try:
                dataset_config = config_class(**kwargs)
                if hasattr(dataset_config, "validate"):
                    dataset_config.validate()  # reasoning-gym validates with assert
            except (AssertionError, ValueError, TypeError) as exc:
                errors.append(str(exc) or type(exc).__name__)
                continue
            valid.append(kwargs)
        if not valid:
            raise ValueError(
                f"no level of reasoning-gym dataset {name!r} has a valid configuration with "
                f"config={overrides!r}: {errors[0]}"
            )
        return valid

    @property
    def num_levels(self) -> int:
        return len(self._level_kwargs)

    def level_config(self, level: int) -> dict[str, Any]:
        """The dataset config kwargs that `level` uses (curriculum values plus overrides)."""
        self.check_level(level)
        return dict(self._level_kwargs[level - 1])

    # -------------------------------------------------------------------------- generation

    def _dataset(self, level: int, size: int, seed: int) -> Any:
        import reasoning_gym

        return reasoning_gym.create_dataset(
            self.config.dataset, size=size, seed=seed, **self._level_kwargs[level - 1]
        )

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows at `level`: entries 0..n-1 of the dataset seeded with `seed`.

        Most reasoning-gym datasets draw entry i with Random(seed + i), as our API asks.
        """
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n == 0:
            return []
        dataset = self._dataset(level, n, seed)
        return [
            self._row(level, dataset, self._draw(dataset, level, i), seed, n, i) for i in range(n)
        ]

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        seed = rng.randrange(2**31)
        dataset = self._dataset(level, 1, seed)
        return self._row(level, dataset, self._draw(dataset, level, 0), seed, 1, 0)

    def _draw(self, dataset: Any, level: int, index: int) -> dict[str, Any]:
        """Entry `index` of `dataset`; a generator failure names the dataset and level."""
        try:
            return dataset[index]
        except Exception as exc:  # e.g. jugs at its top level gives up after a long search
            raise RuntimeError(
                f"reasoning-gym dataset {self.config.dataset!r} failed to generate an entry at "
                f"level {level} ({self._level_kwargs[level - 1]}): {exc}"
            ) from exc

    def _row(
        self, level: int, dataset: Any, entry: dict[str, Any], seed: int, size: int, index: int
    ) -> Row:
        answer = entry["answer"]
        metadata = _json_copy(entry.get("metadata", {}))
        rebuilt = {"question": entry["question"], "answer": answer, "metadata": metadata}
        return self.make_row(
            level,
            self.config.system_prompt,
            entry["question"],
            "" if answer is None else str(answer),
            dataset=self.config.dataset,
            question=entry["question"],
            entry_answer=answer if answer is None else str(answer),
            metadata=metadata,
            seed=seed,
            size=size,
            index=index,
            regenerate=metadata is None or not _rescores_alike(dataset, entry, rebuilt),
        )

    # -------------------------------------------------------------------------- scoring

    def _make_scorer(self, level: int) -> Any:
        return self._dataset(level, 1, 0)

    def _regenerate(self, level: int, seed: int, size: int, index: int) -> dict[str, Any]:
        return self._dataset(level, size, seed)[index]

    def _entry(self, row: Row) -> dict[str, Any]:
        """The reasoning-gym entry a row came from."""
        meta = self.meta(row)
        if meta["regenerate"]:
            return self._regenerated(row["level"], meta["seed"], meta["size"], meta["index"])
        return {
            "question": meta["question"],
            "answer": meta["entry_answer"],
            "metadata": meta["metadata"],
        }

    def reference(self, row: Row) -> str:
        answer = self._entry(row)["answer"]
        if answer is None:
            raise ValueError(
                f"reasoning-gym dataset {self.config.dataset!r} has no single oracle answer "
                "(several answers are valid), so there is no reference completion"
            )
        return f"<answer>{answer}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        answer = extract_answer(completion)
        if answer is None:
            return failed_evaluation(self.signals, NO_ANSWER)
        entry = self._entry(row)
        expected = entry["answer"]
        limit = max(MAX_ANSWER_CHARS, 4 * len(str(expected or "")))
        if len(answer.text) > limit:
            return failed_evaluation(
                self.signals,
                f"The answer is {len(answer.text)} characters long, too long to be a solution.",
            )
        if _HUGE_EXPONENT.search(answer.text):
            return failed_evaluation(
                self.signals, "The answer holds a number with a huge exponent; it was not checked."
            )
        try:
            score = float(self._scorer(row["level"]).score_answer(answer.text, entry))
        except Exception as exc:  # a scorer bug on odd input must not stop training
            return failed_evaluation(
                self.signals,
                f"The answer {shorten(answer.text)!r} could not be checked ({type(exc).__name__}).",
            )
        score = min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0
        reveal = str(expected) if self.config.reveal_answer and expected is not None else None
        return free_answer_verdict(answer, score, reveal)


def _curriculum_fields(curriculum: Any) -> list[str]:
    """The dataset config fields a curriculum sets."""
    from reasoning_gym.coaching import RangeAttributeDefinition

    names: list[str] = []
    for attr in curriculum.attributes.values():
        if isinstance(attr, RangeAttributeDefinition):
            names += [attr.lower_field_name, attr.upper_field_name]
        else:
            names.append(attr.field_name)
    return names


def _json_copy(value: Any) -> Any:
    """`value` through JSON (non-JSON leaves become strings); None when that fails."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):  # e.g. tuple dict keys, circular references
        return None


def _rescores_alike(dataset: Any, entry: dict[str, Any], rebuilt: dict[str, Any]) -> bool:
    """Whether scoring against the JSON copy `rebuilt` matches scoring against `entry`."""
    try:
        if rebuilt["metadata"] == entry.get("metadata", {}):
            return True
    except Exception:  # numpy arrays and the like have no plain equality
        return False
    answer = entry["answer"]
    if not isinstance(answer, str):
        return False  # nothing to compare scores with: regenerate to be safe
    try:
        return dataset.score_answer(answer, rebuilt) == dataset.score_answer(answer, entry)
    except Exception:
        return False
