"""The rows ERL adds to a GRPO generation batch, in the layout of the active base trainer.

Two bases read the same batch keys differently:

- TRL's GRPOTrainer: per-token tensors (log-probs, masks, importance ratios) have the
  completion's width C, token j of a row in column j.
- Unsloth's generated trainer: old and reference log-probs are "packed", width C + M
  (M = the batch's widest left padding), computed on rows whose padding was moved to the
  right, so token j of a row with left padding p sits in column M - p + j. Sampling
  log-probs (vLLM) stay in TRL's layout; its loss re-aligns them, and it rebuilds the
  completion mask from the token ids (pad id = not trained).

This module builds ERL's rows so both read them right: padding and filler rows have
pad-only completions and are flagged in `INERT_KEY` so that `ERLTrainer.compute_loss`
leaves them out of every loss type; sampling log-probs are kept in TRL's layout. How the
merged batch is then trained in micro-batches is `pipeline.erl.micro_batches`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from trl.trainer.utils import pad

from pipeline.erl.interface import NewRows
from pipeline.erl.upstream import importance_sampling_ratio

# A (B,) bool tensor in merged batches: rows that carry no signal (filler to a multiple of
# steps_per_generation, rows that equalise counts across processes). TRL's buffering
# splits and shuffles it with the other rows; ERLTrainer.compute_loss drops those rows.
INERT_KEY = "erl_inert"

# Batch keys whose rows ERL knows how to extend; anything else (images, Unsloth's optional
# sample weights) is refused when the trainer is built.
ROW_KEYS = {
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "max_left_pad",
    INERT_KEY,
}
SCALAR_KEYS = {"num_items_in_batch"}
Scorer = Callable[[dict], torch.Tensor]
"""Per-token log-probs of a batch's completions, in the base trainer's layout."""


def pad_rows(rows: NewRows, pad_id: int, device, multiple: int | None = None) -> dict:
    """Left-padded prompts and right-padded completions. Inert rows get a pad-only
    completion (a base that rebuilds the mask from token ids then trains nothing there);
    masked rows keep their tokens under a zero mask, as GRPO's own truncated rows do.
    Where a row has a tool mask (an episode), the batch has TRL's `tool_mask`: 0 over tool
    results, 1 elsewhere (padding included, as TRL pads it)."""
    prompts = [torch.tensor(p, dtype=torch.long) for p in rows.prompt_ids]
    completions = [
        torch.tensor(c if ok and c else [pad_id], dtype=torch.long)
        for c, ok in zip(rows.completion_ids, rows.valid)
    ]
    completion_mask = [
        torch.full_like(c, int(ok and train and len(raw) > 0))
        for c, raw, ok, train in zip(completions, rows.completion_ids, rows.valid, rows.trainable)
    ]

    def padded(tensors, value, side):
        return pad(tensors, padding_value=value, padding_side=side, pad_to_multiple_of=multiple).to(
            device
        )

    batch = {
        "prompt_ids": padded(prompts, pad_id, "left"),
        "prompt_mask": padded([torch.ones_like(p) for p in prompts], 0, "left"),
        "completion_ids": padded(completions, pad_id, "right"),
        "completion_mask": padded(completion_mask, 0, "right"),
    }
    if any(mask is not None for mask in rows.tool_masks):
        batch["tool_mask"] = padded(_tool_masks(rows, completions), 1, "right")
    return batch


def _tool_masks(rows: NewRows, completions: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each row's tool mask as a tensor the length of its padded completion."""
    masks = []
    for mask, completion, raw, ok in zip(
        rows.tool_masks, completions, rows.completion_ids, rows.valid
    ):
        if mask is None or not (ok and raw):
            masks.append(torch.ones_like(completion))
            continue
        if len(mask) != len(raw):
            raise ValueError(f"a tool mask of {len(mask)} tokens for a {len(raw)}-token completion")
        masks.append(torch.tensor(mask, dtype=torch.long))
    return masks


def loss_mask(batch: dict) -> torch.Tensor:
    """The tokens the loss trains (TRL's): the completion mask, less tool results."""
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


def cat_padded(
    a: torch.Tensor, b: torch.Tensor, value, side: str, multiple: int | None = None
) -> torch.Tensor:
    """Concatenate two (rows, length) tensors along rows, padding to the longer length
    (rounded up to `multiple`, the trainer's `pad_to_multiple_of`)."""
    width = max(a.size(1), b.size(1))
    if multiple:
        width = math.ceil(width / multiple) * multiple

    def widen(t: torch.Tensor) -> torch.Tensor:
        extra = width - t.size(1)
        if extra == 0:
            return t
        filler = torch.full((t.size(0), extra), value, dtype=t.dtype, device=t.device)
        return torch.cat([filler, t] if side == "left" else [t, filler], dim=1)

    return torch.cat([widen(a), widen(b).to(a.device)], dim=0)


def completion_layout(
    logps: torch.Tensor, prompt_mask: torch.Tensor, completion_width: int
) -> torch.Tensor:
    """Per-token log-probs in TRL's layout (token j in column j), from either layout.

    Unsloth's packed layout has width C + M: token j of a row with left padding p is in
    column M - p + j (the inverse of its `align_logprobs_with_mask`)."""
    extra = logps.size(1) - completion_width
    if extra == 0:
        return logps
    left_pad = (prompt_mask == 0).sum(dim=1)
    columns = (extra - left_pad).unsqueeze(1) + torch.arange(completion_width, device=logps.device)
    return logps.gather(1, columns.clamp(max=logps.size(1) - 1))


def merge_rows(
    output: dict,
    rows: NewRows,
    *,
    pad_id: int,
    multiple: int | None,
    steps_per_generation: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    logps: Scorer,
    ref_logps: Scorer,
    importance_sampling: tuple[str, float | None, float | None],
) -> dict:
    """Append `rows` to GRPO's batch `output` in the base trainer's layout.

    Re-pads (to `multiple`, the trainer's `pad_to_multiple_of`), gives the new rows every
    per-row tensor the batch has, pads the row count to a multiple of
    `steps_per_generation` with inert rows (TRL drops the rest when it splits the batch),
    flags the inert rows and recounts `num_items_in_batch` (`gather`: the accelerator's).
    Old and reference log-probs come from `logps` and `ref_logps`, the vLLM importance
    ratio from TRL's formula with `importance_sampling` = (mode, clip_min, clip_max)."""
    unknown = sorted(set(output) - ROW_KEYS - SCALAR_KEYS)
    if unknown:  # ERLTrainer refuses the known cases when it is built; this is the backstop
        raise NotImplementedError(f"ERLTrainer cannot add rows to a batch with {unknown}")
    device = output["prompt_ids"].device
    # Every process adds the same number of rows, a multiple of the split.
    counts = gather(torch.tensor([len(rows.valid)], device=device))
    target = int(counts.max().item())
    target += -(output["prompt_ids"].size(0) + target) % steps_per_generation
    rows.add_filler(target - len(rows.valid))
    merged = _merged_core(output, rows, pad_id, multiple)
    # Optional tensors exist only in some configurations (vLLM, beta > 0, generation reuse):
    # the merged batch has one exactly when GRPO's batch has it. Old and reference log-probs
    # are recomputed over the whole merged batch, since GRPO's rows were re-padded and the
    # base's own scorer (TRL's layout or Unsloth's packed one) must see one batch.
    has = {key for key in OPTIONAL_KEYS if output.get(key) is not None}
    before = output["prompt_ids"].size(0)
    current = None
    if has & {"old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio"}:
        current = logps(merged)
    if "old_per_token_logps" in has:
        merged["old_per_token_logps"] = current
    if "sampling_per_token_logps" in has:
        merged["sampling_per_token_logps"] = _sampling_logps(
            output["sampling_per_token_logps"], merged, rows, current, before, multiple
        )
    if "ref_per_token_logps" in has:
        merged["ref_per_token_logps"] = ref_logps(merged)
    if "importance_sampling_ratio" in has:  # TRL's layout (Unsloth computes it in its loss)
        merged["importance_sampling_ratio"] = _importance_ratio(
            output["importance_sampling_ratio"], merged, current, before, importance_sampling,
            multiple,
        )  # fmt: skip
    if "max_left_pad" in output:  # Unsloth: the widest left padding of the batch, per row
        left_pad = int((merged["prompt_mask"] == 0).sum(dim=1).max().item())
        merged["max_left_pad"] = torch.full(
            (merged["prompt_ids"].size(0), 1), left_pad, dtype=output["max_left_pad"].dtype
        )
    merged["num_items_in_batch"] = gather(loss_mask(merged).sum()).sum()
    return merged


OPTIONAL_KEYS = (
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)


def _merged_core(output: dict, rows: NewRows, pad_id: int, multiple: int | None) -> dict:
    """GRPO's ids, masks and advantages with `rows` appended (re-padded), and the inert flags."""
    device = output["prompt_ids"].device
    new = pad_rows(rows, pad_id, device, multiple)
    new["advantages"] = torch.tensor(
        rows.advantages, device=device, dtype=output["advantages"].dtype
    )
    merged = {
        "prompt_ids": cat_padded(output["prompt_ids"], new["prompt_ids"], pad_id, "left", multiple),
        "prompt_mask": cat_padded(output["prompt_mask"], new["prompt_mask"], 0, "left", multiple),
        "completion_ids": cat_padded(
            output["completion_ids"], new["completion_ids"], pad_id, "right", multiple
        ),
        "completion_mask": cat_padded(
            output["completion_mask"], new["completion_mask"], 0, "right", multiple
        ),
        "advantages": torch.cat([output["advantages"], new["advantages"]]),
    }
    if output.get("tool_mask") is not None:  # TRL's tool loop ran: every row carries one
        ours = new.get("tool_mask", torch.ones_like(new["completion_mask"]))
        merged["tool_mask"] = cat_padded(output["tool_mask"], ours, 1, "right", multiple)
    before = output["prompt_ids"].size(0)
    inert = torch.zeros(merged["prompt_ids"].size(0), dtype=torch.bool, device=device)
    inert[before:] = ~torch.tensor(rows.valid, dtype=torch.bool, device=device)
    merged[INERT_KEY] = inert
    return merged


def _sampling_logps(sampling, merged, rows: NewRows, current, before: int, multiple):
    """GRPO's sampling log-probs with those of the new rows appended.

    Rows the generator reported log-probs for (vLLM) keep them: the importance ratio then
    corrects for the sampler as it does for first attempts. Internalization rows (original
    prompt -> y2) were not sampled from that prompt: current log-probs, ratio 1, which keeps
    their loss the gradient of cross-entropy."""
    width = merged["completion_ids"].size(1)
    device = merged["completion_ids"].device
    ours = completion_layout(current, merged["prompt_mask"], width)[before:].clone()
    for j, reported in enumerate(rows.sampling_logps):
        if reported is not None:  # vLLM reports an unavailable log-prob as None: NaN, as TRL
            values = [float("nan") if x is None else x for x in reported]
            values = torch.tensor(values, dtype=ours.dtype, device=device)[:width]
            ours[j, : values.numel()] = values
    return cat_padded(sampling, ours.to(sampling.dtype), 0.0, "right", multiple)


def _importance_ratio(ratio, merged, current, before: int, importance_sampling, multiple):
    """GRPO's vLLM importance ratio ((B, T) per token or (B, 1) per sequence) with the new
    rows' appended, by TRL's formula over the tokens the model generated: TRL's tool loop
    records a sampling log-prob of 0.0 over a tool's result, which would otherwise count."""
    sampling = merged.get("sampling_per_token_logps")
    old = completion_layout(current, merged["prompt_mask"], merged["completion_ids"].size(1))
    ours = importance_sampling_ratio(
        old[before:],
        (sampling if sampling is not None else old)[before:],
        loss_mask(merged)[before:],  # as TRL: tool results (sampling log-prob 0.0) count not
        *importance_sampling,
    )
    return cat_padded(ratio, ours.to(ratio.dtype), 1.0, "right", multiple)
