"""The shared scorer: one `task.evaluate` per completion per step, whatever the signal count.

GRPOTrainer calls every reward function on the same batch, one after the other, and the
ERL trainer then calls the feedback function on it too. Each of those callers asks the
`Scorer` for the batch; the scorer evaluates each completion once and hands the same
results to all of them. Two layers make that hold:

- the current batch: while the same completions come back from a caller that has not yet
  been served for them, they are the same batch and get the same results, untouched;
- a bounded LRU of Evaluations keyed by (task, level, answer, meta, completion), so that a
  completion seen recently (a repeated sample, a retry equal to its first attempt) is not
  verified again.

A completion that cannot be scored is a *failure*: its Evaluation has `error` set (it
could not be parsed), the verifier raised, or a value is not a finite number in [0, 1].
Failures are counted once per batch (`failures`, `failure_kinds`, `last_failure_rate`)
and reported to TRL through `log_metric` as `rewards/fallback_rate` when TRL passes one.
Only the reward functions count; the feedback function reads the same results, so calling
it on the batch (or on the subset of rows that go on to reflection) counts nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from curriculum.tasks.agent import is_agent_task
from curriculum.tasks.base import Evaluation, Row, Task

logger = logging.getLogger(__name__)

# Dataset columns a verifier reads; GRPOTrainer passes each as a keyword argument (a list).
ROW_COLUMNS = ("task", "level", "answer", "meta")

# Beside TRL's own "rewards/<func>/mean" metrics.
FAILURE_METRIC = "rewards/fallback_rate"

# Shown to the model when the verifier itself failed: nothing about the exception, which
# could quote the expected answer.
VERIFIER_FAILED = "The reply could not be checked; answer in exactly the format the task asks for."
NOT_FINITE = "The reply could not be scored; answer in exactly the format the task asks for."


@dataclass(frozen=True)
class Scored:
    """The outcome for one completion: its Evaluation, or why it scores the fallback."""

    evaluation: Evaluation | None
    """None only when the verifier raised."""
    failure: str | None = None
    """A sentence for the model when the completion scores the fallback; None otherwise."""
    kind: str | None = None
    """Failure category for the metrics: parse_error, verifier_raised or bad_value."""


@dataclass
class ScoredBatch:
    """One batch of completions with their rows and results, shared by all callers."""

    keys: tuple[bytes, ...]
    rows: list[Row]
    texts: list[str]
    results: list[Scored]
    completions: list[Any] = field(default_factory=list)
    """The completions as given: an agent's are its episodes' messages."""
    served: set[str] = field(default_factory=set)
    """Names of the callers that already got this batch."""
    index: int | None = None
    """Its place among the counted batches (0, 1, ...); None until a counting caller got it."""


def completion_text(completion: Any) -> str:
    """The text of a completion: a plain string, or the contents of a conversational one.
    An agent's episode keeps its tool calls and the tools' replies, as the chat template
    writes them (`<tool_call>` / `<tool_response>`), so that two episodes differ in text
    whenever they differ in what was done."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, Sequence):
        return "".join(_message_text(message) for message in completion)
    raise ValueError(
        f"a completion must be a string or a list of {{'role', 'content'}} messages, "
        f"got {type(completion).__name__}"
    )


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        raise ValueError(f"a conversational completion holds dicts, got {type(message).__name__}")
    text = _content_text(message.get("content"))
    if message.get("role") == "tool":
        return f"<tool_response>{text}</tool_response>"
    calls = message.get("tool_calls") or []
    for call in calls if isinstance(calls, list) else [calls]:
        function = call.get("function", call) if isinstance(call, dict) else call
        text += f"<tool_call>{json.dumps(function, default=str, sort_keys=True)}</tool_call>"
    return text


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Multimodal-style content: a list of parts, of which only the text ones matter here.
    return "".join(
        part.get("text") or ""
        for part in content
        if isinstance(part, dict) and part.get("type") == "text"
    )


class Scorer:
    """Evaluates a batch of completions for `task` once and shares the results."""

    def __init__(self, task: Task, cache_size: int = 4096) -> None:
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}")
        self.task = task
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, Scored] = OrderedDict()
        self._current: ScoredBatch | None = None
        self.batches = 0
        """How many batches this scorer has seen."""
        self.evaluations = 0
        """How many times `task.evaluate` ran."""
        self.completions = 0
        """Completions scored, counted once per batch."""
        self.failures = 0
        """Completions that scored the fallback, counted once per batch."""
        self.failure_kinds: Counter[str] = Counter()
        self.last_failure_rate = 0.0
        self._repeats: Counter[str] = Counter()  # warnings logged once, then counted

    def score(
        self, caller: str, completions: Sequence[Any], columns: dict[str, Any], count: bool = True
    ) -> ScoredBatch:
        """The batch for these completions and keyword arguments, evaluated at most once.

        `caller` names the function asking; `columns` holds GRPOTrainer's keyword arguments.
        `count`: whether this caller counts batches and failures (reward functions do; the
        feedback function does not, so feedback on a subset of rows counts nothing twice).
        """
        rows = self._rows(len(completions), columns)
        texts = [completion_text(c) for c in completions]
        keys = tuple(_cache_key(row, text) for row, text in zip(rows, texts, strict=True))
        batch = self._current
        if batch is None or batch.keys != keys or caller in batch.served:
            results = [
                self._lookup(key, row, text, completion)
                for key, row, text, completion in zip(keys, rows, texts, completions, strict=True)
            ]
            batch = self._current = ScoredBatch(keys, rows, texts, results, list(completions))
        if count and batch.index is None:
            self._count(batch, columns.get("log_metric"))
        batch.served.add(caller)
        return batch

    # Internals ---------------------------------------------------------------------

    def _rows(self, n: int, columns: dict[str, Any]) -> list[Row]:
        """Rebuild the dataset rows from GRPOTrainer's per-column keyword lists."""
        missing = [name for name in ROW_COLUMNS if name not in columns]
        if missing:
            raise ValueError(
                f"reward functions need the dataset columns {list(ROW_COLUMNS)}; missing {missing}"
            )
        for name in ROW_COLUMNS:
            if len(columns[name]) != n:
                raise ValueError(
                    f"column {name!r} has {len(columns[name])} values for {n} completions"
                )
        prompts = columns.get("prompts") or [None] * n
        rows = []
        for i in range(n):
            row = {name: columns[name][i] for name in ROW_COLUMNS}
            if row["task"] != self.task.name:
                raise ValueError(
                    f"row {i} is a {row['task']!r} row but these reward functions were built "
                    f"for task {self.task.name!r}"
                )
            row["prompt"] = prompts[i]
            rows.append(row)
        return rows

    def _count(self, batch: ScoredBatch, log_metric: Callable[[str, float], None] | None) -> None:
        """Number the batch and add its failures to the counts (and to TRL's metrics)."""
        batch.index = self.batches
        self.batches += 1
        failed = [r.kind for r in batch.results if r.kind is not None]
        self.completions += len(batch.results)
        self.failures += len(failed)
        self.failure_kinds.update(failed)
        self.last_failure_rate = len(failed) / len(batch.results) if batch.results else 0.0
        if log_metric is not None:
            log_metric(FAILURE_METRIC, self.last_failure_rate)

    def _lookup(self, key: bytes, row: Row, text: str, completion: Any) -> Scored:
        scored = self._cache.get(key)
        if scored is not None:
            self._cache.move_to_end(key)
            return scored
        # An agent task judges the episode itself (its messages), any other the text.
        scored = self._evaluate(row, completion if is_agent_task(self.task) else text)
        if self.cache_size:
            self._cache[key] = scored
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return scored

    def _evaluate(self, row: Row, completion: Any) -> Scored:
        self.evaluations += 1
        try:
            evaluation = self.task.evaluate(row, completion)
        except Exception as exc:  # a verifier bug must not stop training: count and go on
            self._warn(f"task {self.task.name!r} verifier raised {type(exc).__name__}: {exc}")
            return Scored(None, VERIFIER_FAILED, "verifier_raised")
        if evaluation.error is not None:
            return Scored(evaluation, evaluation.error, "parse_error")
        if not _valid_values(evaluation, self.task.signals):
            self._warn(
                f"task {self.task.name!r} returned reward {evaluation.reward!r}, breakdown "
                f"{evaluation.breakdown!r}: not finite numbers in [0, 1] for {self.task.signals}"
            )
            return Scored(evaluation, NOT_FINITE, "bad_value")
        return Scored(evaluation)

    def _warn(self, message: str) -> None:
        """Log `message` the first time; count its repeats (`repeated_warnings` reports them)."""
        if message not in self._repeats:
            logger.warning("%s (repeats are counted, not printed)", message)
        self._repeats[message] += 1

    def repeated_warnings(self) -> list[str]:
        """One line per warning that repeated since the last call, with its count; resets."""
        lines = [
            f"{message} ({count - 1} more times)" for message, count in self._repeats.items()
            if count > 1
        ]  # fmt: skip
        self._repeats.clear()
        return lines


def shared_scorer(task: Task, scorer: Scorer | None) -> Scorer:
    """`scorer`, checked to be for `task`, or a new Scorer when None."""
    if scorer is None:
        return Scorer(task)
    if scorer.task is not task:
        raise ValueError(
            f"the scorer was built for another task instance ({scorer.task.name!r}) than this "
            f"{task.name!r} task; build the reward and feedback functions with the same task"
        )
    return scorer


def _valid_values(evaluation: Evaluation, signals: tuple[str, ...]) -> bool:
    """Whether the reward and every signal are finite numbers in [0, 1]."""
    values = [evaluation.reward] + [evaluation.breakdown.get(name) for name in signals]
    return all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
        for v in values
    )


def _cache_key(row: Row, text: str) -> bytes:
    """A fixed-size digest of what the verifier reads, so a 1 MB completion costs 16 bytes."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (row["task"], row["level"], row["answer"], row["meta"]):
        digest.update(repr(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    # surrogatepass: completions decoded with errors="surrogateescape" hold lone surrogates.
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()
