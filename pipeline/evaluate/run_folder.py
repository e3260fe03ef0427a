"""What `pipeline.evaluate` reads from a run's folder: the task, its options, the reward
weights and the prompts the run trained on, as the run recorded them.

    run = find_run("runs/x/stage_2")   # a run folder, a stage, final/, warmup/ or a checkpoint
    run.config["task"], run.stage_level(), run.trained(task, level)

Given a folder the project's run wrote, the evaluation needs no `--task`: it takes the
task (or the class the run recorded for it), `task_config`, `reward_signals` (the stage
line's weighted evaluation), `eval_prompts` and `max_completion_length` from
`run_config.json`, and the stages from `curriculum_state.json`, unless the command line
overrides them. A stage folder is evaluated on the prompts its stage line scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curriculum.state import CurriculumState
from curriculum.tasks import Task, list_tasks
from pipeline.evaluate.held_out import trained_prompts
from pipeline.layout import CHECKPOINTS_DIR, FINAL_DIR, STAGE_PREFIX, WARMUP_DIR, RunLayout


def recorded_task(config: dict[str, Any]) -> str:
    """What to load for the task of a run's recorded `config`: its `task` when this process
    knows that name (a family, or module:Class), else the class the run recorded (a task
    registered with `register_task` in the process that ran it)."""
    name = config["task"]
    if ":" in name or name in list_tasks():
        return name
    return config.get("task_class") or name


def stage_eval_weights(reward_signals: dict[str, float]) -> dict[str, float] | None:
    """The weights a stage's evaluation scores with: the run's program signals as r1 weighs
    them, or None (the task's own reward) when every program weight is 0 (the programs
    only watch and learned signals train)."""
    return dict(reward_signals) if any(reward_signals.values()) else None


@dataclass
class RecordedRun:
    """A run folder the project wrote, and which of its models was asked for."""

    layout: RunLayout
    config: dict[str, Any]
    """run_config.json: every option the run started with."""
    state: CurriculumState
    stage: int | None
    """The stage whose folder (or checkpoint) was given; 0 for warmup/ (before any stage),
    None for final/ or the run folder."""
    model: Path
    """The model folder to load (final/ or the last finished stage for a run folder)."""

    def stage_level(self) -> int | None:
        """The level of the given stage, else of the run's last stage (None: no stage yet)."""
        entries = [s for s in self.state.stages if self.stage is None or s.stage == self.stage]
        return entries[-1].level if entries else None

    def trained(self, task: Task, level: int) -> set[str]:
        """The prompts at `level` the run had trained on when the given model was saved."""
        stages = [
            (s.stage, s.level)
            for s in self.state.stages
            if self.stage is None or s.stage <= self.stage
        ]
        return trained_prompts(
            task,
            level,
            stages,
            prompts_per_stage=self.config["prompts_per_stage"],
            seed=self.config["seed"],
            replay_fraction=self.config["replay_fraction"],
            start_level=self.config["start_level"],
        )


def find_run(path: str) -> RecordedRun | None:
    """The run `path` belongs to (its folder, a stage folder, final/, warmup/ or a stage's
    trainer checkpoint), or None when it is not in a folder the project's run wrote."""
    given = Path(path)
    if not given.is_dir():
        return None
    stage = None
    if given.name == WARMUP_DIR:  # before any stage: nothing trained yet
        root, stage = given.parent, 0
    elif given.parent.name == CHECKPOINTS_DIR:  # stage_<k>/checkpoints/checkpoint-<n>
        root, stage = given.parents[2], _stage_number(given.parents[1])
    elif RunLayout(given).run_config.exists():
        root = given
    else:
        root, stage = given.parent, _stage_number(given)
    layout = RunLayout(root)
    if not (layout.run_config.exists() and layout.state.exists()):
        return None
    config = layout.recorded_config()
    state = CurriculumState.load(layout.state)
    if root == given:
        model, stage = _run_model(layout, state)
    else:
        model = given
    return RecordedRun(layout, config, state, stage, model)


def _stage_number(folder: Path) -> int | None:
    number = folder.name.removeprefix(STAGE_PREFIX)
    return int(number) if folder.name.startswith(STAGE_PREFIX) and number.isdigit() else None


def _run_model(layout: RunLayout, state: CurriculumState) -> tuple[Path, int | None]:
    """A run folder's model and the stage it is from: final/ (None: the last stage), else
    its last finished stage (a stage still running is not the model's, so its level is not
    the one to score at), else the folder itself (which `resolve_checkpoint` then refuses,
    naming what it looked for)."""
    if (layout.root / FINAL_DIR).exists():
        return layout.root / FINAL_DIR, None
    finished = [s for s in state.stages if s.finished and s.checkpoint]
    if finished:
        return layout.root / finished[-1].checkpoint, finished[-1].stage
    return layout.root, None
