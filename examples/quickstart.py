"""The ERL Quick Start on the offline tiny model: swap GRPOTrainer for ERLTrainer, add a
feedback_func. Runs on a CPU in about a minute; on a GPU put a hub id in `model=`.

    python examples/quickstart.py
"""

from datasets import Dataset

from curriculum.tasks import get_task
from pipeline import ERLConfig, ERLTrainer, build_tiny_model

task = get_task("arithmetic")
dataset = Dataset.from_list(task.generate(level=1, n=64, seed=0))


# Standard reward function (same as TRL): 1.0 for an exact "<answer>N</answer>".
def reward_func(completions, answer, **kwargs):
    return [
        float(c[0]["content"].strip() == f"<answer>{a}</answer>")
        for c, a in zip(completions, answer)
    ]


# ERL's addition: textual feedback, one string per completion.
def feedback_func(completions, answer, **kwargs):
    return [
        "Correct."
        if c[0]["content"].strip() == f"<answer>{a}</answer>"
        else "Reply with exactly <answer>N</answer>, where N is the sum."
        for c, a in zip(completions, answer)
    ]


config = ERLConfig(
    output_dir="outputs/quickstart",
    max_steps=10,
    learning_rate=1e-3,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=12,
    reward_threshold=1.0,
    memory_size=50,
    memory_top_k=3,
    internalization_coef=1.0,
    bf16=False,
    logging_steps=1,
    report_to=[],
)

trainer = ERLTrainer(
    model=build_tiny_model(".cache/tiny-model"),  # or "Qwen/Qwen2.5-1.5B-Instruct"
    args=config,
    train_dataset=dataset,
    reward_funcs=reward_func,
    feedback_func=feedback_func,
)
trainer.train()
print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith("erl/")})
