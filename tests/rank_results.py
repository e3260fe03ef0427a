"""What a training process of the multi-process tests writes for the test to compare:
its world size, final parameters, the erl/ metrics it logged and its reflection memory."""

from __future__ import annotations

from pathlib import Path

import torch


def save_rank_result(trainer, folder: Path) -> None:
    """Write `folder/rank<i>.pt` for this process after `trainer.train()`."""
    result = {
        "world_size": trainer.accelerator.num_processes,
        "params": {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters()},
        "metrics": [
            {k: v for k, v in logs.items() if k.startswith("erl/")}
            for logs in trainer.state.log_history
            if "erl/r1_mean" in logs
        ],
        "memory": [(e.prompt, e.reflection) for e in trainer.memory],
    }
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(result, folder / f"rank{trainer.accelerator.process_index}.pt")
