"""`generations.jsonl`: a few sampled completions with their rewards, every N reward calls.

As in the seed script (`training_logs/generations.jsonl`, every 20 reward calls): reading
what the model actually writes is the fastest way to see a reward being gamed. Every
`every`-th batch of first attempts is sampled, and so is the batch of retries that
follows it (records with `"attempt": 2`); the samples of a batch come from different
prompts where the batch has several. In a curriculum run each record also carries its
`stage` and the run-global `step`. Each record is one JSON line appended with a single
`os.write` on an `O_APPEND` descriptor, so lines from several processes (or a crash
mid-run) never interleave or tear a line.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from curriculum.atomic import atomic_write_bytes

GENERATIONS_FILE = "generations.jsonl"

# A 1 MB completion would make the log unreadable; the head says enough about it.
MAX_TEXT_CHARS = 4000


class StagedLog:
    """A JSON-lines file that a curriculum run tags with its stage and run-global step,
    and that a resumed stage trims to what it will not write again (`start_stage`).
    Records are appended with one `os.write` each on an `O_APPEND` descriptor."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.stage: int | None = None
        """The curriculum stage being trained (None outside a curriculum run)."""
        self.step_offset = 0
        """Steps of the run before this stage: a trainer's global_step restarts per stage."""

    def start_stage(self, stage: int, step_offset: int, stage_step: int = 0) -> None:
        """Tag the following records with `stage` and run-global steps; drop records a
        resumed stage will write again (those of this stage from `stage_step` on)."""
        self.stage, self.step_offset = stage, step_offset
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
        kept = [line for line in lines if _kept(line, stage, stage_step)]
        if len(kept) != len(lines):
            atomic_write_bytes(self.path, "".join(kept).encode("utf-8", "surrogateescape"))

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append `records`, one JSON line each. A record's `step` (the trainer's
        global_step) becomes run-global, and its `stage` is added."""
        if not records:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for record in records:
                if self.stage is not None:
                    stage_step = record.get("step")
                    record = {"stage": self.stage, **record, "stage_step": stage_step}
                    if stage_step is not None:
                        record["step"] = self.step_offset + stage_step
                os.write(fd, (to_json_line(record)).encode("utf-8"))
        finally:
            os.close(fd)


class GenerationsLog(StagedLog):
    """Appends sampled generations to `<log_dir>/generations.jsonl` on every `every`-th batch."""

    def __init__(self, log_dir: str | os.PathLike[str], every: int = 20, samples: int = 2) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"log_every must be an int >= 1, got {every!r}")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ValueError(f"log_samples must be an int >= 1, got {samples!r}")
        super().__init__(os.path.join(os.fspath(log_dir), GENERATIONS_FILE))
        self.every = every
        self.samples = samples
        self._last_batch: int | None = None
        self._first_attempt_batches = 0
        self._logged_first_attempts = False

    def due(self, batch_index: int, retry: bool = False) -> bool:
        """Whether batch `batch_index` (0, 1, ...) is one to log and has not been logged yet.

        First-attempt batches 0, `every`, 2·`every`, ... are logged (so the first call
        already shows whether logging works), and a retry batch when the first attempts
        before it were.
        """
        if batch_index == self._last_batch:
            return False
        if retry:
            return self._logged_first_attempts
        due = self._first_attempt_batches % self.every == 0
        self._first_attempt_batches += 1
        self._logged_first_attempts = due
        if not due:
            self._last_batch = batch_index
        return due

    def pick(self, prompts: list[Any]) -> list[int]:
        """Up to `samples` row indices, each from a different prompt while there are any
        (GRPO repeats each prompt `num_generations` times in a row)."""
        seen, first, rest = set(), [], []
        for i, prompt in enumerate(prompts):
            key = json.dumps(prompt, sort_keys=True, default=repr)
            (rest if key in seen else first).append(i)
            seen.add(key)
        return (first + rest)[: self.samples]

    def write(self, batch_index: int, records: list[dict[str, Any]]) -> None:
        """Append `records` (`StagedLog.append`) and mark `batch_index` as logged."""
        self._last_batch = batch_index
        self.append(records)


def _kept(line: str, stage: int, stage_step: int) -> bool:
    """Whether a record survives a resume of `stage` from `stage_step`."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False  # a line torn by a kill
    if not isinstance(record, dict) or record.get("stage") is None:
        return True
    if record["stage"] != stage:
        return record["stage"] < stage
    return isinstance(record.get("stage_step"), int) and record["stage_step"] < stage_step


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
