"""An SFT warm-up on reference solutions, so the policy knows the answer format before RL.

Unsloth's GRPO notebooks do the same: a model that never produces a parseable answer gets
no reward signal to learn from. Uses TRL's SFTTrainer with prompt-completion rows, so the
loss covers the completion only.
"""

from __future__ import annotations

import copy
from pathlib import Path

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from curriculum.tasks import Task
from curriculum.tasks.agent import environment_tools, is_agent_task
from pipeline.layout import TENSORBOARD_DIR
from pipeline.models.backend import unsloth_patches_trainers
from pipeline.models.quantization import undo_qlora_bf16_cast
from pipeline.run.config import verbose
from pipeline.run.console import RunProgress, show_progress, warmup_postfix


def reference_dataset(task: Task, level: int, n: int, seed: int, tokenizer=None) -> Dataset:
    """`n` prompt -> reference-solution rows at `level`. An agent task's references are
    whole episodes, rendered with its tools as GRPOTrainer renders them: token ids with a
    mask on the model's own turns (`tokenizer` needed), so the tools' replies are not
    trained on, as GRPO masks them too."""
    rows = task.generate(level, n, seed=seed)
    if is_agent_task(task):
        from pipeline.models.tool_warmup import grpo_chat_template, render_episode

        template = grpo_chat_template(tokenizer)
        rendered = []
        for row in rows:
            environment, prompt = task.start(row)
            ids, mask = render_episode(
                tokenizer, prompt + task.reference(row), environment_tools(environment), template
            )
            rendered.append({"input_ids": ids, "completion_mask": mask})
        return Dataset.from_list(rendered)
    return Dataset.from_list(
        [
            {
                "prompt": row["prompt"],
                "completion": [{"role": "assistant", "content": task.reference(row)}],
            }
            for row in rows
        ]
    )


def warmup_config(
    *, steps: int, batch_size: int, learning_rate: float, args, output_dir: str
) -> SFTConfig:
    """The warm-up's SFTConfig: cosine decay after a 5% linear warm-up, completion-only loss;
    `args` (the run's ERLConfig) lends the device, precision, reporting, seed and console."""
    return SFTConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, steps // 20),
        logging_steps=max(1, steps // 10),
        save_strategy="no",
        report_to=copy.copy(args.report_to),
        bf16=args.bf16,
        fp16=args.fp16,
        use_cpu=args.use_cpu,
        seed=args.seed,
        completion_only_loss=True,
        disable_tqdm=args.disable_tqdm,
    )


def sft_warmup(
    model,
    tokenizer,
    task: Task,
    level: int,
    *,
    steps: int,
    examples: int,
    batch_size: int,
    learning_rate: float,
    args,
    output_dir: str,
    tensorboard_dir: Path | None = None,
    dataset: Dataset | None = None,
) -> list[dict]:
    """Train `model` in place for `steps` SFT steps; returns the trainer's log history.

    `args` (the run's ERLConfig) lends the device and precision settings, `report_to`
    (TensorBoard events go to `tensorboard_dir`) and the console settings: a progress bar
    unless `disable_tqdm`, the logged dictionaries too at `log_level` info or debug.
    `dataset` (prompt-completion rows) replaces the `examples` reference solutions at `level`.
    """
    config = warmup_config(
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        args=args,
        output_dir=output_dir,
    )
    if dataset is None:
        dataset = reference_dataset(  # seeds below the held-out ones (10**6)
            task, level, examples, seed=900_000 + args.seed, tokenizer=tokenizer
        )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    if not unsloth_patches_trainers():  # TRL's SFTTrainer casts a 4-bit model's adapter to bf16
        undo_qlora_bf16_cast(trainer.model)
    progress = RunProgress(
        "warm-up",
        warmup_postfix,
        bar=not args.disable_tqdm,
        print_logs=verbose(args.log_level),
    )
    show_progress(trainer, progress, tensorboard_dir or Path(output_dir) / TENSORBOARD_DIR)
    trainer.train()
    return trainer.state.log_history
