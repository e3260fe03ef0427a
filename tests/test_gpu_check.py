"""scripts/gpu_check.sh, the first thing a user runs on a GPU machine, in its CPU mode: the
same Unsloth trainer path (Unsloth's generated GRPOTrainer, ERL with every row gated), on
the CPU. In `make test-all` only: it generates Unsloth's trainer in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_in_its_cpu_mode():
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu", sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    assert "backend: unsloth | device: cpu" in printed and "UnslothGRPOTrainer" in printed, printed
