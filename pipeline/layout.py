"""The output folder of a curriculum run: every name in it, in one place.

`python -m pipeline.run` writes it; the plots, the resume, `python -m pipeline.evaluate`
and `python -m pipeline.reward_model --from_run` read it. Other tools rely on it, so
every reader and writer takes its paths from `RunLayout`:

    <output_dir>/.run.lock                the running process's lock and PID (one writer at a time)
    <output_dir>/run_config.json          every option the run started with (a resume keeps them)
    <output_dir>/curriculum_state.json    stages: status, steps, r1_mean, eval_reward, checkpoint
    <output_dir>/stage_<k>/               model or adapter + tokenizer + erl_memory.json
        metrics.jsonl                     one JSON object per logged step
        reward_curve.png                  the stage's r1 and r2
        checkpoints/checkpoint-<n>/       trainer checkpoints while the stage runs
            erl_state.json                ERL's counts and budget so far, for a resume
            curriculum_controller.json    written last: marks the checkpoint complete
    <output_dir>/warmup/                  the policy after the SFT warm-up
    <output_dir>/final/                   the final model or adapter + tokenizer
    <output_dir>/final_merged/            with --save_merged
    <output_dir>/final_gguf/              with --save_gguf
    <output_dir>/generations.jsonl        sampled generations with rewards and feedback
    <output_dir>/experience.jsonl         every ERL reflection and retry (method erl)
    <output_dir>/reward_curve.png         r1 and r2 over the run, stages, eval rewards
    <output_dir>/tensorboard/<stage_k|warmup>/   with report_to: tensorboard

`erl_memory.json` is the reflection memory's own file (`pipeline.erl.memory`), which
ERLTrainer also writes into every trainer checkpoint beside `erl_state.json` (its step's
counts and budget, `pipeline.erl.trainer`), and so is `base_quantization.json`
beside an adapter trained on a 4-bit base (`pipeline.models.quantization`);
`generations.jsonl` is `rewards.GenerationsLog`'s, `experience.jsonl`
`pipeline.erl.experience.ExperienceLog`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewards.generations_log import GENERATIONS_FILE

LOCK_FILE = ".run.lock"  # pipeline.lock: held while a process writes the folder
RUN_CONFIG_FILE = "run_config.json"
EXPERIENCE_FILE = "experience.jsonl"  # pipeline.erl.experience
STATE_FILE = "curriculum_state.json"
STAGE_PREFIX = "stage_"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "reward_curve.png"
CHECKPOINTS_DIR = "checkpoints"
CONTROLLER_FILE = "curriculum_controller.json"
WARMUP_DIR = "warmup"
WARMUP_TRAINER_DIR = ".warmup_trainer"  # the warm-up trainer's scratch output_dir
FINAL_DIR = "final"
FINAL_MERGED_DIR = "final_merged"
FINAL_GGUF_DIR = "final_gguf"
TENSORBOARD_DIR = "tensorboard"

_STAGE_DIR = re.compile(re.escape(STAGE_PREFIX) + r"(\d+)")


def read_run_config(path: Path) -> dict[str, Any]:
    """The options recorded in a run_config.json; one that holds no JSON object of options
    raises ValueError naming the file. Every command reads the record through this."""
    recorded = json.loads(Path(path).read_text())
    if not isinstance(recorded, dict):
        raise ValueError(f"{path}: not a JSON object of options")
    return recorded


def stage_name(stage: int) -> str:
    """The folder name of stage `stage` (also what the state file's `checkpoint` holds)."""
    return f"{STAGE_PREFIX}{stage}"


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run's output folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def run_config(self) -> Path:
        return self.root / RUN_CONFIG_FILE

    def recorded_config(self) -> dict[str, Any] | None:
        """run_config.json: every option the run started with (None: the folder has none)."""
        return read_run_config(self.run_config) if self.run_config.exists() else None

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE

    @property
    def generations(self) -> Path:
        return self.root / GENERATIONS_FILE

    @property
    def experience(self) -> Path:
        return self.root / EXPERIENCE_FILE

    @property
    def plot(self) -> Path:
        return self.root / PLOT_FILE

    @property
    def warmup(self) -> Path:
        return self.root / WARMUP_DIR

    @property
    def warmup_trainer(self) -> Path:
        return self.root / WARMUP_TRAINER_DIR

    @property
    def final(self) -> Path:
        return self.root / FINAL_DIR

    @property
    def final_merged(self) -> Path:
        return self.root / FINAL_MERGED_DIR

    @property
    def final_gguf(self) -> Path:
        return self.root / FINAL_GGUF_DIR

    def stage(self, stage: int) -> Path:
        """stage_<k>/: the stage's model, metrics and plot."""
        return self.root / stage_name(stage)

    def stage_metrics(self, stage: int) -> Path:
        return self.stage(stage) / METRICS_FILE

    def stage_plot(self, stage: int) -> Path:
        return self.stage(stage) / PLOT_FILE

    def stage_checkpoints(self, stage: int) -> Path:
        """Where the trainer checkpoints of a running stage go."""
        return self.stage(stage) / CHECKPOINTS_DIR

    def tensorboard(self, name: str) -> Path:
        """tensorboard/<name>/: one folder per stage (`stage_<k>`) and the warm-up."""
        return self.root / TENSORBOARD_DIR / name

    def stages(self) -> dict[int, Path]:
        """Stage number -> its existing stage_<k> folder."""
        found = {}
        for path in self.root.glob(f"{STAGE_PREFIX}*"):
            match = _STAGE_DIR.fullmatch(path.name)
            if match and path.is_dir():
                found[int(match.group(1))] = path
        return found


# Trainer checkpoints: complete or not used ------------------------------------------------

CHECKPOINT_PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR, without importing it
TRAINER_STATE_FILE = "trainer_state.json"  # the Trainer writes it after the weights


def checkpoint_is_complete(checkpoint: Path) -> bool:
    """The one rule for every command that loads a trainer checkpoint (resume, evaluate,
    compare): in a run's stage (`stage_<k>/checkpoints/`) its controller state is written,
    which the run does after the trainer has finished the checkpoint; elsewhere (a plain
    trainer's folder) the trainer's own state is written, which comes after the weights."""
    in_a_run = (
        checkpoint.parent.name == CHECKPOINTS_DIR
        and (checkpoint.parent.parent.parent / STATE_FILE).exists()
    )
    marker = CONTROLLER_FILE if in_a_run else TRAINER_STATE_FILE
    return (checkpoint / marker).exists()


def newest_complete_checkpoint(*folders: Path) -> tuple[Path | None, list[Path]]:
    """The newest complete `checkpoint-N` in `folders`, and the incomplete ones newer than
    it, newest first (a save cut by a kill or a full disk): what to name as passed over."""
    found = [
        p
        for folder in folders
        for p in folder.glob(f"{CHECKPOINT_PREFIX}*")
        if p.is_dir() and p.name.removeprefix(CHECKPOINT_PREFIX).isdigit()
    ]
    passed_over = []
    for checkpoint in sorted(found, key=lambda p: -int(p.name.removeprefix(CHECKPOINT_PREFIX))):
        if checkpoint_is_complete(checkpoint):
            return checkpoint, passed_over
        passed_over.append(checkpoint)
    return None, passed_over
