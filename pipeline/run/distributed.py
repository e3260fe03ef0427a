"""Several processes (`accelerate launch`, torchrun): who writes, who waits, what is shared.

The curriculum run under N processes is N copies of one program that train one model
with DDP. They must agree on everything that decides what happens next (the controller
sees the first attempts of every process) and only the main process writes the run's
files (state, stage folders, plots, generations.jsonl). Everything here is a no-op, or
the identity, in a single process.
"""

from __future__ import annotations

import os
from typing import Any

from curriculum.state import CurriculumState
from pipeline.options import UsageError

# How to launch several processes, for the messages below.
LAUNCH_HINT = "accelerate launch --config_file configs/accelerate/ddp.yaml -m pipeline.run ..."


def launched_processes() -> int:
    """How many processes the launcher started (torchrun and accelerate set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def backend_for_processes(requested: str, processes: int) -> str:
    """The backend to activate: under several processes `auto` means transformers, and
    `unsloth` is refused (Unsloth's GRPO trainer is single-GPU)."""
    if processes <= 1:
        return requested
    if requested == "unsloth":
        raise UsageError(
            "--backend unsloth trains on one GPU (Unsloth's GRPO trainer is single-process), "
            "and several processes were launched",
            processes,
            "for several GPUs pass --backend transformers (plain transformers + PEFT under "
            f"DDP): {LAUNCH_HINT} --backend transformers; for Unsloth, run one process",
        )
    return "transformers" if requested == "auto" else requested


def check_parallelism(args) -> None:
    """Refuse a launch whose processes do not form one group, and sharded parameters: the run evaluates and saves on the main process alone,
    which needs the whole model there (DDP or ZeRO-1/2; not FSDP or ZeRO-3)."""
    launched = launched_processes()
    if args.world_size != launched:  # e.g. torchrun on CPU without use_cpu: N lone processes
        raise UsageError(
            f"{launched} processes were launched but the trainer sees another world size",
            args.world_size,
            "on a machine without GPUs pass --use_cpu true (gloo backend)",
        )
    if args.world_size <= 1:
        return
    env = os.environ
    fsdp = bool(args.fsdp) or env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if fsdp or env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        raise UsageError(
            "sharded parameters: the run evaluates and saves each stage on the main process, "
            "which needs the whole model there",
            "FSDP" if fsdp else "DeepSpeed ZeRO-3",
            f"use data parallelism, configs/accelerate/ddp.yaml ({LAUNCH_HINT}) or "
            "configs/accelerate/zero2.yaml",
        )


def _state():
    from accelerate import PartialState

    return PartialState()


def is_main_process() -> bool:
    """Whether this process writes the run's files (always, in a single process)."""
    return _state().is_main_process


def wait_for_everyone() -> None:
    """Block until every process gets here (nothing to wait for in a single process)."""
    _state().wait_for_everyone()


def describe() -> str:
    """One line for the log: how many processes, over what."""
    state = _state()
    return (
        f"{state.num_processes} processes ({state.distributed_type.value}, "
        f"backend {state.backend}); process 0 writes the run's files"
    )


def all_processes(items: list[Any]) -> list[Any]:
    """`items` of every process concatenated in rank order: the same list on each."""
    if _state().num_processes == 1:
        return items
    from accelerate.utils import gather_object

    return gather_object(items)


class _ReplicaState(CurriculumState):
    """The state as a non-main process keeps it: the same bookkeeping, never written."""

    def save(self) -> None:
        pass


def load_curriculum_state(path) -> CurriculumState:
    """The run's curriculum state; only the main process's copy writes the file."""
    return (CurriculumState if is_main_process() else _ReplicaState).load(path)
