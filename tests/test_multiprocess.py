"""Several processes (DDP over gloo on CPU): ERL and the curriculum run give what one
process gives.

The tests launch real processes with `accelerate launch --config_file
configs/accelerate/ddp.yaml` (the file users launch with: `distributed_type: MULTI_GPU`,
2 processes; on a CPU-only machine that is torchrun underneath, and `use_cpu=True` makes
accelerate's MULTI_CPU over gloo). `accelerate launch --cpu` would start ONE process, so
every test asserts the world size its processes saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
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


def launch_two(*command: str, log: Path) -> subprocess.Popen:
    """Start `command` (a script and its arguments) in 2 processes with accelerate."""
    accelerate = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "configs/accelerate/ddp.yaml",  # the file users launch with: 2 processes, DDP
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
        start_new_session=True,  # one process group: a kill reaches the training processes
    )


def run_two(*command: str, log: Path, timeout: int = LAUNCH_TIMEOUT) -> None:
    process = launch_two(*command, log=log)
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert code == 0, log.read_text()[-4000:]


@pytest.mark.slow  # ~60 s: two processes importing trl, then one process for the reference
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
        # Metrics: global, so both layouts log the same values; but erl/generate_calls, a
        # process's own count, planned from its memory budget (its rows, its measurements),
        # which every process of a run shares.
        assert len(one["metrics"]) == len(two["metrics"]) == 2
        for a, b in zip(one["metrics"], two["metrics"]):
            assert a.keys() == b.keys(), gate
            for key in a.keys() - {"erl/generate_calls"}:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (gate, key)
        calls = [[m.get("erl/generate_calls") for m in r["metrics"]] for r in ranks]
        assert calls[0] == calls[1], gate
        gated = [m["erl/gated_fraction"] for m in one["metrics"]]
        if gate == "closed":
            assert gated == [0.0, 0.0] and not one["memory"]
        elif gate == "all":
            assert gated == [1.0, 1.0]
            assert all(m["erl/internalization_rows"] > 0 for m in one["metrics"])
            assert all("erl/internalization_loss" in m for m in one["metrics"])
        else:
            assert all(0 < g < 1 for g in gated)


@pytest.mark.slow  # ~60 s: two processes importing trl, then one process for the reference
def test_two_processes_weigh_real_rows_as_one_under_row_mean_losses(tiny_model_dir, tmp_path):
    """grpo and dr_grpo divide by the chunk's rows, which under several processes include
    the inert filler rows each process keeps (a process that gated fewer rows keeps more).
    With some rows gated, 2 processes at batch 6 train the parameters 1 process at batch 12
    trains, as the default loss does in the test above. The counted inert rows scale every
    real row alike, so the optimizer is plain SGD (`multiprocess_erl.train`): Adam would
    undo the scale."""
    from multiprocess_erl import train
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    losses = ("grpo", "dr_grpo")
    run_two("tests/multiprocess_erl.py", tiny_model_dir, str(out / "two"), "6",
            ",".join(losses), "some", log=tmp_path / "log")  # fmt: skip
    for loss_type in losses:
        train(tiny_model_dir, out / "one", 12, "some", loss_type)
        one = torch.load(out / "one" / loss_type / "some" / "rank0.pt")
        two = torch.load(out / "two" / loss_type / "some" / "rank0.pt")
        assert two["world_size"] == 2, "accelerate did not start 2 processes"
        gated = [m["erl/gated_fraction"] for m in one["metrics"]]
        assert all(0 < g < 1 for g in gated), gated  # some rows gated: filler rows differ
        initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
        # Each tensor's update, two processes against one: the same up to rounding (a scale
        # from counted inert rows would show as a relative gap of 10-20%).
        largest = 0.0
        for name, value in one["params"].items():
            ours, reference = two["params"][name] - initial[name], value - initial[name]
            size = reference.abs().max().item()
            largest = max(largest, size)
            gap = (ours - reference).abs().max().item()
            assert gap <= 1e-3 * size + 1e-7, f"{loss_type}: {name} off by {gap / size:.3f}"
        assert largest > 1e-2, f"{loss_type}: the parameters barely moved ({largest})"


# configs/tiny.yaml, shortened (as in tests/test_run.py) and run by 2 processes. The
# threshold promotes a stage whose first attempts all score the fallback reward (-0.5),
# which is what a 10-step warm-up gives the tiny model: the test is about the processes
# agreeing, not about learning. No replay: every first attempt counts for the controller.
# No option only erl reads: grpo and sdpo, which refuse one, train with these too.
RUN_ARGS = [
    "--config",
    "configs/tiny.yaml",
    "--use_cpu",
    "true",
    "--warmup_sft_steps",
    "10",
    "--warmup_sft_examples",
    "200",
    "--prompts_per_stage",
    "64",
    "--eval_prompts",
    "8",
    "--per_device_train_batch_size",
    "8",
    "--num_generations",
    "4",
    "--max_completion_length",
    "8",
    "--promote_threshold",
    "-0.5",
    "--promote_window",
    "8",
    "--replay_fraction",
    "0",
    "--min_stage_steps",
    "4",
    "--max_stage_steps",
    "4",
    "--max_level",
    "2",
    "--save_steps",
    "2",
    "--disable_tqdm",
    "true",
]


def wait_for(predicate, process, timeout) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.5)
    return False


@pytest.mark.slow  # two processes importing trl, then two steps of episodes
def test_two_processes_train_erl_on_an_environment_in_step(tool_model_dir, tmp_path):
    """Episodes (TRL's tool loop), reflections, retry episodes and internalized copies on
    two processes: every rank makes the same collective calls (the run ends), DDP keeps
    the parameters equal, and both ranks hold the same memory and log the same metrics."""
    out = tmp_path / "out"
    run_two("tests/multiprocess_agents.py", tool_model_dir, str(out), log=tmp_path / "log")
    ranks = [torch.load(out / f"rank{i}.pt") for i in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2], "accelerate did not start 2 processes"
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name
    assert ranks[0]["memory"] == ranks[1]["memory"] and ranks[0]["memory"]
    metrics = [r["metrics"] for r in ranks]
    assert len(metrics[0]) == 2
    for a, b in zip(*metrics):
        shared = a.keys() - {"erl/generate_calls", "erl/retry_tool_calls"}  # a process's own
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}
        assert a["erl/gated_fraction"] == 1.0 and a["erl/internalization_rows"] == 8.0
    assert sum(m["erl/retry_tool_calls"] for r in metrics for m in r) > 0


@pytest.mark.slow  # ~60 s: two processes through a whole curriculum, killed and resumed
def test_curriculum_run_in_two_processes_promotes_is_killed_and_resumes(tiny_model_dir, tmp_path):
    """`pipeline.run` in 2 processes: both record every process's first attempts (the
    controller's count is the global one) and decide alike, stage 1 promotes, a SIGKILL of
    every process in stage 2 leaves a run that `--resume true` finishes without retraining
    stage 1, each file is written once (one metrics line per step), and the eval reward is
    the one of all eval prompts on the saved stage model.

    The resume runs as on a machine with CUDA and Unsloth (`tests/multiprocess_gpu_run.py`):
    there `backend: auto` (configs/tiny.yaml) is Unsloth for one process, and two processes
    must resolve it to transformers once, the loader reading that choice instead of
    resolving `auto` again (which gave "backend 'transformers' is already active ...
    cannot be switched to 'unsloth'")."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from curriculum.tasks import get_task
    from pipeline.evaluate.first_attempts import evaluate_first_attempts

    out = tmp_path / "run"
    command = [
        "-m",
        "pipeline.run",
        *RUN_ARGS,
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(out),
    ]
    first_log = tmp_path / "first.log"
    process = launch_two(*command, log=first_log)
    try:
        checkpoints = out / "stage_2" / "checkpoints"
        in_stage_two = wait_for(
            lambda: any(checkpoints.glob("checkpoint-*/curriculum_controller.json")),
            process,
            timeout=LAUNCH_TIMEOUT,
        )
        assert in_stage_two, first_log.read_text()[-4000:]
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already if the run failed early
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and both training processes
        process.wait()
    log = first_log.read_text()
    assert "2 processes (MULTI_CPU" in log, log[-4000:]
    assert (
        log.count("[stage 1] level") == 1
    )  # the stage summary (not a warning) comes from the main process only

    state = json.loads((out / "curriculum_state.json").read_text())
    assert [s["status"] for s in state["stages"]] == ["promoted", "running"]
    checkpoint = next(checkpoints.glob("checkpoint-*/curriculum_controller.json"))
    controller = json.loads(checkpoint.read_text())
    # 2 processes x 8 first attempts a step: the controller saw both processes' rows.
    assert controller["reward_count"] == 2 * 8 * controller["stage_steps"] > 0
    stage_one = {p: p.stat().st_mtime_ns for p in (out / "stage_1").iterdir() if p.is_file()}

    assert importlib.util.find_spec("unsloth") is not None
    resumed_log = tmp_path / "resumed.log"
    as_on_gpus = ["tests/multiprocess_gpu_run.py", *command[2:]]  # the same options
    run_two(*as_on_gpus, "--resume", "true", log=resumed_log)
    log = resumed_log.read_text()
    assert "resuming" in log and "2 processes (MULTI_CPU" in log, log[-4000:]
    assert json.loads((out / "run_config.json").read_text())["backend"] == "transformers"
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True
    assert [(s["stage"], s["status"], s["steps"]) for s in state["stages"]] == [
        (1, "promoted", 4),
        (2, "promoted", 4),
    ]
    assert {
        p: p.stat().st_mtime_ns for p in (out / "stage_1").iterdir() if p.is_file()
    } == stage_one
    for stage in (1, 2):
        metrics = [
            json.loads(line)
            for line in (out / f"stage_{stage}" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2, 3, 4]
    assert (out / "final" / "model.safetensors").exists()
    assert (out / "reward_curve.png").exists() and (out / "generations.jsonl").exists()

    model = AutoModelForCausalLM.from_pretrained(out / "stage_1")
    tokenizer = AutoTokenizer.from_pretrained(out / "stage_1")
    evaluation = evaluate_first_attempts(
        model,
        tokenizer,
        get_task("arithmetic"),
        1,
        8,
        max_new_tokens=8,
        weights={"correctness": 0.7, "milestones": 0.2, "format": 0.1},
        progress=False,
    )
    assert state["stages"][0]["eval_reward"] == pytest.approx(evaluation.mean_reward)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "sdpo"])
def test_grpo_and_sdpo_curriculum_runs_in_two_processes(tiny_model_dir, tmp_path, method):
    """`--method grpo | sdpo` in 2 processes: both processes decide alike (the run ends,
    stage by stage), the stage line comes from the main process only, and the run ends
    with its folder's files, one metrics line per step."""
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    command = ["-m", "pipeline.run", *RUN_ARGS, "--model_name_or_path", tiny_model_dir,
               "--output_dir", str(out), "--method", method]  # fmt: skip
    run_two(*command, log=log)
    text = log.read_text()
    assert "2 processes (MULTI_CPU" in text and text.count(f"[stage 1] level 1 | {method}") == 1
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True
    assert [(s["stage"], s["status"], s["steps"]) for s in state["stages"]] == [
        (1, "promoted", 4),
        (2, "promoted", 4),
    ]
    for stage in (1, 2):
        metrics = [
            json.loads(line)
            for line in (out / f"stage_{stage}" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2, 3, 4]
    assert (out / "final" / "model.safetensors").exists() and (out / "generations.jsonl").exists()


def test_unsloth_backend_is_refused_under_several_processes():
    from pipeline.options import UsageError
    from pipeline.run.distributed import backend_for_processes

    with pytest.raises(UsageError, match="--backend transformers"):
        backend_for_processes("unsloth", 2)
    assert backend_for_processes("auto", 2) == "transformers"
    assert backend_for_processes("unsloth", 1) == "unsloth"


def test_processes_that_do_not_form_a_group_are_refused(erl_args, monkeypatch):
    """torchrun on CPU without use_cpu starts N lone processes: each would train alone."""
    from pipeline.options import UsageError
    from pipeline.run.distributed import check_parallelism

    args = erl_args()
    assert args.world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="--use_cpu true"):
        check_parallelism(args)
