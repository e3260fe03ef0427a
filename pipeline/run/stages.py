"""One curriculum stage: build its prompts, train until promoted or out of steps, and
record what happened where a resume and the plots can find it."""

from __future__ import annotations

import copy
import json
import logging
import math
import shutil
from pathlib import Path

from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from curriculum.atomic import atomic_write_json, atomic_write_text, umask_modes
from curriculum.controller import CurriculumController
from curriculum.tasks import Task
from curriculum.tasks.agent import is_agent_task
from pipeline.evaluate.held_out import stage_rows, stage_seed, trained_prompts
from pipeline.layout import CONTROLLER_FILE, RunLayout
from pipeline.run.checkpoints import kill_point
from pipeline.run.distributed import all_processes, is_main_process, wait_for_everyone
from pipeline.run.plots import plot_run, read_metrics

logger = logging.getLogger(__name__)


def stage_dataset(task: Task, controller: CurriculumController, n: int, seed: int) -> Dataset:
    """`n` prompts for the running stage: its level, plus replayed easier levels. Seeds stay
    below 10**6, where the held-out evaluation prompts start; `trained_prompts` draws them
    again for the evaluation to hold out."""
    config = controller.config
    return Dataset.from_list(
        stage_rows(task, controller.level, n, seed, config.replay_fraction, config.start_level)
    )


def stage_args(args, output_dir: Path, max_steps: int, reward_weights: list[float]):
    """The run's ERLConfig for one stage: its own checkpoint folder, step budget and the
    run's reward weights."""
    stage = copy.deepcopy(args)
    stage.output_dir = str(output_dir)
    stage.max_steps = max_steps
    stage.reward_weights = list(reward_weights)
    return stage


class CurriculumCallback(TrainerCallback):
    """Feeds each step's first-attempt rewards to the controller, stops the stage when it
    says so, appends logs to the stage's metrics.jsonl (with the run-global step) and
    stores the controller state inside every trainer checkpoint."""

    def __init__(
        self, trainer, controller: CurriculumController, metrics_path: Path, step_offset: int
    ) -> None:
        self.trainer = trainer
        self.controller = controller
        self.stage = controller.stage
        self.metrics_path = metrics_path
        self.step_offset = step_offset
        # r2 of the steps logged before a resume count too (truncate_metrics ran first).
        self.r2_values: list[float] = [
            record["erl/r2_mean"]
            for record in read_metrics(self.metrics_path)
            if "erl/r2_mean" in record and record.get("erl/gated_fraction", 0) > 0
        ]

    def on_step_end(self, args, state, control, **kwargs):
        # Every process records every process's first attempts: they all decide alike.
        attempts = all_processes(self.trainer.pop_first_attempts())
        self.controller.record_step(
            state.global_step,
            [r for r, _ in attempts],
            levels=[row["level"] for _, row in attempts],
        )
        if self.controller.should_stop_stage():
            control.should_training_stop = True
            control.should_save = False  # the stage folder is saved next; no checkpoint needed
        if state.global_step == 1:
            kill_point("first_step", self.stage)

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_training_stop:
            control.should_save = False  # save_strategy="epoch" sets it again at the stop

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs or not state.is_world_process_zero:
            return
        if "erl/r2_mean" in logs and logs.get("erl/gated_fraction", 0) > 0:
            self.r2_values.append(logs["erl/r2_mean"])
        record = {
            "step": self.step_offset + state.global_step,
            "stage_step": state.global_step,
            "level": self.controller.level,
            **logs,
        }
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def on_save(self, args, state, control, **kwargs):
        # The controller file marks a checkpoint complete: every process (its RNG state) first.
        wait_for_everyone()
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if checkpoint.exists() and state.is_world_process_zero:
            umask_modes(checkpoint)  # the trainer's weights, which safetensors writes owner-only
            atomic_write_json(checkpoint / CONTROLLER_FILE, self.controller.state_dict())
            kill_point("checkpoint", self.stage)

    def r2_mean(self) -> float | None:
        values = [v for v in self.r2_values if math.isfinite(v)]
        return sum(values) / len(values) if values else None


def truncate_metrics(path: Path, last_stage_step: int) -> None:
    """Drop the lines of a stage's metrics.jsonl logged after the checkpoint a resume
    continues from (and a line torn by a kill)."""
    if not path.exists():
        return
    kept = [
        record for record in read_metrics(path) if record.get("stage_step", 0) <= last_stage_step
    ]
    atomic_write_text(path, "".join(json.dumps(record, default=str) + "\n" for record in kept))


def run_stage(
    *,
    model,
    tokenizer,
    memory,
    task,
    controller,
    state,
    run,
    args,
    rewards,
    generations_log,
    layout: RunLayout,
    extra_callbacks=None,
) -> None:
    """Train the controller's running stage to its end, evaluate, save, record and plot.
    `extra_callbacks(trainer, controller)`: more TrainerCallbacks for the stage's trainer.

    The order keeps a killed run resumable: the stage folder is complete (policy, metrics,
    plot) before the state file marks the stage finished, and untouched after; until then
    a resume continues the stage from its latest trainer checkpoint.
    """
    from pipeline.run.console import show_stage_progress

    stage, level = controller.stage, controller.level
    checkpoint, step_offset, experience_log = _open_stage(
        controller, state, layout, generations_log
    )
    trainer = _stage_trainer(
        model, tokenizer, memory, task, controller, run, args, rewards, layout, experience_log
    )
    callback = CurriculumCallback(trainer, controller, layout.stage_metrics(stage), step_offset)
    trainer.add_callback(callback)
    for extra in extra_callbacks(trainer, controller) if extra_callbacks else []:
        trainer.add_callback(extra)  # after the curriculum's: e.g. pipeline.compare's budget
    show_stage_progress(trainer, args, controller, layout, run.method)  # not per-step dicts
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    kill_point("trained", stage)
    steps = controller.stage_steps
    decision = controller.end_stage()
    evaluation = None
    if run.eval_prompts and is_main_process():  # evaluates once over all prompts
        evaluation = _evaluate_stage(model, tokenizer, task, level, state, run, args, rewards,
                                     controller)  # fmt: skip
    kill_point("evaluated", stage)
    eval_reward = evaluation.mean_reward if evaluation else None
    _save_stage(model, tokenizer, memory, layout, stage, eval_reward)
    state.finish_stage(
        stage,
        decision.status,
        steps=steps,
        r1_mean=decision.r1_mean,
        controller=controller.state_dict(),
        run_finished=decision.finished,
        eval_reward=eval_reward,
        checkpoint=layout.stage(stage).name,
        r2_mean=callback.r2_mean(),
        action=decision.action,
        next_level=decision.next_level,
    )
    kill_point("recorded", stage)
    if is_main_process():
        shutil.rmtree(layout.stage_checkpoints(stage), ignore_errors=True)  # never resumes
        plot_run(layout.root, stages=[], baseline=run.baseline_run)
    wait_for_everyone()
    logger.info(_summary(stage, level, run.method, steps, decision, callback.r2_mean(), evaluation))
    for line in rewards.scorer.repeated_warnings():  # each logged once when it first came
        logger.warning(f"[stage {stage}] repeated: {line}")


def _open_stage(controller, state, layout: RunLayout, generations_log):
    """The running stage's entry, folder and logs, continued from its latest trainer
    checkpoint if it was interrupted: (that checkpoint or None, the steps of the finished
    stages, ERL's experience log)."""
    from pipeline.erl.experience import ExperienceLog
    from pipeline.run.checkpoints import latest_trainer_checkpoint, read_controller_state

    stage = controller.stage
    state.start_stage(controller.level, controller.state_dict())  # the running entry, resuming
    layout.stage(stage).mkdir(parents=True, exist_ok=True)
    checkpoint = latest_trainer_checkpoint(layout.stage_checkpoints(stage))
    if checkpoint is not None:  # an interrupted stage: continue where its checkpoint left off
        controller.load_state_dict(read_controller_state(checkpoint))
    if is_main_process():
        truncate_metrics(layout.stage_metrics(stage), controller.stage_steps)
    step_offset = sum(s.steps for s in state.stages if s.finished)
    if generations_log is not None:  # the main process's
        generations_log.start_stage(stage, step_offset, controller.stage_steps)
    experience_log = ExperienceLog(layout.root)  # ERL's reflections and retries
    if is_main_process():  # which alone writes it
        experience_log.start_stage(stage, step_offset, controller.stage_steps)
    return checkpoint, step_offset, experience_log


def _stage_trainer(model, tokenizer, memory, task, controller, run, args, rewards,
                   layout: RunLayout, experience_log):  # fmt: skip
    """The running stage's trainer for the run's method, on the stage's prompts."""
    from pipeline.run.methods import build_trainer

    stage = controller.stage
    return build_trainer(
        run.method,
        model=model,
        args=stage_args(
            args,
            layout.stage_checkpoints(stage),
            controller.config.max_stage_steps,
            rewards.weights,
        ),  # fmt: skip
        train_dataset=stage_dataset(
            task, controller, run.prompts_per_stage, stage_seed(args.seed, stage)
        ),
        rewards=rewards,
        memory=memory,
        tokenizer=tokenizer,
        success_threshold=args.reward_threshold,
        environment_factory=task.make_environment if is_agent_task(task) else None,
        experience_log=experience_log,
    )


def _evaluate_stage(model, tokenizer, task, level, state, run, args, rewards, controller):
    """First attempts on the level's held-out prompts, every prompt of this level the run
    trained on so far kept out."""
    from pipeline.evaluate.first_attempts import evaluate_first_attempts
    from pipeline.run.config import verbose

    trained = trained_prompts(
        task,
        level,
        [(entry.stage, entry.level) for entry in state.stages],
        prompts_per_stage=run.prompts_per_stage,
        seed=args.seed,
        replay_fraction=controller.config.replay_fraction,
        start_level=controller.config.start_level,
    )
    return evaluate_first_attempts(
        model,
        tokenizer,
        task,
        level,
        run.eval_prompts,
        max_new_tokens=args.max_completion_length,
        max_turns=args.max_tool_calling_iterations,
        weights=rewards.eval_weights,
        environment_weight=rewards.environment_weight,
        trained=trained,
        progress=verbose(args.log_level) and not args.disable_tqdm,
    )


def _save_stage(model, tokenizer, memory, layout: RunLayout, stage: int, eval_reward) -> None:
    """The stage's policy and memory in its folder, and its plot (the main process)."""
    from pipeline.run.checkpoints import save_policy

    if is_main_process():
        save_policy(model, tokenizer, memory, layout.stage(stage))
        plot_run(layout.root, stages=[stage], eval_rewards={stage: eval_reward}, run_curve=False)
    kill_point("saved", stage)


def _summary(stage, level, method, steps, decision, r2, evaluation) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    outcome = "promoted" if decision.promoted else f"plateau ({decision.action})"
    score = fmt(evaluation.mean_reward if evaluation else None)
    if evaluation and evaluation.trained:  # the level has too few problems to hold them out
        score += f" ({evaluation.trained} of {evaluation.n} prompts trained on)"
    return (
        f"[stage {stage}] level {level} | {method} | {steps} steps | r1 {fmt(decision.r1_mean)} | "
        f"r2 {fmt(r2)} | eval {score} | {outcome}"
    )
