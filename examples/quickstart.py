"""The ERL Quick Start on the offline tiny model: swap GRPOTrainer for ERLTrainer, add a
feedback_func. Runs on a CPU in about a minute; on a GPU put a hub id in `model=`.

    python examples/quickstart.py            # or: make quickstart
    python examples/quickstart.py --max_steps 40 --output_dir outputs/qs

The tiny model starts from random weights and would never write a parseable answer, so a
short SFT warm-up on the answer format comes first (a real instruct model needs none).
It is kept short on purpose: afterwards some replies are well-formed and few are right.
The reward gives partial credit, 0.5 for `<answer>N</answer>` with the wrong N and 1.0
for the right one, so the first attempts of a prompt differ (non-zero advantages), wrong
ones reflect and retry, and a reflection whose retry succeeds is stored in the memory.
The table at the end shows, step by step, the first-attempt reward r1 (it rises as ERL
teaches the format; 30 steps teach the tiny model hardly any sums), what the retries
scored (r2), the share of prompts whose first attempts differ, and the memory. The tiny
model's reflections are not sentences, only what it writes; a chat model writes lessons.
"""

import argparse

parser = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
)
parser.add_argument("--output_dir", default="outputs/quickstart", help="Trainer output folder.")
parser.add_argument("--max_steps", type=int, default=30, help="ERL steps (default 30).")
parser.add_argument(
    "--warmup_steps", type=int, default=100, help="SFT steps on the answer format first (100)."
)
parser.add_argument("--seed", type=int, default=0, help="Seed of the model, data and sampling.")
options = parser.parse_args()  # before the imports below: --help answers at once

import re  # noqa: E402

import datasets  # noqa: E402
from datasets import Dataset  # noqa: E402

from curriculum.tasks import get_task  # noqa: E402
from pipeline import ERLConfig, ERLTrainer, build_tiny_model  # noqa: E402

datasets.disable_progress_bars()  # SFTTrainer's passes over the warm-up data
task = get_task("arithmetic")
dataset = Dataset.from_list(task.generate(level=1, n=256, seed=options.seed))
ANSWER = re.compile(r"<answer>(-?\d+)</answer>")


# Standard reward function (same as TRL): 1.0 for the exact "<answer>N</answer>" (`answer`
# is the dataset's column, a string), 0.5 for that format with another number, else 0.
def reward_func(completions, answer, **kwargs):
    rewards = []
    for completion, expected in zip(completions, answer):
        match = ANSWER.fullmatch(completion[0]["content"].strip())
        rewards.append(0.0 if match is None else 1.0 if match[1] == expected else 0.5)
    return rewards


# ERL's addition: textual feedback, one string per completion (what went wrong, not the answer).
def feedback_func(completions, answer, **kwargs):
    feedback = []
    for completion, expected in zip(completions, answer):
        match = ANSWER.fullmatch(completion[0]["content"].strip())
        if match is None:
            feedback.append("Reply with exactly <answer>N</answer>, where N is the sum.")
        elif match[1] == expected:
            feedback.append("Correct.")
        else:
            side = "low" if int(match[1]) < int(expected) else "high"
            feedback.append(f"The format is right, but {match[1]} is too {side}.")
    return feedback


# ---- The tiny model's warm-up: a few SFT steps on the answer format (TRL's SFTTrainer).
from transformers import PrinterCallback  # noqa: E402  (after pipeline: it chose the backend)
from transformers.utils.logging import disable_progress_bar  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

disable_progress_bar()  # loading and saving the tiny model

references = [
    {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": task.reference(row)}]}
    for row in task.generate(level=1, n=2000, seed=options.seed + 10_000)
]
warmup = SFTTrainer(
    model=build_tiny_model(".cache/tiny-model"),  # or "Qwen/Qwen2.5-1.5B-Instruct": skip this
    args=SFTConfig(
        output_dir=f"{options.output_dir}/warmup",
        max_steps=options.warmup_steps,
        per_device_train_batch_size=64,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        bf16=False,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        dataloader_pin_memory=False,  # nothing to pin on a CPU
        seed=options.seed,
    ),
    train_dataset=Dataset.from_list(references),
)
warmup.remove_callback(PrinterCallback)  # no summary dictionary
if options.warmup_steps:
    warmup.train()

# ---- ERL, exactly as in TRL but for the trainer's name and feedback_func.
config = ERLConfig(
    output_dir=options.output_dir,
    max_steps=options.max_steps,
    learning_rate=2e-3,
    per_device_train_batch_size=32,
    num_generations=4,
    max_completion_length=12,
    reward_threshold=1.0,
    memory_size=50,
    memory_top_k=3,
    internalization_coef=1.0,
    bf16=False,
    logging_steps=1,
    report_to=[],
    disable_tqdm=True,
    dataloader_pin_memory=False,
    seed=options.seed,
)
trainer = ERLTrainer(
    model=warmup.model,
    args=config,
    train_dataset=dataset,
    reward_funcs=reward_func,
    feedback_func=feedback_func,
    processing_class=warmup.processing_class,
)
trainer.remove_callback(PrinterCallback)  # the table below instead of 40-key dictionaries
trainer.train()

# ---- What was learned: one line per step, then the memory.
steps = [log for log in trainer.state.log_history if "erl/r1_mean" in log]
print(f"\n{'step':>4} {'r1':>6} {'r2':>6} {'gated':>6} {'adv≠0':>6} {'memory':>6}")
for log in steps:
    r2 = f"{log['erl/r2_mean']:6.3f}" if log.get("erl/gated_fraction", 0) > 0 else f"{'-':>6}"
    nonzero = 1 - log["frac_reward_zero_std"]  # groups whose first attempts differ
    print(
        f"{log['step']:>4} {log['erl/r1_mean']:6.3f} {r2} {log['erl/gated_fraction']:6.2f} "
        f"{nonzero:6.2f} {int(log['erl/memory_size']):>6}"
    )
third = max(1, len(steps) // 3)
r1_first, r1_last = (
    sum(log["erl/r1_mean"] for log in part) / third for part in (steps[:third], steps[-third:])
)
print(
    f"r1, mean of the first {third} steps -> of the last {third}: {r1_first:.3f} -> {r1_last:.3f}"
)
print(f"reflections stored: {len(trainer.memory)}")
for entry in list(trainer.memory)[-2:]:
    print(f"  step {entry.step}: {entry.reflection!r}")
