"""Dataset: any table of prompts, answers and difficulties becomes a curriculum task.

The table is a folder written by `datasets.Dataset.save_to_disk`, a local data file
(.json, .jsonl, .csv, .parquet) or a Hugging Face hub id (loaded with
`datasets.load_dataset`, which needs a network). The distinct values of the difficulty
column, sorted, become levels 1..N. The model replies `<answer>...</answer>`, optionally
after a `<think>...</think>` block; the answer is matched after whitespace and case
normalisation, and numerically when both sides are numbers.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from curriculum.tasks.answer_tags import (
    NO_ANSWER,
    extract_answer,
    failed_evaluation,
    free_answer_verdict,
    shorten,
)
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig

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


# ----------------------------------------------------------------------------- task


class DatasetTask(Task):
    """Rows of a prompt/answer/difficulty dataset; the reply is `<answer>...</answer>`."""

    name = "dataset"
    config_class = DatasetConfig
    signals = ("format", "correctness")

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self._loaded: tuple[list[Any], list[str], list[Any], list[list[int]]] | None = None

    def _data(self) -> tuple[list[Any], list[str], list[Any], list[list[int]]]:
        """(prompts, answers, level values, row indices per level), loaded once."""
        if self._loaded is None:
            cfg = self.config
            wanted = {"prompt_column": cfg.prompt_column, "answer_column": cfg.answer_column}
            if cfg.difficulty_column is not None:
                wanted["difficulty_column"] = cfg.difficulty_column
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
            self._loaded = (prompts, [str(a) for a in answers], values, by_level)
        return self._loaded

    @property
    def num_levels(self) -> int:
        return len(self._data()[3])

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows of `level`, the same for the same seed.

        Rows are drawn without replacement; when the level has fewer than `n` rows, every
        row is used ⌊n/m⌋ or ⌈n/m⌉ times (whole shuffled passes, then a partial one).
        """
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = self._data()[3][level - 1]
        rng = random.Random(seed)
        picked: list[int] = []
        while len(picked) < n:
            picked += rng.sample(pool, min(len(pool), n - len(picked)))
        return [self._row(level, index) for index in picked]

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        return self._row(level, rng.choice(self._data()[3][level - 1]))

    def _row(self, level: int, index: int) -> Row:
        prompts, answers, values, _ = self._data()
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
        if (
            isinstance(prompt, list)
            and prompt
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in prompt
            )
        ):
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
