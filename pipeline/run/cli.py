"""Run the curriculum: a policy trained with ERL (or GRPO, SDPO), stage by stage, on a task
with levels.

    python -m pipeline.run                                   # configs/tiny.yaml, offline CPU demo
    python -m pipeline.run --config configs/qwen2.5-1.5b.yaml
    python -m pipeline.run --config configs/tiny.yaml --method grpo --output_dir runs/grpo
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --promote_threshold 0.5
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --resume true
    python -m pipeline.run --log_level info                  # also print every step's metrics
    python -m pipeline.run --help                            # every option, with its help
    accelerate launch --config_file configs/accelerate/ddp.yaml -m pipeline.run \
        --config configs/qwen2.5-1.5b.yaml --backend transformers   # several GPUs (DDP)

main() reads top to bottom: choose the backend -> parse and check every option -> load the
model -> assemble the rewards -> write the state -> warm up -> run the stages -> save and
plot. Nothing is written before the model and the rewards have loaded, so a refused start
leaves the output folder as it was. The output folder it writes is described in
`pipeline.layout`; the error convention in `pipeline.options`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.options import Interrupted, UsageError, run_command

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.run`; returns the exit code (2: an option refused, in one line)."""
    from pipeline.lock import released_at_end

    with released_at_end():  # the output folder's lock (pipeline.lock)
        return run_command(run_curriculum, argv, _help, _help_all)


def _help() -> str:
    """The --help text: the stored one when it is current, else the parser's (slow)."""
    from pipeline.options import project_help, stored_help
    from pipeline.run import help_text as stored
    from pipeline.run.config import PROG, run_parser

    return stored_help(stored, PROG) or project_help(run_parser())


def _help_all() -> str:
    """Every option of the run, TRL's and transformers' included (builds the parser)."""
    from pipeline.run.config import run_parser

    return run_parser().format_help()


@dataclass
class RunHooks:
    """What a caller that runs curricula in this process (`pipeline.compare`) adds to a run:
    `start_from`, a saved policy (a `final/` folder) to start from instead of the recipe's
    warm-up, which is then saved as the run's `warmup/`; `stage_callbacks(trainer,
    controller)`, more TrainerCallbacks for each stage's trainer; `stop()`, true once the
    run should end after its running stage (a spent budget); `options_for`, the methods
    the command line's options are for, when they are not the run's own (the comparison's
    every method: `parse_run_config`)."""

    start_from: Path | None = None
    stage_callbacks: Callable[[Any, Any], list] | None = None
    stop: Callable[[], bool] = lambda: False
    options_for: tuple[str, ...] = ()


def run_curriculum(argv: list[str], hooks: RunHooks | None = None) -> int:
    """The run itself, top to bottom; a refused option raises UsageError before any write."""
    hooks = hooks or RunHooks()
    run, model_config, curriculum_config, args, config = _configure(argv, hooks)
    from pipeline.layout import RunLayout
    from pipeline.models.threads import use_cpu_threads
    from pipeline.run import distributed
    from pipeline.run.checks import check_run
    from pipeline.run.config import memory_policy

    main_process = distributed.is_main_process()  # the one that writes the run's files
    layout = RunLayout(args.output_dir)
    # The task, levels, signals, model paths, machine and folder (a refusal writes nothing).
    task, controller = check_run(run, model_config, curriculum_config, args, layout, config)
    # Read before run_config.json is written (below): a resume keeps its run's memory policy.
    config["memory_policy"] = memory_policy(layout.run_config)
    distributed.wait_for_everyone()  # every process checks the folder before anything is written
    if threads := use_cpu_threads(run.threads):  # before the model: loading runs on them too
        logger.info(threads)
    model, tokenizer, rewards, generations_log = _load(
        run, model_config, args, task, controller, layout, main_process
    )
    try:
        _train(run, args, config, hooks, task, controller, layout, model, tokenizer, rewards,
               generations_log, main_process)  # fmt: skip
    except KeyboardInterrupt:
        if not layout.state.exists():
            raise  # nothing to resume: the same command starts again
        # The state is written: the run resumes from its last complete save.
        resume = f"python -m pipeline.run --output_dir {layout.root} --resume true"
        raise Interrupted(resume) from None
    return 0


def _configure(argv: list[str], hooks: RunHooks):
    """Every option parsed and checked before anything is written, and the run's logging:
    (run, model, curriculum and trainer configs, the resolved config to record). The
    backend is resolved first: it decides how trl is imported."""
    from pipeline.run import distributed
    from pipeline.run.config import (
        check_policy_path_early,
        choose_backend,
        parse_run_config,
        peek_log_level,
        resolved_config,
        verbose,
    )

    quiet = not verbose(peek_log_level(argv))
    check_policy_path_early(argv)  # a typo in a local path is named in a second
    backend = choose_backend(argv)
    run, model_config, curriculum_config, args = parse_run_config(argv, hooks.options_for)
    model_config.backend = backend  # resolved once: the loader and run_config.json read this
    config = resolved_config(run, model_config, curriculum_config, args)
    level = logging.INFO if distributed.is_main_process() else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s")
    # Unsloth gives the root logger its own handler at import, which makes basicConfig a
    # no-op and left the root at WARNING: the run's own lines would not print.
    logging.getLogger("pipeline").setLevel(level)
    if distributed.launched_processes() > 1:
        logger.info(distributed.describe())
    if quiet:
        from pipeline.run.console import quiet_libraries  # after the backend: imports transformers

        quiet_libraries()
    return run, model_config, curriculum_config, args, config


def _load(run, model_config, args, task, controller, layout, main_process):
    """The policy, loaded once (it stays loaded across stages), then the rewards, whose
    learned signals score on the policy's device; both before the first write:
    (model, tokenizer, rewards, the generations log of the main process)."""
    from curriculum.tasks.agent import is_agent_task
    from pipeline.models.loading import load_policy
    from pipeline.models.tiny import build_tiny_model
    from pipeline.run import distributed
    from pipeline.run.checks import check_agent_budget
    from pipeline.run.rewards import build_run_rewards
    from rewards import GenerationsLog

    if run.build_tiny_model and main_process:
        if not Path(model_config.model_name_or_path).exists():  # said, as a hub id reads alike
            logger.info(f"building the offline tiny model into {model_config.model_name_or_path}")
        build_tiny_model(model_config.model_name_or_path, tool_calling=is_agent_task(task))
    distributed.wait_for_everyone()  # the others load what the main process built
    with _loading("--model_name_or_path", model_config.model_name_or_path):
        model, tokenizer = load_policy(
            model_config,
            seed=args.seed,
            trust_remote_code=args.trust_remote_code,
            gradient_checkpointing=args.gradient_checkpointing,
        )
    check_agent_budget(task, tokenizer, args.max_completion_length, controller.level)
    generations_log = (
        GenerationsLog(layout.root, every=run.log_generations_every) if main_process else None
    )
    learned = ", ".join([*run.reward_models, *run.preference_functions])
    with _loading("--reward_models / --preference_functions", learned):
        rewards = build_run_rewards(
            task, run, device=next(model.parameters()).device, generations_log=generations_log
        )
    return model, tokenizer, rewards, generations_log


def _train(run, args, config, hooks, task, controller, layout, model, tokenizer, rewards,
           generations_log, main_process) -> None:  # fmt: skip
    """The run's files from the state on: warm-up, the stages, the final model and plots."""
    from pipeline.run.stages import run_stage

    state, memory, restored = _open_run(run, args, config, controller, layout, model,
                                        main_process)  # fmt: skip
    if restored is None:
        _warm_up(run, args, hooks, task, controller, layout, model, tokenizer, memory,
                 main_process)  # fmt: skip
    # ---- The stages: train until promoted or out of steps, evaluate, save, plot.
    while not controller.finished and not hooks.stop():
        run_stage(
            model=model,
            tokenizer=tokenizer,
            memory=memory,
            task=task,
            controller=controller,
            state=state,
            run=run,
            args=args,
            rewards=rewards,
            generations_log=generations_log,
            layout=layout,
            extra_callbacks=hooks.stage_callbacks,
        )
    _finish(run, layout, model, tokenizer, memory, state, main_process)


def _open_run(run, args, config, controller, layout, model, main_process):
    """The run's files, the state first so that a run killed after this resumes; an earlier
    run in the folder restored: (state, memory, the folder restored or None)."""
    from pipeline.erl.memory import ReflectionMemory
    from pipeline.run import distributed
    from pipeline.run.checkpoints import remove_finished_checkpoints
    from pipeline.run.config import record_config

    if main_process:
        layout.root.mkdir(parents=True, exist_ok=True)
    state = distributed.load_curriculum_state(layout.state)
    state.save()
    if main_process and not (run.resume and layout.run_config.exists()):
        record_config(layout.root, config)  # a resume continues with it (checked above)
    if main_process:
        remove_finished_checkpoints(layout, state)  # left by a kill after a stage ended
    if state.controller:
        controller.load_state_dict(state.controller)
    memory = ReflectionMemory.from_config(args, **config["memory_policy"])
    restored = _restore_latest(model, memory, layout, state)
    if restored:
        logger.info(f"resuming {layout.root} from {_resume_point(layout, controller, restored)}")
    return state, memory, restored


def _warm_up(run, args, hooks, task, controller, layout, model, tokenizer, memory,
             main_process) -> None:  # fmt: skip
    """Teach the answer format on reference solutions (once per run), or start from a
    policy the caller gives (a warm-up several runs share)."""
    from pipeline.run.checkpoints import load_policy_weights, save_policy
    from pipeline.run.warmup import sft_warmup

    if hooks.start_from is not None:
        load_policy_weights(model, hooks.start_from)
    elif run.warmup_sft_steps:
        logger.info(
            f"SFT warm-up: {run.warmup_sft_steps} steps on {task.name} level {controller.level} references"
        )
        sft_warmup(
            model,
            tokenizer,
            task,
            controller.level,
            steps=run.warmup_sft_steps,
            examples=run.warmup_sft_examples,
            batch_size=run.warmup_sft_batch_size,
            learning_rate=run.warmup_sft_learning_rate,
            args=args,
            output_dir=str(layout.warmup_trainer),
            tensorboard_dir=layout.tensorboard("warmup"),
        )
    else:
        return
    if main_process:
        save_policy(model, tokenizer, memory, layout.warmup, atomic=True)
        _remove_if_empty(layout.warmup_trainer)  # the warm-up trainer's scratch folder


def _finish(run, layout, model, tokenizer, memory, state, main_process) -> None:
    """The final model, optional merged / GGUF exports, and the run's plot."""
    from pipeline.run import distributed
    from pipeline.run.checkpoints import save_policy
    from pipeline.run.plots import plot_run

    if main_process:
        save_policy(model, tokenizer, memory, layout.final, atomic=True)
        _export(model, tokenizer, run, layout)
        plot_run(layout.root, stages=[], baseline=run.baseline_run)
    distributed.wait_for_everyone()
    promoted = sum(1 for s in state.stages if s.status == "promoted")
    logger.info(
        f"done: {len(state.stages)} stages, {promoted} promoted; final model in {layout.final}"
    )


@contextmanager
def _loading(option: str, source: str):
    """A model that exists but will not load (no weights, a bad config) as a UsageError: it
    is still a start that wrote nothing."""
    try:
        yield
    except (OSError, ValueError, ImportError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{option}: cannot load it", source, reason) from err


def _restore_latest(model, memory, layout, state):
    """Load the newest saved policy of an earlier run in the output folder: the last
    finished stage, else the warm-up (written atomically, so it exists only once complete).
    A running stage's own checkpoint is resumed by its trainer. Returns the folder or None."""
    from pipeline.run.checkpoints import load_policy_weights

    finished = [s for s in state.stages if s.finished and s.checkpoint]
    candidates = [layout.root / finished[-1].checkpoint] if finished else []
    candidates.append(layout.warmup)
    for folder in candidates:
        if folder.exists():
            load_policy_weights(model, folder)
            memory.load(folder)
            return folder
    return None


def _resume_point(layout, controller, restored: Path) -> Path:
    """Where a resumed run continues: the running stage's latest complete trainer checkpoint
    (its trainer loads it), else the saved policy `restored` (a finished stage, the warm-up)."""
    from pipeline.layout import newest_complete_checkpoint

    if controller.finished:
        return restored
    # The stage's trainer names the cut checkpoints it passes over; this only reads.
    checkpoint, _ = newest_complete_checkpoint(layout.stage_checkpoints(controller.stage))
    return checkpoint or restored


def _remove_if_empty(folder: Path) -> None:
    """Remove `folder` and its empty subfolders when no file is left in it."""
    import shutil

    if folder.is_dir() and not any(p.is_file() for p in folder.rglob("*")):
        shutil.rmtree(folder, ignore_errors=True)


def _export(model, tokenizer, run, layout) -> None:
    """Merged 16-bit and GGUF copies of the final policy, when asked for."""
    from curriculum.atomic import umask_modes
    from pipeline.models.backend import unsloth_patches_trainers

    if run.save_merged:
        target = layout.final_merged
        if unsloth_patches_trainers():  # Unsloth's merge also handles 4-bit bases
            model.save_pretrained_merged(str(target), tokenizer, save_method="merged_16bit")
        else:
            from pipeline.models.quantization import merge_adapter

            merge_adapter(model, layout.final).save_pretrained(target)  # a 4-bit base dequantized
            tokenizer.save_pretrained(target)
        umask_modes(target)  # safetensors writes its weights owner-only
        logger.info(f"merged model saved to {target}")
    if run.save_gguf:
        model.save_pretrained_gguf(
            str(layout.final_gguf), tokenizer, quantization_method=run.save_gguf
        )
        logger.info(f"GGUF ({run.save_gguf}) saved to {layout.final_gguf}")
