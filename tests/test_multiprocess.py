"""Several processes (DDP over gloo on CPU): ERL gives what one process gives.

Each test launches real processes with `accelerate launch --multi_gpu --num_processes 2`
(on a CPU-only machine that is torchrun underneath, and `use_cpu=True` makes accelerate's
MULTI_CPU over gloo); `accelerate launch --cpu` would start ONE process, so every test
asserts the world size its processes saw.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 900  # seconds; two processes importing torch/trl on a loaded 2-core machine


def free_port() -> int:
    """A free TCP port for the processes' rendezvous (tests may run beside other launches)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(*command: str, log: Path, timeout: int = LAUNCH_TIMEOUT) -> subprocess.Popen:
    """Start `command` (a script and its arguments) in 2 processes with accelerate."""
    accelerate = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*accelerate, *command],
        cwd=REPO,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def run_two(*command: str, log: Path, timeout: int = LAUNCH_TIMEOUT) -> None:
    process = launch_two(*command, log=log)
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, log.read_text()[-4000:]


@pytest.mark.slow
def test_two_processes_train_erl_like_one_with_twice_the_batch(tiny_model_dir, tmp_path):
    """2 processes at per-device batch 6 == 1 process at batch 12: parameters, erl/ metrics
    and memory after 2 steps, with the gate closed, every row gated, and some rows gated.

    Design: 4 generations per prompt and 6 rows per process, so one prompt's group spans
    both processes (GRPO's sampler gives each a contiguous slice of the same global batch):
    its retries must be normalised together. Sampling would differ between the layouts
    (one random stream per process), so `tests/multiprocess_erl.py` samples every row
    alone with the real model and a seed made from the step, the row's prompt tokens and
    (first attempts) its global index: the same rows get the same completions in both
    layouts. The rest is what differs for real: gathers, per-process padding and filler
    rows, DDP's gradient averaging, the loss normaliser. Adam at lr 1e-2 moves parameters
    by ~1e-2 a step; normalising retries per process instead gave differences of 3e-2
    (measured), while float rounding gives ~5e-5.
    """
    from multiprocess_erl import GATES, train
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    run_two(
        "tests/multiprocess_erl.py", tiny_model_dir, str(out / "two"), "6", log=tmp_path / "log"
    )
    for gate in GATES:
        train(tiny_model_dir, out / "one", 12, gate)
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())

    for gate in GATES:
        one = torch.load(out / "one" / gate / "rank0.pt")
        ranks = [torch.load(out / "two" / gate / f"rank{i}.pt") for i in (0, 1)]
        assert one["world_size"] == 1
        assert [r["world_size"] for r in ranks] == [2, 2], "accelerate did not start 2 processes"
        two = ranks[0]
        for name, value in one["params"].items():
            assert torch.equal(two["params"][name], ranks[1]["params"][name]), name  # DDP in sync
            moved = (value - initial[name]).abs().max().item()
            assert moved > 1e-3, f"{gate}: {name} did not train"
            torch.testing.assert_close(two["params"][name], value, rtol=0, atol=1e-3, msg=name)
        # Memory: the same on every rank, and what one process stored, in the same order.
        assert ranks[0]["memory"] == ranks[1]["memory"] == one["memory"], gate
        # Metrics: global, so both layouts log the same values.
        assert len(one["metrics"]) == len(two["metrics"]) == 2
        for a, b in zip(one["metrics"], two["metrics"]):
            assert a.keys() == b.keys(), gate
            for key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (gate, key)
        gated = [m["erl/gated_fraction"] for m in one["metrics"]]
        if gate == "closed":
            assert gated == [0.0, 0.0] and not one["memory"]
        elif gate == "all":
            assert gated == [1.0, 1.0]
            assert all(m["erl/internalization_rows"] > 0 for m in one["metrics"])
            assert all("erl/internalization_loss" in m for m in one["metrics"])
        else:
            assert all(0 < g < 1 for g in gated)
