"""Preference pairs for a reward model: read from JSONL files or from a run's samples.

Input, one JSON object a line:
    {"prompt": ..., "chosen": ..., "rejected": ..., "margin": 0.5}   # margin optional
    {"prompt": ..., "completion": ..., "score": 4}                   # a rating
A prompt is a string or a list of chat messages; completions are strings. Ratings of the
same prompt become pairs (every higher-rated completion against every lower-rated one).
`pairs_from_run(runs/x)` reads the run's `generations.jsonl` instead: completions of the
same prompt, higher reward against lower; where a person added a `"rating"` (a number,
higher is better) to records of a prompt, those ratings are used for that prompt instead.
A malformed record is refused with its file and line.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
from dataclasses import dataclass
from typing import Any

from pipeline.layout import RunLayout
from rewards.pairwise import prompt_key

RATING_FIELD = "rating"
"""A person's score for a record of generations.jsonl (any numeric scale, higher is better)."""


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is better than `rejected` as a reply to `prompt`."""

    prompt: Any
    chosen: str
    rejected: str
    margin: float = 0.0


def read_pairs(path: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a JSONL file of pairs and/or ratings; ValueError naming the bad line."""
    pairs, ratings = [], []
    for where, record in _records(path):
        if "chosen" in record or "rejected" in record:
            _require(where, record, ("prompt", "chosen", "rejected"))
            margin = record.get("margin", 0.0)
            pairs.append(
                Pair(
                    _prompt(where, record["prompt"]),
                    _text(where, record, "chosen"),
                    _text(where, record, "rejected"),
                    _finite(where, "margin", margin),
                )
            )
        elif "completion" in record or "score" in record:
            _require(where, record, ("prompt", "completion", "score"))
            ratings.append(
                (
                    _prompt(where, record["prompt"]),
                    _text(where, record, "completion"),
                    _finite(where, "score", record["score"]),
                )
            )
        else:
            raise ValueError(
                f"{where}: expected a pair {{prompt, chosen, rejected}} or a rating "
                f"{{prompt, completion, score}}, got keys {sorted(record)}"
            )
    pairs += ratings_to_pairs(ratings)
    if not pairs:
        raise ValueError(
            f"{path}: no preference pairs (ratings of a prompt need two different scores)"
        )
    return pairs


def pairs_from_run(run_dir: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a run's generations.jsonl: ratings where a person rated, else rewards."""
    path = RunLayout(run_dir).generations
    if not path.exists():
        raise ValueError(f"{run_dir} has no {path.name}: is it a pipeline.run output folder?")
    by_prompt: dict[str, list[tuple[Any, str, float, bool]]] = {}
    for where, record in _records(path):
        _require(where, record, ("prompt", "completion", "reward"))
        rated = record.get(RATING_FIELD) is not None
        score = record[RATING_FIELD] if rated else record["reward"]
        if not rated and not isinstance(score, numbers.Real):
            continue  # a reward logged as "nan": nothing to learn from
        entry = (
            record["prompt"],
            _text(where, record, "completion"),
            _finite(where, "score", score),
            rated,
        )
        by_prompt.setdefault(prompt_key(record["prompt"]), []).append(entry)
    ratings = []
    for entries in by_prompt.values():
        rated = [e for e in entries if e[3]]
        ratings += [(p, c, s) for p, c, s, _ in (rated or entries)]
    pairs = ratings_to_pairs(ratings)
    if not pairs:
        raise ValueError(f"{path}: no prompt has two completions with different rewards or ratings")
    return pairs


def ratings_to_pairs(ratings: list[tuple[Any, str, float]]) -> list[Pair]:
    """Every higher-scored completion of a prompt against every lower-scored one.

    The margin is the score difference (used only with `--margin true`).
    """
    groups: dict[str, list[tuple[Any, str, float]]] = {}
    for rating in ratings:
        groups.setdefault(prompt_key(rating[0]), []).append(rating)
    pairs = []
    for group in groups.values():
        for prompt, a, score_a in group:
            pairs += [
                Pair(prompt, a, b, score_a - score_b)
                for _, b, score_b in group
                if score_a > score_b
            ]
    return pairs


def _records(path: str | os.PathLike[str]):
    """(where, record) for each non-empty line; `where` is "file, line N"."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{where}: not valid JSON ({err.msg} at column {err.colno})"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _require(where: str, record: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{where}: missing {missing} (has {sorted(record)})")


def _prompt(where: str, prompt: Any) -> Any:
    if isinstance(prompt, str):
        return prompt
    ok = isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not ok or not prompt:
        raise ValueError(
            f"{where}: 'prompt' must be a string or a list of {{role, content}} messages"
        )
    return prompt


def _text(where: str, record: dict, key: str) -> str:
    if not isinstance(record[key], str):
        raise ValueError(f"{where}: {key!r} must be a string, got {type(record[key]).__name__}")
    return record[key]


def _finite(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def split_by_prompt(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): held-out pairs have prompts the training pairs never show."""
    keys = sorted({prompt_key(p.prompt) for p in pairs})
    random.Random(seed).shuffle(keys)
    count = round(fraction * len(keys))
    if fraction > 0 and len(keys) >= 2:
        count = min(max(count, 1), len(keys) - 1)
    held = set(keys[:count])
    return (
        [p for p in pairs if prompt_key(p.prompt) not in held],
        [p for p in pairs if prompt_key(p.prompt) in held],
    )
