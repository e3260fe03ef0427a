"""`generations.jsonl`: a few sampled completions with their rewards, every N reward calls.

As in the seed script (`training_logs/generations.jsonl`, every 20 reward calls): reading
what the model actually writes is the fastest way to see a reward being gamed. Each record
is one JSON line appended with a single `os.write` on an `O_APPEND` descriptor, so lines
from several processes (or a crash mid-run) never interleave or tear a line.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

FILENAME = "generations.jsonl"

# A 1 MB completion would make the log unreadable; the head says enough about it.
MAX_TEXT_CHARS = 4000


class GenerationsLog:
    """Appends sampled generations to `<log_dir>/generations.jsonl` on every `every`-th batch."""

    def __init__(self, log_dir: str | os.PathLike[str], every: int = 20, samples: int = 2) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"log_every must be an int >= 1, got {every!r}")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ValueError(f"log_samples must be an int >= 1, got {samples!r}")
        self.path = os.path.join(os.fspath(log_dir), FILENAME)
        self.every = every
        self.samples = samples
        self._last_batch: int | None = None

    def due(self, batch_index: int) -> bool:
        """Whether batch `batch_index` (0, 1, ...) is one to log and has not been logged yet.

        Batches 0, `every`, 2·`every`, ... are logged, so the first call already shows
        whether logging works.
        """
        return batch_index % self.every == 0 and batch_index != self._last_batch

    def write(self, batch_index: int, records: list[dict[str, Any]]) -> None:
        """Append `records` (one JSON line each) and mark `batch_index` as logged."""
        self._last_batch = batch_index
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for record in records:
                os.write(fd, (to_json_line(record)).encode("utf-8"))
        finally:
            os.close(fd)


def to_json_line(record: dict[str, Any]) -> str:
    """One JSON line; long strings are cut, and values JSON cannot hold are written as text."""
    # ensure_ascii keeps lone surrogates (undecodable model bytes) as \udcxx escapes
    # instead of failing to encode them.
    return json.dumps(_shorten(record), ensure_ascii=True, default=repr, allow_nan=False) + "\n"


def _shorten(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # NaN/inf are not JSON
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        return value[:MAX_TEXT_CHARS] + f"... [{len(value) - MAX_TEXT_CHARS} more characters]"
    if isinstance(value, dict):
        return {str(k): _shorten(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shorten(v) for v in value]
    return value
