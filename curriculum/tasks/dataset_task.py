"""Dataset: any table of prompts, answers and difficulties becomes a curriculum task.

The table is a folder written by `datasets.Dataset.save_to_disk`, a local data file
(.json, .jsonl, .csv, .parquet) or a Hugging Face hub id (loaded with
`datasets.load_dataset`, which needs a network). The distinct values of the difficulty
column, sorted, become levels 1..N. The model replies `<answer>...</answer>`, optionally
after a `<think>...</think>` block; the answer is matched after whitespace and case
normalisation, and numerically when both sides are numbers.

Held out means held out: each level's rows are split once, deterministically, into
training rows and held-out rows (`held_out_fraction` of them, chosen by a fixed shuffle,
or those a boolean `held_out_column` marks). Training draws (seeds below
HELD_OUT_SEED_BASE) come from the training rows only, evaluation draws from the held-out
rows only, so an evaluation never scores a row the run trained on.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from curriculum.tasks.answer_tags import (
    NO_ANSWER,
    extract_answer,
    failed_evaluation,
    free_answer_verdict,
    shorten,
)
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig, is_conversation

SYSTEM_PROMPT = (
    "Solve the problem. You may think inside <think>...</think> first. "
    "Give the final answer inside <answer>...</answer>."
)
MATCH_MODES = ("exact", "numeric")
FILE_FORMATS = (".json", ".jsonl", ".csv", ".parquet")

# A plain decimal, optionally with thousands separators, or a fraction a/b. No exponent:
# `Fraction("1e999999999")` would build a gigantic integer from hostile model output.
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:/\d+)?|[+-]?\.\d+")
_MAX_NUMBER_CHARS = 100


# ----------------------------------------------------------------------------- matching


def normalise(text: str) -> str:
    """`text` with whitespace collapsed and case folded."""
    return " ".join(text.split()).casefold()


def parse_number(text: str) -> Fraction | None:
    """`text` as an exact number ("3", "-2.50", "1,234", "3/4"), or None."""
    text = text.strip()
    if len(text) > _MAX_NUMBER_CHARS or not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(given: str, expected: str, mode: str) -> bool:
    """Whether `given` matches `expected` under `mode` ("exact" or "numeric")."""
    if mode == "numeric":
        a, b = parse_number(given), parse_number(expected)
        if a is not None and b is not None:
            return a == b
    return normalise(given) == normalise(expected)


# ----------------------------------------------------------------------------- config


@dataclass
class DatasetConfig(TaskConfig):
    path: str = ""
    """A `save_to_disk` folder, a .json/.jsonl/.csv/.parquet file, or a hub id."""
    split: str = "train"
    """The split of a saved DatasetDict or hub dataset (a single data file is one split)."""
    prompt_column: str = "question"
    """A string (sent as the user message) or a list of chat messages."""
    answer_column: str = "answer"
    difficulty_column: str | None = "difficulty"
    """None: the whole dataset is one level."""
    difficulty_order: list[Any] | None = None
    """Difficulty values from easiest to hardest; default: sorted values."""
    system_prompt: str = SYSTEM_PROMPT
    match: str = "numeric"
    """"exact": normalised string equality; "numeric": also equal as numbers."""
    held_out_fraction: float = 0.1
    """Share of each level's rows kept for evaluation, never trained on (at least one row of
    a level with two or more; a level of one row trains and cannot be evaluated)."""
    held_out_column: str | None = None
    """A boolean column: true marks a held-out row. Replaces held_out_fraction when set."""

    def validate(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(
                f"path must be a non-empty string (a folder, file or hub id), got {self.path!r}"
            )
        for key in ("split", "prompt_column", "answer_column", "system_prompt"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"{key} must be a string, got {getattr(self, key)!r}")
        if self.difficulty_column is not None and not isinstance(self.difficulty_column, str):
            raise ValueError(
                f"difficulty_column must be a string or None, got {self.difficulty_column!r}"
            )
        if self.match not in MATCH_MODES:
            raise ValueError(
                f"match={self.match!r} is not valid; valid values: {list(MATCH_MODES)}"
            )
        fraction = self.held_out_fraction
        if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool)):
            raise ValueError(f"held_out_fraction must be a number in (0, 1), got {fraction!r}")
        if not 0 < fraction < 1:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {fraction!r}")
        if self.held_out_column is not None and not isinstance(self.held_out_column, str):
            raise ValueError(
                f"held_out_column must be a column name or None, got {self.held_out_column!r}"
            )
        if self.difficulty_order is not None:
            order = self.difficulty_order
            if not isinstance(order, list) or not order or len(set(map(repr, order))) != len(order):
                raise ValueError(
                    f"difficulty_order must be a non-empty list without repeats, got {order!r}"
                )


# ----------------------------------------------------------------------------- loading


def load_columns(config: DatasetConfig, wanted: dict[str, str]) -> dict[str, list[Any]]:
    """The columns `wanted` (config key -> column name) of the dataset at `config.path`.

    A missing column is a ValueError naming the config key and listing the columns.
    """
    path = os.path.expanduser(config.path)
    suffix = os.path.splitext(path)[1].lower()
    if os.path.isfile(path):
        if suffix not in FILE_FORMATS:
            raise ValueError(f"unsupported data file {path!r}; supported: {list(FILE_FORMATS)}")
        table: Any = _read_file(path, suffix)
        names = list(table)
    elif not os.path.isdir(path) and (suffix in FILE_FORMATS or path.startswith((".", "/"))):
        raise ValueError(f"path {path!r} does not exist")
    else:
        import datasets

        if os.path.isdir(path):
            table = datasets.load_from_disk(path)
            if isinstance(table, datasets.DatasetDict):
                if config.split not in table:
                    raise ValueError(
                        f"split {config.split!r} not in {path!r}; splits: {sorted(table)}"
                    )
                table = table[config.split]
        else:  # a hub id: this needs a network, which offline machines do not have
            table = datasets.load_dataset(path, split=config.split)
        names = table.column_names
    for key, name in wanted.items():
        if name not in names:
            raise ValueError(
                f"{key}={name!r}: no such column; the dataset's columns: {sorted(names)}"
            )
    # Only the wanted columns are materialised (a hub dataset may also hold images).
    return {key: list(table[name]) for key, name in wanted.items()}


def _read_file(path: str, suffix: str) -> dict[str, list[Any]]:
    """Read a local data file into memory (no `datasets` cache is written)."""
    if suffix in (".json", ".jsonl"):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        try:
            records = json.loads(text)  # one JSON array (or a single-line jsonl)
        except json.JSONDecodeError:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if isinstance(records, dict):
            records = [records]
        names: dict[str, None] = {}
        for record in records:
            names.update(dict.fromkeys(record))
        return {name: [record.get(name) for record in records] for name in names}
    if suffix == ".csv":
        import pyarrow.csv

        return pyarrow.csv.read_csv(path).to_pydict()
    import pyarrow.parquet

    return pyarrow.parquet.read_table(path).to_pydict()


def _sorted_levels(values: list[Any], order: list[Any] | None) -> list[Any]:
    """The distinct difficulty values from easiest to hardest."""
    try:
        distinct = list(dict.fromkeys(values))
    except TypeError:  # unhashable cells such as lists
        raise ValueError("difficulty values must be numbers or strings") from None
    if order is not None:
        unknown = [v for v in distinct if v not in order]
        if unknown:
            raise ValueError(
                f"difficulty values {unknown[:10]} are missing from difficulty_order {order}"
            )
        return [v for v in order if v in distinct]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct):
        return sorted(distinct)
    if all(isinstance(v, str) for v in distinct):
        return sorted(distinct)
    raise ValueError(
        f"difficulty values {distinct[:10]} mix types; set difficulty_order to rank them"
    )


# ----------------------------------------------------------------------------- split


class _Table(NamedTuple):
    prompts: list[Any]
    answers: list[str]
    values: list[Any]
    """The level values, easiest first."""
    split: list[tuple[list[int], list[int]]]
    """Per level: (training row indices, held-out row indices)."""


def _split_level(
    rows: list[int], fraction: float, marks: list[bool] | None
) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of one level: the rows `marks` flags, else a fixed
    shuffle's first `fraction` of them (at least one of two or more rows, never all)."""
    if marks is not None:
        return [i for i in rows if not marks[i]], [i for i in rows if marks[i]]
    if len(rows) < 2:
        return list(rows), []
    count = min(len(rows) - 1, max(1, round(fraction * len(rows))))
    shuffled = list(rows)
    random.Random(0).shuffle(shuffled)  # fixed: the same split for every run and evaluation
    held_out = set(shuffled[:count])
    return [i for i in rows if i not in held_out], [i for i in rows if i in held_out]


# ----------------------------------------------------------------------------- task


class DatasetTask(Task):
    """Rows of a prompt/answer/difficulty dataset; the reply is `<answer>...</answer>`."""

    name = "dataset"
    config_class = DatasetConfig
    signals = ("format", "correctness")

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self._loaded: _Table | None = None

    def _data(self) -> _Table:
        """The rows' prompts, answers, level values and split, loaded once."""
        if self._loaded is None:
            cfg = self.config
            wanted = {"prompt_column": cfg.prompt_column, "answer_column": cfg.answer_column}
            if cfg.difficulty_column is not None:
                wanted["difficulty_column"] = cfg.difficulty_column
            if cfg.held_out_column is not None:
                wanted["held_out_column"] = cfg.held_out_column
            columns = load_columns(cfg, wanted)
            prompts, answers = columns["prompt_column"], columns["answer_column"]
            if not prompts:
                raise ValueError(f"the dataset at {cfg.path!r} has no rows")
            empty = sum(a is None for a in answers)
            if empty:
                raise ValueError(f"answer_column {cfg.answer_column!r} has {empty} empty value(s)")
            difficulties = columns.get("difficulty_column", [None] * len(prompts))
            if cfg.difficulty_column is None:
                values: list[Any] = [None]
            else:
                if any(d is None for d in difficulties):
                    raise ValueError(
                        f"difficulty_column {cfg.difficulty_column!r} has empty values"
                    )
                values = _sorted_levels(difficulties, cfg.difficulty_order)
            position = {v: k for k, v in enumerate(values)}
            by_level: list[list[int]] = [[] for _ in values]
            for index, value in enumerate(difficulties):
                by_level[position[value]].append(index)
            marks = columns.get("held_out_column")
            if marks is not None and any(not isinstance(m, bool) for m in marks):
                bad = next(m for m in marks if not isinstance(m, bool))
                raise ValueError(
                    f"held_out_column {cfg.held_out_column!r} must hold true/false, got {bad!r}"
                )
            split = [_split_level(rows, cfg.held_out_fraction, marks) for rows in by_level]
            self._loaded = _Table(prompts, [str(a) for a in answers], values, split)
        return self._loaded

    @property
    def num_levels(self) -> int:
        return len(self._data().values)

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows of `level`, the same for the same seed: training rows for a seed below
        HELD_OUT_SEED_BASE, held-out rows from there on.

        Rows are drawn without replacement; when the part has fewer than `n` rows, every
        row is used ⌊n/m⌋ or ⌈n/m⌉ times (whole shuffled passes, then a partial one).
        """
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = self._pool(level, seed)
        rng = random.Random(seed)
        picked: list[int] = []
        while len(picked) < n:
            picked += rng.sample(pool, min(len(pool), n - len(picked)))
        return [self._row(level, index) for index in picked]

    def _pool(self, level: int, seed: int) -> list[int]:
        """The row indices a draw with `seed` takes from: the level's training or held-out part."""
        train, held_out = self._data().split[level - 1]
        if not self.held_out_seed(seed):
            if not train:
                raise ValueError(f"level {level} has no training rows: every row is held out")
            return train
        if not held_out:
            raise ValueError(
                f"level {level} has no held-out rows to evaluate on (it has {len(train)}): "
                "add rows to it, or mark some in held_out_column"
            )
        return held_out

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        return self._row(level, rng.choice(self._data().split[level - 1][0]))

    def _row(self, level: int, index: int) -> Row:
        prompts, answers, values = self._data()[:3]
        prompt = prompts[index]
        value = values[level - 1]
        row = self.make_row(
            level,
            self.config.system_prompt,
            "",
            answers[index],
            index=index,
            difficulty=value if _is_json_scalar(value) else str(value),
        )
        row["prompt"] = self._messages(prompt, index)
        return row

    def _messages(self, prompt: Any, index: int) -> list[dict[str, str]]:
        """The chat messages of a prompt cell; the system prompt is added when absent."""
        system = {"role": "system", "content": self.config.system_prompt}
        if isinstance(prompt, str):
            return [system, {"role": "user", "content": prompt}]
        if is_conversation(prompt):
            messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
            return messages if messages[0]["role"] == "system" else [system, *messages]
        raise ValueError(
            f"prompt_column {self.config.prompt_column!r} row {index} is neither a string nor a "
            f"list of {{'role', 'content'}} messages: {shorten(repr(prompt), 80)}"
        )

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        answer = extract_answer(completion)
        if answer is None:
            return failed_evaluation(self.signals, NO_ANSWER)
        expected = str(row["answer"])
        matched = answers_match(answer.text, expected, self.config.match)
        reveal = expected if self.config.reveal_answer else None
        return free_answer_verdict(answer, 1.0 if matched else 0.0, reveal)


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))
