#!/usr/bin/env bash
# GPU check: the Unsloth backend and the ERL trainer on a CUDA GPU, in one short run.
# Builds the offline tiny model, loads it through Unsloth, runs two ERL steps with every
# row gated (reflection + retry + internalization), and prints the trainer's base class,
# the step times and peak GPU memory. Usage: bash scripts/gpu_check.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
"$PY" - <<'PYCODE'
import json, time
import torch
from pipeline.backend import activate_backend
print("backend:", activate_backend("unsloth"), "| cuda:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
from datasets import Dataset
from curriculum.tasks import get_task
from pipeline.model_loading import ModelConfig, load_policy
from pipeline.tiny_model import build_tiny_model
from pipeline import ERLConfig, ERLTrainer
from rewards import Scorer, build_feedback_func, build_reward_funcs

folder = build_tiny_model("/tmp/erl-gpu-check/tiny")
model, tokenizer = load_policy(ModelConfig(model_name_or_path=folder, backend="unsloth", lora_r=8))
task = get_task("arithmetic")
weights = {"correctness": 0.7, "milestones": 0.2, "format": 0.1}
scorer = Scorer(task)
reward_funcs, reward_weights = build_reward_funcs(task, weights, scorer=scorer)
args = ERLConfig(output_dir="/tmp/erl-gpu-check/out", max_steps=2, per_device_train_batch_size=16,
                 num_generations=4, max_completion_length=16, reward_threshold=2.0,
                 reward_weights=reward_weights, learning_rate=1e-4, logging_steps=1,
                 report_to=[], save_strategy="no", bf16=torch.cuda.is_bf16_supported(),
                 fp16=not torch.cuda.is_bf16_supported())
trainer = ERLTrainer(model=model, args=args, train_dataset=Dataset.from_list(task.generate(1, 64, seed=0)),
                     reward_funcs=reward_funcs, feedback_func=build_feedback_func(task, weights, scorer=scorer),
                     processing_class=tokenizer)
print("trainer base class:", [f"{c.__module__}.{c.__name__}" for c in type(trainer).__mro__[1:3]])
start = time.perf_counter()
trainer.train()
print(f"two ERL steps: {time.perf_counter() - start:.2f} s")
for h in trainer.state.log_history:
    if "step_time" in h:
        print(json.dumps({k: h[k] for k in ("step", "step_time", "loss", "erl/gated_fraction",
                                             "erl/r1_mean", "erl/r2_mean") if k in h}))
if torch.cuda.is_available():
    print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
PYCODE
