"""Saving and restoring the policy between stages, and finding where a run left off.

A kill never leaves a half-written folder that a resume would trust: warmup/ and final/
are written to a temporary sibling and renamed into place (their existence is the mark),
and a stage_<k>/ is complete before the state file marks the stage finished (the state is
the mark). Each loads with `from_pretrained` (full model) or `PeftModel` (adapter), and
holds the tokenizer and the reflection memory. A running stage's trainer checkpoints live
in stage_<k>/checkpoints/ and go once the state marks the stage finished (or, after a
kill in between, when the run resumes).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path

from curriculum.atomic import atomic_folder, umask_modes
from pipeline.layout import CONTROLLER_FILE, STATE_FILE, RunLayout, newest_complete_checkpoint
from pipeline.options import UsageError

logger = logging.getLogger(__name__)

KILL_POINT_ENV = "ERL_TEST_KILL_AT"
"""Tests only: "<point>:<stage>" makes the run SIGKILL itself at that point."""


def kill_point(point: str, stage: int) -> None:
    """SIGKILL this process when ERL_TEST_KILL_AT names this point of this stage, so that
    tests can kill a run at exact places of its life instead of racing a timer."""
    if os.environ.get(KILL_POINT_ENV) == f"{point}:{stage}":
        os.kill(os.getpid(), signal.SIGKILL)


def remove_finished_checkpoints(layout: RunLayout, state) -> None:
    """Delete the trainer checkpoints of finished stages (a kill can leave them behind)."""
    for entry in state.stages:
        if entry.finished:
            shutil.rmtree(layout.stage_checkpoints(entry.stage), ignore_errors=True)


def check_output_dir(layout: RunLayout, resume: bool) -> None:
    """Refuse to overwrite a previous run unless resuming, and to resume where there is no
    run: `--resume true` continues a run, it never starts one (a misspelled folder would
    otherwise begin a new run there). UsageError naming the folder and what to do."""
    root = layout.root
    # The lock file is this process's own (taken just before): it is not a run.
    holds_files = root.is_dir() and any(p != layout.lock for p in root.iterdir())
    if not resume:
        if holds_files:
            raise UsageError(
                "--output_dir holds files already",
                root,
                "pass --resume true to continue the run there, or choose another --output_dir",
            )
        return
    if not holds_files:
        raise UsageError(
            "--resume true: there is no run to resume in --output_dir",
            f"{root}: {'empty' if root.exists() else 'no such folder'}",
            "check the folder's name, or leave out --resume to start a new run there",
        )
    if not layout.state.exists():
        raise UsageError(
            f"--resume true: --output_dir holds no {STATE_FILE}, so it is not a run's folder",
            root,
            "give the folder of the run to resume",
        )


def save_policy(model, tokenizer, memory, folder: Path, *, atomic: bool = False) -> Path:
    """Write model (or adapter), tokenizer and memory to `folder`.

    `atomic` builds the folder beside it and renames it into place, for folders whose mere
    existence a resume trusts (warmup/, final/). Stage folders also hold the metrics, so
    they are written in place; the state file marks them finished after.
    """
    if not atomic:
        _write_policy(model, tokenizer, memory, folder)
        return folder
    with atomic_folder(folder) as staging:
        _write_policy(model, tokenizer, memory, staging)
    return folder


def _write_policy(model, tokenizer, memory, folder: Path) -> None:
    from pipeline.models.quantization import record_base_quantization

    model.save_pretrained(folder)
    record_base_quantization(model, folder)  # so that evaluation rebuilds the 4-bit base
    tokenizer.save_pretrained(folder)
    memory.save(folder)
    umask_modes(folder)  # the weights, which safetensors writes owner-only


def load_policy_weights(model, folder: Path) -> None:
    """Load the weights saved by `save_policy` into the already-loaded `model`."""
    from safetensors.torch import load_file

    if (folder / "adapter_model.safetensors").exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        unexpected = getattr(result, "unexpected_keys", [])
    else:
        state = {}
        for shard in sorted(folder.glob("model*.safetensors")):
            state.update(load_file(shard))
        if not state:
            raise FileNotFoundError(f"no model weights in {folder}")
        unexpected = model.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise RuntimeError(f"weights in {folder} do not fit the loaded model: {unexpected[:5]}")


def latest_trainer_checkpoint(folder: Path) -> Path | None:
    """The running stage's newest complete trainer checkpoint (`checkpoint_is_complete`);
    one a kill or a full disk cut is passed over, and said so."""
    if not folder.exists():
        return None
    checkpoint, passed_over = newest_complete_checkpoint(folder)
    for cut in passed_over:
        logger.info(f"passing over {cut}: its save did not finish")
    return checkpoint


def read_controller_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / CONTROLLER_FILE).read_text())
