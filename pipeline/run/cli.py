"""Run the curriculum: an ERL-trained policy, stage by stage, on a task with levels.

    python -m pipeline.run                                   # configs/tiny.yaml, offline CPU demo
    python -m pipeline.run --config configs/qwen2.5-1.5b.yaml
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --promote_threshold 0.5
    python -m pipeline.run --config configs/tiny.yaml --output_dir runs/x --resume true
    python -m pipeline.run --log_level info                  # also print every step's metrics
    python -m pipeline.run --help                            # every option, with its help
    accelerate launch --config_file configs/accelerate/ddp.yaml -m pipeline.run \
        --config configs/qwen2.5-1.5b.yaml --backend transformers   # several GPUs (DDP)

main() reads top to bottom: choose the backend -> parse the config -> build the task ->
load the model -> assemble the rewards -> warm up -> run the stages -> save and plot.
The output folder it writes is described in `pipeline.layout`.
"""

from __future__ import annotations

import logging
import sys

from pipeline.run.config import peek_log_level, verbose

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet = not verbose(peek_log_level(argv))
    if quiet:  # torch (through torchao) and bitsandbytes warn about optional CPU kernels
        for name in ("torch.utils._pytree", "bitsandbytes"):
            logging.getLogger(name).setLevel(logging.ERROR)

    # ---- Config. The backend is resolved first: it decides how trl is imported.
    from pipeline.run import distributed
    from pipeline.run.config import (
        choose_backend,
        parse_run_config,
        record_or_check_config,
        resolved_config,
    )

    backend = choose_backend(argv)
    run, model_config, curriculum_config, args = parse_run_config(argv)
    model_config.backend = backend  # resolved once: the loader and run_config.json read this
    config = resolved_config(run, model_config, curriculum_config, args)
    distributed.check_parallelism(args)
    main_process = distributed.is_main_process()  # the one that writes the run's files
    logging.basicConfig(
        level=logging.INFO if main_process else logging.WARNING, format="%(message)s"
    )
    if distributed.launched_processes() > 1:
        logger.info(distributed.describe())
    from pipeline.models.backend import unsloth_patches_trainers

    if run.save_gguf and not unsloth_patches_trainers():
        raise SystemExit("error: --save_gguf needs the unsloth backend on a CUDA GPU")
    if run.save_merged and not model_config.use_lora:
        raise SystemExit(
            "error: --save_merged needs use_lora: a fully fine-tuned final/ is already merged"
        )
    from pipeline.run.config import check_machine

    check_machine(model_config, args)  # before anything is written: a refusal leaves no run

    from curriculum.controller import CurriculumController
    from curriculum.tasks import get_task
    from pipeline.erl.memory import ReflectionMemory
    from pipeline.layout import RunLayout
    from pipeline.models.loading import load_policy
    from pipeline.models.tiny import build_tiny_model
    from pipeline.run.checkpoints import check_output_dir, remove_finished_checkpoints, save_policy
    from pipeline.run.console import quiet_libraries
    from pipeline.run.rewards import build_run_rewards
    from rewards import GenerationsLog

    if quiet:
        quiet_libraries()

    layout = RunLayout(args.output_dir)
    check_output_dir(layout, run.resume)
    distributed.wait_for_everyone()  # every process checks the folder before anything is written
    if main_process:
        layout.root.mkdir(parents=True, exist_ok=True)
    state = distributed.load_curriculum_state(layout.state)
    state.save()  # first thing: a run killed at any point after this can be resumed
    # A resume must train alike: every process checks, the main one records.
    record_or_check_config(layout.root, config, run.resume, write=main_process)
    if main_process:
        remove_finished_checkpoints(layout, state)  # left by a kill after a stage ended

    # ---- Task and controller (a bad task option fails before the model loads).
    task = get_task(run.task, **run.task_config)
    controller = CurriculumController(curriculum_config, task.num_levels)
    if state.controller:
        controller.load_state_dict(state.controller)

    # ---- The model: loaded once, it stays loaded across stages.
    if run.build_tiny_model and main_process:
        build_tiny_model(model_config.model_name_or_path)
    distributed.wait_for_everyone()  # the others load what the main process built
    model, tokenizer = load_policy(
        model_config,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
        gradient_checkpointing=args.gradient_checkpointing,
    )

    # ---- Rewards: programs and learned signals (those score on the policy's device).
    generations_log = (
        GenerationsLog(layout.root, every=run.log_generations_every) if main_process else None
    )
    rewards = build_run_rewards(
        task, run, device=next(model.parameters()).device, generations_log=generations_log
    )
    memory = ReflectionMemory(args.memory_size if args.enable_memory else 0)
    restored = _restore_latest(model, memory, layout, state)
    if restored:
        logger.info(f"resuming {layout.root} from {restored}")

    # ---- Warm-up: teach the answer format on reference solutions (once per run).
    if run.warmup_sft_steps and restored is None:
        from pipeline.run.warmup import sft_warmup

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
        if main_process:
            save_policy(model, tokenizer, memory, layout.warmup, atomic=True)

    # ---- The stages: train until promoted or out of steps, evaluate, save, plot.
    from pipeline.run.stages import run_stage

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
            rewards=rewards,
            generations_log=generations_log,
            layout=layout,
        )

    # ---- The final model, and optional merged / GGUF exports.
    if main_process:
        save_policy(model, tokenizer, memory, layout.final, atomic=True)
        _export(model, tokenizer, run, layout)
        from pipeline.run.plots import plot_run

        plot_run(layout.root, stages=[], baseline=run.baseline_run)
    distributed.wait_for_everyone()
    promoted = sum(1 for s in state.stages if s.status == "promoted")
    logger.info(
        f"done: {len(state.stages)} stages, {promoted} promoted; final model in {layout.final}"
    )
    return 0


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


def _export(model, tokenizer, run, layout) -> None:
    """Merged 16-bit and GGUF copies of the final policy, when asked for."""
    from pipeline.models.backend import unsloth_patches_trainers

    if run.save_merged:
        target = layout.final_merged
        if unsloth_patches_trainers():  # Unsloth's merge also handles 4-bit bases
            model.save_pretrained_merged(str(target), tokenizer, save_method="merged_16bit")
        else:
            from pipeline.models.quantization import merge_adapter

            merge_adapter(model, layout.final).save_pretrained(target)  # a 4-bit base dequantized
            tokenizer.save_pretrained(target)
        logger.info(f"merged model saved to {target}")
    if run.save_gguf:
        model.save_pretrained_gguf(
            str(layout.final_gguf), tokenizer, quantization_method=run.save_gguf
        )
        logger.info(f"GGUF ({run.save_gguf}) saved to {layout.final_gguf}")
