"""Run the curriculum: an ERL-trained policy, stage by stage, on a task with levels.

    python -m pipeline.run                                   # configs/tiny.yaml, offline CPU demo
    python -m pipeline.run --config configs/qwen2.5-1.5b.yaml
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --promote_threshold 0.5
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --resume true
    python -m pipeline.run --log_level info                  # also print every step's metrics
    python -m pipeline.run --help                            # every option, with its help
    accelerate launch --config_file configs/accelerate/ddp.yaml -m pipeline.run \
        --config configs/qwen2.5-1.5b.yaml --backend transformers   # several GPUs (DDP)

main() reads top to bottom: parse the config -> choose the backend -> load the model ->
build the task and rewards -> warm up -> run the stages -> save and plot.

The output folder (a contract other tools rely on):
    run_config.json            every option the run started with (a resume must match it)
    curriculum_state.json      stages with status, steps, r1_mean, eval_reward, checkpoint
    stage_<k>/                 model or adapter + tokenizer + erl_memory.json + metrics.jsonl
                               + reward_curve.png (loadable with from_pretrained / PeftModel)
    final/                     the final model or adapter + tokenizer
    generations.jsonl          sampled generations with rewards and feedback
    reward_curve.png           r1 and r2 over the run, stage boundaries, eval per stage
    tensorboard/               event files per stage, with report_to: tensorboard
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pipeline.backend import activate_backend, unsloth_patches_trainers
from pipeline.run_config import (
    parse_run_config,
    peek_backend,
    peek_log_level,
    record_or_check_config,
    resolved_config,
    verbose,
)

logger = logging.getLogger("pipeline.run")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet = not verbose(peek_log_level(argv))
    if quiet:  # torch (through torchao) and bitsandbytes warn about optional CPU kernels
        for name in ("torch.utils._pytree", "bitsandbytes"):
            logging.getLogger(name).setLevel(logging.ERROR)

    # ---- Config and backend: the backend decides how trl is imported, so it comes first.
    from pipeline import distributed

    processes = distributed.launched_processes()
    activate_backend(distributed.backend_for_processes(peek_backend(argv), processes))
    run, model_config, curriculum_config, args = parse_run_config(argv)
    config = resolved_config(run, model_config, curriculum_config, args)
    distributed.check_parallelism(args)
    main_process = distributed.is_main_process()  # the one that writes the run's files
    logging.basicConfig(
        level=logging.INFO if main_process else logging.WARNING, format="%(message)s"
    )
    if processes > 1:
        logger.info(distributed.describe())
    if run.save_gguf and not unsloth_patches_trainers():
        raise SystemExit("error: --save_gguf needs the unsloth backend on a CUDA GPU")
    if run.save_merged and not model_config.use_lora:
        raise SystemExit(
            "error: --save_merged needs use_lora: a fully fine-tuned final/ is already merged"
        )

    from curriculum.controller import CurriculumController
    from curriculum.state import STATE_FILENAME
    from curriculum.tasks import get_task
    from pipeline.checkpoints import check_output_dir, remove_finished_checkpoints, save_policy
    from pipeline.memory import ReflectionMemory
    from pipeline.model_loading import load_policy
    from pipeline.run_logging import quiet_libraries
    from pipeline.tiny_model import build_tiny_model
    from rewards import GenerationsLog, Scorer, build_feedback_func, build_reward_funcs

    if quiet:
        quiet_libraries()

    output_dir = Path(args.output_dir)
    check_output_dir(output_dir, run.resume)
    distributed.wait_for_everyone()  # every process checks the folder before anything is written
    if main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
    state = distributed.load_curriculum_state(output_dir / STATE_FILENAME)
    state.save()  # first thing: a run killed at any point after this can be resumed
    # A resume must train alike: every process checks, the main one records.
    record_or_check_config(output_dir, config, run.resume, write=main_process)
    if main_process:
        remove_finished_checkpoints(output_dir, state)  # left by a kill after a stage ended

    # ---- Task, controller and rewards.
    task = get_task(run.task, **run.task_config)
    controller = CurriculumController(curriculum_config, task.num_levels)
    if state.controller:
        controller.load_state_dict(state.controller)
    scorer = Scorer(task)
    generations_log = (
        GenerationsLog(output_dir, every=run.log_generations_every) if main_process else None
    )
    reward_funcs, args.reward_weights = build_reward_funcs(
        task,
        run.reward_signals,
        fallback=run.fallback_reward,
        length_budget=run.length_budget,
        scorer=scorer,
        generations_log=generations_log,
    )
    feedback_func = build_feedback_func(
        task, run.reward_signals, length_budget=run.length_budget, scorer=scorer
    )

    # ---- The model: loaded once, it stays loaded across stages.
    if run.build_tiny_model and main_process:
        build_tiny_model(model_config.model_name_or_path)
    distributed.wait_for_everyone()  # the others load what the main process built
    model, tokenizer = load_policy(
        model_config, seed=args.seed, trust_remote_code=args.trust_remote_code
    )
    if run.reward_models or run.preference_functions:  # learned signals, on the policy's device
        from pipeline.learned_rewards import add_learned_signals

        reward_funcs, args.reward_weights, feedback_func = add_learned_signals(
            run.reward_models,
            run.preference_functions,
            reward_funcs,
            args.reward_weights,
            feedback_func,
            device=next(model.parameters()).device,
            program_feedback=any(run.reward_signals.values()),
        )
    memory = ReflectionMemory(args.memory_size if args.enable_memory else 0)
    restored = _restore_latest(model, memory, output_dir, state)
    if restored:
        logger.info(f"resuming {output_dir} from {restored}")

    # ---- Warm-up: teach the answer format on reference solutions (once per run).
    warmup_dir = output_dir / "warmup"
    if run.warmup_sft_steps and restored is None:
        from pipeline.run_logging import TENSORBOARD_DIR
        from pipeline.warmup import sft_warmup

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
            output_dir=str(output_dir / ".warmup_trainer"),
            tensorboard_dir=output_dir / TENSORBOARD_DIR / "warmup",
        )
        if main_process:
            save_policy(model, tokenizer, memory, warmup_dir, atomic=True)

    # ---- The stages: train until promoted or out of steps, evaluate, save, plot.
    from pipeline.stages import run_stage

    while not controller.finished:
        run_stage(
            model=model,
            tokenizer=tokenizer,
            memory=memory,
            task=task,
            controller=controller,
            state=state,
            run=run,
            args=args,
            reward_funcs=reward_funcs,
            feedback_func=feedback_func,
            generations_log=generations_log,
            output_dir=output_dir,
        )

    # ---- The final model, and optional merged / GGUF exports.
    final_dir = output_dir / "final"
    if main_process:
        save_policy(model, tokenizer, memory, final_dir, atomic=True)
        _export(model, tokenizer, run, output_dir)
        from pipeline.plots import plot_run

        plot_run(output_dir, stages=[])
    distributed.wait_for_everyone()
    promoted = sum(1 for s in state.stages if s.status == "promoted")
    logger.info(
        f"done: {len(state.stages)} stages, {promoted} promoted; final model in {final_dir}"
    )
    return 0


def _restore_latest(model, memory, output_dir: Path, state) -> Path | None:
    """Load the newest saved policy of an earlier run in `output_dir`: the last finished
    stage, else the warm-up (written atomically, so it exists only once complete). A
    running stage's own checkpoint is resumed by its trainer."""
    from pipeline.checkpoints import load_policy_weights

    finished = [s for s in state.stages if s.finished and s.checkpoint]
    candidates = [output_dir / finished[-1].checkpoint] if finished else []
    candidates.append(output_dir / "warmup")
    for folder in candidates:
        if folder.exists():
            load_policy_weights(model, folder)
            memory.load(folder)
            return folder
    return None


def _export(model, tokenizer, run, output_dir: Path) -> None:
    """Merged 16-bit and GGUF copies of the final policy, when asked for."""
    from pipeline.backend import unsloth_patches_trainers

    if run.save_merged:
        target = output_dir / "final_merged"
        if unsloth_patches_trainers():  # Unsloth's merge also handles 4-bit bases
            model.save_pretrained_merged(str(target), tokenizer, save_method="merged_16bit")
        else:
            model.merge_and_unload().save_pretrained(target)
            tokenizer.save_pretrained(target)
        logger.info(f"merged model saved to {target}")
    if run.save_gguf:
        model.save_pretrained_gguf(
            str(output_dir / "final_gguf"), tokenizer, quantization_method=run.save_gguf
        )
        logger.info(f"GGUF ({run.save_gguf}) saved to {output_dir / 'final_gguf'}")


if __name__ == "__main__":
    sys.exit(main())
