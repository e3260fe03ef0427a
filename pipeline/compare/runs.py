"""The runs of a comparison: one shared warm-up, then every method x seed as a curriculum
run (`pipeline.run`) in its own folder, recorded step by step.

    <output_dir>/runs/warmup/             the recipe's warm-up, run once (its final/ is every
                                          run's starting checkpoint)
    <output_dir>/runs/<method>-seed<s>/   a run's output folder (docs/run.md), plus
        record.json                       what the comparison reads back, written last: per
                                          step tokens, seconds and r1; the held-out
                                          evaluations; the first promotion

(beside `runs/`, pipeline.compare.cli writes comparison.json and comparison.png)

A run with a record.json is finished and read back; a folder without one is an
interrupted run, trained again from the start. The warm-up and every run are `run_argv`
(the user's run options plus what the comparison sets) through `pipeline.run`'s own
`run_curriculum`, in this process.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curriculum.atomic import atomic_write_json
from pipeline.layout import RunLayout
from pipeline.options import UsageError

RUNS_DIR = "runs"
RECORD_FILE = "record.json"
RECORD_SCHEMA = 1
"""Part of every record: a change to what a record holds makes the old ones unfinished."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a comparison: its method, seed (an index), learning rate and folder."""

    method: str
    seed: int
    learning_rate: float
    folder: Path

    @property
    def label(self) -> str:
        return f"{self.method} seed {self.seed}"


def plan_runs(config, base_seed: int, base_rate: float, root: Path) -> list[RunSpec]:
    """Every method x seed, seed by seed (so that an interrupted comparison has pairs)."""
    rates = config.rates()
    return [
        RunSpec(m, base_seed + i, rates.get(m, base_rate), root / RUNS_DIR / f"{m}-seed{i}")
        for i in range(config.seeds)
        for m in config.method_list()
    ]


def budget_settings(config, max_stage_steps: int) -> dict[str, Any]:
    """What every run's record must agree on besides its run options (read back or not)."""
    return {
        "schema": RECORD_SCHEMA,
        "budget": config.budget or None,
        "budget_unit": config.budget_unit,
        "budget_scope": config.budget_scope,
        "eval_every": config.eval_every,
        "max_stage_steps": max_stage_steps,
    }


def run_argv(user_argv: list[str], spec: RunSpec, config) -> list[str]:
    """The command line of one run: the user's run options, then what the comparison sets
    (later options override earlier ones and the recipe)."""
    argv = [*user_argv, "--method", spec.method, "--seed", str(spec.seed)]
    argv += ["--learning_rate", repr(spec.learning_rate), "--output_dir", str(spec.folder)]
    argv += ["--disable_tqdm", "true", "--save_strategy", "no"]
    if config.budget_scope == "first_stage":
        argv += ["--num_stages", "1"]
        if config.budget_unit == "steps" and config.budget:
            argv += ["--max_stage_steps", str(int(config.budget))]
    return argv


def warmup_folder(root: Path) -> Path:
    """The shared warm-up's run folder, beside the runs."""
    return root / RUNS_DIR / "warmup"


def warmup_argv(user_argv: list[str], folder: Path) -> list[str]:
    """The warm-up's command line: the recipe's run, stopped before its first stage."""
    return [*user_argv, "--output_dir", str(folder), "--disable_tqdm", "true"]


def read_record(folder: Path) -> dict | None:
    """A finished run's record, or None."""
    path = folder / RECORD_FILE
    return json.loads(path.read_text()) if path.exists() else None


# ---- Recording a run ------------------------------------------------------------------


@dataclass
class Recorder:
    """Everything a comparison records of one run, across its stages, and its budget."""

    budget: float | None
    unit: str
    scope: str
    eval_every: int
    evaluate: Any  # (model, tokenizer) -> {"success", "mean_reward"}
    progress: Any = None  # (text) -> None: the comparison's bar
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    promotion: dict | None = None
    tokens: int = 0
    seconds: float = 0.0
    exhausted: bool = False

    def spent(self) -> float:
        """The budget spent so far, in its unit."""
        return {"steps": len(self.steps), "tokens": self.tokens, "seconds": self.seconds}[self.unit]

    def callbacks(self, trainer, controller) -> list:
        """The stage's callback (`pipeline.run.cli.RunHooks.stage_callbacks`)."""
        return [_stage_recorder_class()(self, trainer, controller)]

    def point(self) -> dict[str, float]:
        return {"step": len(self.steps), "tokens": self.tokens, "seconds": self.seconds}

    def record_eval(self, model, tokenizer) -> None:
        """A held-out evaluation now (its time is not the run's)."""
        if self.evals and self.evals[-1]["step"] == len(self.steps):
            return
        training = model.training
        model.eval()
        self.evals.append(self.point() | self.evaluate(model, tokenizer))
        model.train(training)


@functools.cache
def _stage_recorder_class():
    """The stage callback's class (transformers is imported only once the backend is set)."""
    from transformers import TrainerCallback

    from pipeline.run.plots import first_attempt_reward

    class StageRecorder(TrainerCallback):
        """Per step: generated tokens, training seconds, r1; the first promotion; held-out
        evaluations every `eval_every` steps; stops the stage (and the run) when the
        budget is spent. Added after the curriculum's callback, so it reads its decision."""

        def __init__(self, recorder: Recorder, trainer, controller) -> None:
            self.recorder, self.trainer, self.controller = recorder, trainer, controller
            self.first_stage = controller.stage == 1

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
            self.tokens_before = self.recorder.tokens
            if not self.recorder.evals:  # the start, shared by every run of the comparison
                self.recorder.record_eval(model, processing_class)
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            rec = self.recorder
            now = time.perf_counter()
            rec.seconds += now - self.last
            rec.tokens = self.tokens_before + self.trainer.generated_tokens
            rec.steps.append(rec.point() | {"step": len(rec.steps) + 1, "r1": None})
            if rec.promotion is None and self.first_stage and self.controller.promotion_reached():
                rec.promotion = rec.point()
            if rec.budget is not None and rec.spent() >= rec.budget:
                rec.exhausted = control.should_training_stop = True
            elif rec.scope == "first_stage":
                # Train the first stage for the whole budget: a promotion is recorded above,
                # the stage ends at its step limit only.
                limit = self.controller.stage_steps >= self.controller.config.max_stage_steps
                control.should_training_stop = limit
            if len(rec.steps) % rec.eval_every == 0 or control.should_training_stop:
                rec.record_eval(model, processing_class)
            if rec.progress:
                rec.progress(f"step {len(rec.steps)}, {rec.tokens} tokens")
            self.last = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and self.recorder.steps:
                r1 = first_attempt_reward(logs)
                if r1 is not None:
                    self.recorder.steps[-1]["r1"] = r1

    return StageRecorder


def held_out_evaluator(task, level: int, n: int, max_new_tokens: int, weights):
    """Greedy first attempts on the same `n` held-out prompts of `level`, every time, scored
    as a stage's evaluation scores them (`weights`: pipeline.evaluate.run_folder.stage_eval_weights,
    beside an agent environment's `get_reward` at the weight training gives it)."""
    from curriculum.tasks.agent import environment_reward_weights
    from pipeline.evaluate.first_attempts import evaluate_first_attempts

    environment_weight = sum(environment_reward_weights(task).values())

    def evaluate(model, tokenizer) -> dict[str, float]:
        result = evaluate_first_attempts(
            model, tokenizer, task, level, n, max_new_tokens=max_new_tokens, weights=weights,
            environment_weight=environment_weight, progress=False,
        )  # fmt: skip
        return {"success": result.success_rate, "mean_reward": result.mean_reward}

    return evaluate


# ---- Running ----------------------------------------------------------------------------


def ensure_warmup(user_argv: list[str], folder: Path, options_for: tuple[str, ...]) -> Path:
    """The shared starting checkpoint: the recipe's warm-up, run once into `folder`
    (`options_for`: the compared methods, `RunHooks`)."""
    from pipeline.run.cli import RunHooks, run_curriculum

    start = RunLayout(folder).final
    if not start.exists():
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted warm-up starts again
        hooks = RunHooks(stop=lambda: True, options_for=options_for)
        run_curriculum(warmup_argv(user_argv, folder), hooks)
    return start


def train_run(
    spec: RunSpec,
    argv: list[str],
    start: Path,
    recorder: Recorder,
    settings: dict,
    options_for: tuple[str, ...],
) -> dict:
    """Train one run from `start` and write its record (atomically, last); a run that
    fails is recorded as failed, with its error, and the comparison goes on."""
    from pipeline.run.cli import RunHooks, run_curriculum

    shutil.rmtree(spec.folder, ignore_errors=True)  # an interrupted run starts again
    hooks = RunHooks(
        start_from=start,
        stage_callbacks=recorder.callbacks,
        stop=lambda: recorder.exhausted,
        options_for=options_for,
    )
    began = time.perf_counter()
    error = None
    try:
        run_curriculum(argv, hooks)
    except UsageError:
        raise
    except Exception as err:  # a failing run is reported; the others still run
        error = f"{type(err).__name__}: {err}".splitlines()[0]
        traceback.print_exc()
    record = {
        "method": spec.method,
        "seed": spec.seed,
        "learning_rate": spec.learning_rate,
        "settings": settings,
        "error": error,
        "wall_seconds": time.perf_counter() - began,
        "steps": recorder.steps,
        "evals": recorder.evals,
        "promotion": recorder.promotion,
    }
    if error is None:  # a failed run is tried again by the next call
        spec.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(spec.folder / RECORD_FILE, record)
    return record
