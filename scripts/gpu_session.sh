#!/usr/bin/env bash
# The GPU checks in one command, for a CUDA machine that has torch and transformers but not
# the rest of the stack and no network (a lent machine, reached with a copy of this tree):
# the wheels in .whl/ (built beforehand on a machine with pip, for that machine's Python)
# are installed into /tmp/site, then the GPU check (Unsloth's trainer, two all-gated ERL
# steps) and ERL's overhead on Unsloth's trainer run, their logs under $OUT (default /tmp).
#   bash scripts/gpu_session.sh [python]
# Building .whl (docs/hardware.md, "A GPU machine without the stack"): trl, unsloth,
# unsloth_zoo, datasets, peft, bitsandbytes and the packages they need that the machine
# lacks, each `pip download --no-deps --only-binary=:all: --python-version <its Python>
# --platform manylinux_2_28_x86_64 ...`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
OUT="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
nvidia-smi -L
echo "== gpu_check"
timeout 150 bash scripts/gpu_check.sh "$PY" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?"
grep -v "max_new_tokens\|generation_config" "$OUT/gpu_check.log" | tail -n 25
echo "== erl_overhead --backend unsloth"
timeout 230 "$PY" bench/erl_overhead.py --backend unsloth > "$OUT/overhead_unsloth.log" 2>&1
echo "overhead rc=$?"
grep -E "^[a-z_]+(\[[^]]*\])?: " "$OUT/overhead_unsloth.log" | tail -n 40
grep -A12 "^Traceback" "$OUT/overhead_unsloth.log" | tail -n 30
