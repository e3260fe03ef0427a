"""`python -m pipeline.run` as on a machine with CUDA GPUs and Unsloth; used by
tests/test_multiprocess.py.

    accelerate launch --config_file configs/accelerate/ddp.yaml tests/multiprocess_gpu_run.py ARGS...

The backend module is told that CUDA is available, and Unsloth is installed, so `backend:
auto` resolves to Unsloth for a single process. Under several processes the run must take
transformers (Unsloth's GRPO trainer is single-GPU) and keep to it: the loader must not
resolve `auto` again. Everything else (torch, the model, DDP over gloo) stays on the CPU.
"""

from __future__ import annotations

import sys

import pipeline.models.backend as backend

backend.cuda_available = lambda: True

from pipeline.run.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
