"""`experience.jsonl`: what ERL did at every step, readable after the run.

One JSON line per reflection and one per retry, every process's, written by the main
process after each ERL step (`ERLTrainer(experience_log=...)`; by default
`<output_dir>/experience.jsonl`, the curriculum run's in its run folder):

- `"kind": "reflection"`: `id` ("step:position"), the row's `task`, `level` and `prompt`,
  the first `attempt` and its `r1`, the `feedback` it got, the stored reflections the
  memory showed (`memory`), the `reflection` as generated, the `lesson` the retries read
  (the reflection without its `<think>` block), and whether a retry with it succeeded
  (`offered`: it was offered to the memory);
- `"kind": "retry"`: the `reflection` id it read (None when retries read the raw
  feedback, `enable_reflection=False`), the row's fields and the first attempt's `r1`,
  the `lesson`, the `retry_prompt` exactly as the model got it (an episode's: its fresh
  prompt with the lesson in the system turn), the `completion` (an episode: its
  messages), `r2` and `success` (r2 reached `reward_threshold`).

`step` is the trainer's global step when the batch was generated (in a curriculum run:
run-global, beside `stage` and `stage_step`); long strings are cut as in
generations.jsonl. docs/run.md shows how to read it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.layout import EXPERIENCE_FILE
from rewards.generations_log import StagedLog


class ExperienceLog(StagedLog):
    """Appends every ERL step's records to `<log_dir>/experience.jsonl`."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        super().__init__(Path(log_dir) / EXPERIENCE_FILE)


def read_experience(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of an experience.jsonl (a run folder or the file), in order; a line a
    kill tore is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / EXPERIENCE_FILE
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
