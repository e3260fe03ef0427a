"""Preference pairs for a reward model: from JSONL, from a `datasets` dataset, or from a run.

`read_pairs(file.jsonl)` reads one JSON object a line; `read_dataset(name)` reads the rows
of a dataset (a folder saved with `save_to_disk`, a parquet/JSON/JSONL/CSV file, or a hub
id). Either holds preference pairs in any of TRL's preference formats (standard or
conversational, explicit or implicit prompt, optional margin) and/or the project's ratings
`{"prompt", "completion", "score"}`: see `pipeline.reward_model.formats`. Ratings of the
same prompt become pairs (every higher-rated completion against every lower-rated one).
`pairs_from_run(runs/x)` reads the run's `generations.jsonl` instead: completions of the
same prompt, higher reward against lower; where a person added a `"rating"` (a number,
higher is better) to records of a prompt, those ratings are used for that prompt instead.
A malformed record is refused with its file and line, or its dataset and row.
"""

from __future__ import annotations

import json
import numbers
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from curriculum.tasks.base import prompt_key
from pipeline.layout import RunLayout
from pipeline.reward_model.formats import (
    Pair,
    Reply,
    finite,
    is_pair,
    is_rating,
    read_completion,
    read_pair,
    read_rating,
    require,
)

RATING_FIELD = "rating"
"""A person's score for a record of generations.jsonl (any numeric scale, higher is better)."""

# Data files `--dataset_name` reads by their extension, and the datasets builder for each.
DATA_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def read_pairs(path: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a JSONL file of pairs and/or ratings; ValueError naming the bad line."""
    return pairs_from_records(_jsonl_records(path), str(path))


def read_dataset(name: str, config: str | None = None, split: str = "train") -> list[Pair]:
    """Pairs from a `datasets` dataset, as TRL's scripts take `--dataset_name`; ValueError
    naming the bad row, or saying why the dataset could not be loaded."""
    dataset = _load_dataset(name, config, split)
    rows = (
        (f"{name}, row {i}", {k: v for k, v in row.items() if v is not None})  # Arrow's gaps
        for i, row in enumerate(dataset)
    )
    return pairs_from_records(rows, name)


def pairs_from_records(records: Iterable[tuple[str, dict]], source: str) -> list[Pair]:
    """Pairs from (where, record) items: pairs as they are, ratings paired within a prompt."""
    pairs, ratings = [], []
    for where, record in records:
        if is_pair(record):
            pairs.append(read_pair(where, record))
        elif is_rating(record):
            ratings.append(read_rating(where, record))
        else:
            raise ValueError(
                f"{where}: expected a pair {{prompt, chosen, rejected}} or a rating "
                f"{{prompt, completion, score}}, got keys {sorted(record)} (a pair's prompt "
                "may also be implicit, the shared start of chosen and rejected)"
            )
    pairs += ratings_to_pairs(ratings)
    if not pairs:
        raise ValueError(
            f"{source}: no preference pairs (ratings of a prompt need two different scores)"
        )
    return pairs


def pairs_from_run(run_dir: str | os.PathLike[str]) -> list[Pair]:
    """Pairs from a run's generations.jsonl: ratings where a person rated, else rewards."""
    path = RunLayout(run_dir).generations
    if not path.exists():
        raise ValueError(f"{run_dir} has no {path.name}: is it a pipeline.run output folder?")
    by_prompt: dict[str, list[tuple[Any, Reply, float, bool]]] = {}
    for where, record in _jsonl_records(path):
        require(where, record, ("prompt", "completion", "reward"))
        rated = record.get(RATING_FIELD) is not None
        score = record[RATING_FIELD] if rated else record["reward"]
        if not rated and not isinstance(score, numbers.Real):
            continue  # a reward logged as "nan": nothing to learn from
        entry = (
            record["prompt"],
            read_completion(where, record, "completion"),
            finite(where, "score", score),
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


def ratings_to_pairs(ratings: list[tuple[Any, Reply, float]]) -> list[Pair]:
    """Every higher-scored completion of a prompt against every lower-scored one.

    The margin is the score difference (used only with `--margin true`).
    """
    groups: dict[str, list[tuple[Any, Reply, float]]] = {}
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


def _jsonl_records(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict]]:
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


def _load_dataset(name: str, config: str | None, split: str):
    """The split of a saved folder, a data file or a hub dataset; ValueError when it fails."""
    import datasets

    path = Path(name)
    try:
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            dataset = datasets.load_from_disk(name)  # save_to_disk's folder: Dataset or dict
            if isinstance(dataset, datasets.DatasetDict):
                if split not in dataset:
                    raise ValueError(f"no split {split!r}; its splits: {sorted(dataset)}")
                dataset = dataset[split]
            return dataset
        if path.is_file() and path.suffix in DATA_FILE_BUILDERS:
            builder = DATA_FILE_BUILDERS[path.suffix]
            return datasets.load_dataset(builder, data_files=name, split=split)
        return datasets.load_dataset(name, name=config, split=split)  # a hub id or data folder
    except (OSError, ValueError) as err:  # ConnectionError, DatasetNotFoundError, no split
        raise ValueError(
            f"--dataset_name {name}: cannot load it: {err} (it takes a folder saved with "
            "save_to_disk, a .parquet/.json/.jsonl/.csv file, or a hub id this machine can "
            "reach)"
        ) from None


def split_by_prompt(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): held-out pairs have questions (`Pair.question`, else prompts) the
    training pairs never show."""

    def key(pair: Pair) -> str:
        return prompt_key(pair.prompt if pair.question is None else pair.question)

    keys = sorted({key(p) for p in pairs})
    random.Random(seed).shuffle(keys)
    count = round(fraction * len(keys))
    if fraction > 0 and len(keys) >= 2:
        count = min(max(count, 1), len(keys) - 1)
    held = set(keys[:count])
    return [p for p in pairs if key(p) not in held], [p for p in pairs if key(p) in held]
