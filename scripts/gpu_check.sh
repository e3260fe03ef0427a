#!/usr/bin/env bash
# GPU check: the Unsloth backend and the ERL trainer on a CUDA GPU, in one short run.
# Builds the offline tiny model, loads it through Unsloth, runs two ERL steps with every
# row gated (reflection + retry + internalization) on Unsloth's GRPOTrainer, and prints
# the trainer's base class, the step times and peak GPU memory.
#   bash scripts/gpu_check.sh [python]         on a CUDA GPU
#   bash scripts/gpu_check.sh --cpu [python]   the same Unsloth trainer path on a CPU
#                                              (ERL_UNSLOTH_CPU_TRAINER=1); only the device differs
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=gpu
if [ "${1:-}" = "--cpu" ]; then
  MODE=cpu
  shift
  export ERL_UNSLOTH_CPU_TRAINER=1
fi
PY="${1:-.venv/bin/python}"
ERL_CHECK_MODE="$MODE" "$PY" - <<'PYCODE'
import json, os, time
import torch
from pipeline.models.backend import activate_backend
cpu = os.environ["ERL_CHECK_MODE"] == "cpu"
if not cpu and not torch.cuda.is_available():
    raise SystemExit("no CUDA GPU here: bash scripts/gpu_check.sh --cpu runs the CPU mode")
print("backend:", activate_backend("unsloth"), "| device:", "cpu" if cpu else torch.cuda.get_device_name(0))
from datasets import Dataset
from curriculum.tasks import get_task
from pipeline.models.loading import ModelConfig, load_policy
from pipeline.models.tiny import build_tiny_model
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
                 report_to=[], save_strategy="no", use_cpu=cpu,
                 bf16=not cpu and torch.cuda.is_bf16_supported(),
                 fp16=not cpu and not torch.cuda.is_bf16_supported())
trainer = ERLTrainer(model=model, args=args, train_dataset=Dataset.from_list(task.generate(1, 64, seed=0)),
                     reward_funcs=reward_funcs, feedback_func=build_feedback_func(task, weights, scorer=scorer),
                     processing_class=tokenizer)
print("trainer base class:", [f"{c.__module__}.{c.__name__}" for c in type(trainer).__mro__[1:3]])
assert type(trainer).__mro__[1].__name__ == "UnslothGRPOTrainer", "not Unsloth's trainer"
start = time.perf_counter()
trainer.train()
print(f"two ERL steps: {time.perf_counter() - start:.2f} s")
for h in trainer.state.log_history:
    if "step_time" in h:
        print(json.dumps({k: h[k] for k in ("step", "step_time", "loss", "erl/gated_fraction",
                                             "erl/r1_mean", "erl/r2_mean") if k in h}))
assert trainer.state.global_step == 2 and all(
    h["erl/gated_fraction"] == 1.0 for h in trainer.state.log_history if "erl/gated_fraction" in h)
if not cpu:
    print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
PYCODE
