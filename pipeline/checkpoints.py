"""Saving and restoring the policy between stages, and finding where a run left off.

Every folder the run writes (warmup/, stage_<k>/, final/) is written to a temporary
sibling and renamed into place, so a kill never leaves a half-written folder that a
resume would trust. Each loads with `from_pretrained` (full model) or `PeftModel`
(adapter), and holds the tokenizer and the reflection memory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from curriculum.state import STATE_FILENAME

CONTROLLER_FILE = "curriculum_controller.json"


def check_output_dir(output_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a previous run unless resuming; refuse to resume nothing."""
    has_run = output_dir.exists() and any(output_dir.iterdir())
    if has_run and not resume:
        raise SystemExit(
            f"error: output_dir {output_dir} is not empty. Pass --resume true to continue that run, "
            "or choose another --output_dir."
        )
    if resume and not (output_dir / STATE_FILENAME).exists() and has_run:
        raise SystemExit(f"error: --resume: {output_dir} holds no {STATE_FILENAME} to resume from")


def save_policy(model, tokenizer, memory, folder: Path, *, atomic: bool = False) -> Path:
    """Write model (or adapter), tokenizer and memory to `folder`.

    `atomic` writes a temporary sibling and renames it into place, for folders whose mere
    existence a resume trusts (warmup/, final/). Stage folders also hold metrics and
    checkpoints, so they are written in place; the state file marks them finished after.
    """
    target = folder.with_name(f".{folder.name}.partial") if atomic else folder
    if atomic and target.exists():
        shutil.rmtree(target)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    memory.save(target)
    if atomic:
        if folder.exists():
            shutil.rmtree(folder)
        target.rename(folder)
    return folder


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
    """The newest complete trainer checkpoint: one whose controller state was written,
    which happens after the trainer finished writing the checkpoint."""
    if not folder.exists():
        return None
    candidates = [
        p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if (p / CONTROLLER_FILE).exists()
    ]
    return max(candidates, key=lambda p: int(p.name.rsplit("-", 1)[1]), default=None)


def read_controller_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / CONTROLLER_FILE).read_text())
