"""The run's `curriculum_state.json`: which stages ran, how they ended, and the controller.

The file is a contract other tools read:

    {"stages": [{"stage": k, "level": L, "status": "running"|"promoted"|"plateau",
                 "steps": n, "r1_mean": x|null, "eval_reward": y|null,
                 "checkpoint": "stage_k"|null, "r2_mean": z|null, "action": a|null,
                 "next_level": L'|null, "demoted": bool}, ...],
     "current_stage": k, "finished": bool, "controller": {...}}

Every write is atomic (`curriculum.atomic`), so a kill at any moment leaves either the old
file or the new one. Resume semantics: a stage whose status is "promoted" or
"plateau" is finished and never trained again; a "running" stage resumes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from curriculum.atomic import atomic_write_json

Status = Literal["running", "promoted", "plateau"]
STATUSES: tuple[str, ...] = ("running", "promoted", "plateau")
FINISHED_STATUSES: tuple[str, ...] = ("promoted", "plateau")


class CorruptStateError(ValueError):
    """The state file exists but cannot be read as a curriculum state."""


@dataclass
class StageEntry:
    """One stage of the run as recorded in the state file."""

    stage: int
    level: int
    status: Status = "running"
    steps: int = 0
    r1_mean: float | None = None
    eval_reward: float | None = None
    checkpoint: str | None = None
    r2_mean: float | None = None
    action: str | None = None
    """What the controller decided at the stage's end: advance, repeat, demote or stop."""
    next_level: int | None = None
    demoted: bool = False

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


_REQUIRED = ("stage", "level", "status", "steps", "r1_mean", "eval_reward", "checkpoint")
_STAGE_FIELDS = {f.name for f in fields(StageEntry)}


def _entry_from_dict(raw: Any) -> StageEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"a stage entry must be an object, got {raw!r}")
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"stage entry {raw!r} lacks {missing}")
    if raw["status"] not in STATUSES:
        raise ValueError(f"stage status {raw['status']!r} is not one of {list(STATUSES)}")
    # Keys written by newer versions are dropped rather than rejected.
    return StageEntry(**{k: v for k, v in raw.items() if k in _STAGE_FIELDS})


@dataclass
class CurriculumState:
    """The run's stages, the current stage, whether it finished, and the controller state."""

    path: Path
    stages: list[StageEntry] = field(default_factory=list)
    current_stage: int = 0
    """The last started stage (0: none yet)."""
    finished: bool = False
    controller: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CurriculumState:
        """The state in `path`; a fresh one when the file does not exist."""
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError(f"the top level must be an object, got {type(raw).__name__}")
            if not isinstance(raw["stages"], list):
                raise ValueError("'stages' must be a list")
            stages = [_entry_from_dict(entry) for entry in raw["stages"]]
            controller = raw.get("controller") or {}
            if not isinstance(controller, dict):
                raise ValueError("'controller' must be an object")
            return cls(path, stages, int(raw["current_stage"]), bool(raw["finished"]), controller)
        except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
            raise CorruptStateError(
                f"curriculum state file {path} is corrupt ({err}); fix or delete it to start over"
            ) from err

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to the state file."""
        return {
            "stages": [asdict(entry) for entry in self.stages],
            "current_stage": self.current_stage,
            "finished": self.finished,
            "controller": self.controller,
        }

    def save(self) -> None:
        """Write the state atomically to its path."""
        atomic_write_json(self.path, self.to_dict())

    def stage_entry(self, stage: int) -> StageEntry | None:
        """The entry of stage number `stage`, None if it never started."""
        return next((entry for entry in self.stages if entry.stage == stage), None)

    def is_stage_finished(self, stage: int) -> bool:
        """Whether stage `stage` ended (promoted or plateau): a resume must not retrain it."""
        entry = self.stage_entry(stage)
        return entry is not None and entry.finished

    def running_stage(self) -> StageEntry | None:
        """The stage that started and has not finished: the one a resume continues."""
        return next((entry for entry in self.stages if not entry.finished), None)

    def start_stage(self, level: int, controller: dict[str, Any] | None = None) -> StageEntry:
        """Open the next stage at `level` and save; the running stage if one is open."""
        if self.finished:
            raise RuntimeError(f"the run in {self.path} is finished; no stage can start")
        running = self.running_stage()
        if running is not None:
            if running.level != level:
                raise RuntimeError(
                    f"stage {running.stage} is still running at level {running.level}; "
                    f"cannot start a stage at level {level}"
                )
            return running
        entry = StageEntry(stage=len(self.stages) + 1, level=level)
        self.stages.append(entry)
        self.current_stage = entry.stage
        if controller is not None:
            self.controller = controller
        self.save()
        return entry

    def finish_stage(
        self,
        stage: int,
        status: Status,
        *,
        steps: int,
        r1_mean: float | None,
        controller: dict[str, Any],
        run_finished: bool = False,
        **details: Any,
    ) -> StageEntry:
        """Close stage `stage` with its outcome and the controller state, in ONE atomic write.

        `details` sets the other entry fields (eval_reward, checkpoint, r2_mean, action,
        next_level); `demoted` follows from action == "demote". Writing the entry and the controller together means a
        resume never sees a finished stage with a controller still inside it.
        """
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status {status!r} is not one of {list(FINISHED_STATUSES)}")
        unknown = sorted(set(details) - _STAGE_FIELDS)
        if unknown:
            raise ValueError(f"unknown stage field(s) {unknown}; valid: {sorted(_STAGE_FIELDS)}")
        entry = self.stage_entry(stage)
        if entry is None:
            raise ValueError(f"stage {stage} was never started in {self.path}")
        if entry.finished:
            raise RuntimeError(f"stage {stage} already ended as {entry.status!r}")
        entry.status, entry.steps, entry.r1_mean = status, steps, r1_mean
        for key, value in details.items():
            setattr(entry, key, value)
        entry.demoted = entry.action == "demote"
        self.controller = controller
        self.finished = run_finished
        self.save()
        return entry
