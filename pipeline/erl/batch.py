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
leaves them out of every loss type; sampling log-probs are kept in TRL's layout; and the
merged batch is cut into micro-batches of at most `per_device_train_batch_size` rows and
at most the padded tokens of one GRPO forward, trimmed to their own widths, whose
weighted losses add up to the loss of the whole chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from trl.trainer.utils import pad

# A (B,) bool tensor in merged batches: rows that carry no signal (filler to a multiple of
# steps_per_generation, rows that equalise counts across processes). TRL's buffering
# splits and shuffles it with the other rows; ERLTrainer.compute_loss drops those rows.
INERT_KEY = "erl_inert"

# Batch keys whose rows ERL knows how to extend; anything else (images, tool masks,
# Unsloth's optional sample weights) is refused when the trainer is built.
ROW_KEYS = {
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "max_left_pad",
    INERT_KEY,
}
# A 0-dim tensor in merged batches: the padded tokens (rows x width) one forward of GRPO's
# own batch holds at per_device_train_batch_size rows. ERLTrainer.compute_loss keeps every
# micro-batch within it, so that retries, whose prompts carry the reflection, do not need
# more memory than GRPO.
TOKEN_BUDGET_KEY = "erl_tokens_per_forward"
SCALAR_KEYS = {"num_items_in_batch", TOKEN_BUDGET_KEY}

# Loss types whose normaliser is the global token count `num_items_in_batch` (a micro-batch
# needs no reweighting), per-row means (weight: share of rows) and local token means
# (weight: share of loss tokens). TRL 1.15 and Unsloth 2026.10.9 normalise alike.
GLOBAL_TOKEN_LOSSES = {"dapo", "cispo", "vespo"}
ROW_MEAN_LOSSES = {"grpo", "sapo", "dr_grpo", "luspo"}
LOCAL_TOKEN_LOSSES = {"bnpo"}


# The parts of a merged batch (`NewRows.parts` labels ERL's rows; GRPO's rows are "first").
# With ERLConfig.loss_normalization="per_part" each part is normalised over its own tokens.
PART_FIRST = "first"  # first attempts y1 (GRPO's own rows)
PART_RETRY = "retry"  # reflections and retries y2: the second attempt, advantage from r2
PART_INTERNALIZATION = "internalization"  # original prompt -> successful y2
PART_FILLER = "filler"  # inert rows
PARTS = (PART_FIRST, PART_RETRY, PART_INTERNALIZATION)


@dataclass
class NewRows:
    """Rows ERL adds to a generation batch (token ids as lists, one advantage each)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: list[float]
    valid: list[bool]  # False: inert (count equalising or filler); pad-only completion
    trainable: list[bool]  # False: kept but masked, as GRPO masks truncated completions
    # Per-token log-probs the generator reported for each row (vLLM), else None.
    sampling_logps: list[list[float] | None] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # one of PARTS (or PART_FILLER) per row

    def __post_init__(self) -> None:
        if not self.sampling_logps:
            self.sampling_logps = [None] * len(self.valid)
        if not self.parts:
            self.parts = [PART_RETRY] * len(self.valid)

    def extend(self, other: NewRows) -> None:
        self.prompt_ids += other.prompt_ids
        self.completion_ids += other.completion_ids
        self.advantages += other.advantages
        self.valid += other.valid
        self.trainable += other.trainable
        self.sampling_logps += other.sampling_logps
        self.parts += other.parts

    def add_filler(self, count: int) -> None:
        """Append `count` inert rows (they only round the row count up)."""
        self.extend(
            NewRows(
                [self.prompt_ids[0]] * count,
                [[]] * count,
                [0.0] * count,
                [False] * count,
                [False] * count,
                parts=[PART_FILLER] * count,
            )
        )


def pad_rows(rows: NewRows, pad_id: int, device, multiple: int | None = None) -> dict:
    """Left-padded prompts and right-padded completions. Inert rows get a pad-only
    completion (a base that rebuilds the mask from token ids then trains nothing there);
    masked rows keep their tokens under a zero mask, as GRPO's own truncated rows do."""
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

    return {
        "prompt_ids": padded(prompts, pad_id, "left"),
        "prompt_mask": padded([torch.ones_like(p) for p in prompts], 0, "left"),
        "completion_ids": padded(completions, pad_id, "right"),
        "completion_mask": padded(completion_mask, 0, "right"),
    }


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


def loss_token_mask(batch: dict, pad_id: int, unsloth: bool, mask_truncated: bool) -> torch.Tensor:
    """The completion tokens the base trainer's loss counts: TRL's completion_mask, or, for
    Unsloth, the non-pad tokens (it rebuilds the mask from the ids) of rows it keeps."""
    mask = batch["completion_mask"]
    if not unsloth:
        return mask
    rebuilt = (batch["completion_ids"] != pad_id).to(mask.dtype)
    if mask_truncated:  # Unsloth re-applies the rows TRL emptied for truncation
        rebuilt = rebuilt * (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
    return rebuilt


def importance_sampling_ratio(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL 1.15's vLLM importance-sampling correction (its `_generate_and_score_completions`),
    for rows ERL adds: (B, C) for token modes, (B, 1) for sequence modes."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The batch restricted to `rows` (a bool mask or indices); scalars are kept."""
    return {
        key: value[rows] if isinstance(value, torch.Tensor) and value.dim() > 0 else value
        for key, value in batch.items()
    }


def row_extents(batch: dict, pad_id: int) -> tuple[list[int], list[int]]:
    """Per row: its prompt's tokens, and its completion's columns up to the last token that
    is real by mask or by id (TRL reads the mask, Unsloth the ids)."""
    prompt = batch["prompt_mask"].sum(dim=1)
    real = (batch["completion_mask"] > 0) | (batch["completion_ids"] != pad_id)
    columns = torch.arange(1, real.size(1) + 1, device=real.device)
    completion = (real * columns).amax(dim=1)
    return prompt.tolist(), completion.tolist()


def plan_micro_batches(batch: dict, pad_id: int, limit: int, budget: int) -> list[list[int]]:
    """Rows of each micro-batch: at most `limit` rows and at most `budget` padded tokens
    (rows x (widest prompt + widest completion) of the micro-batch; a wider row goes alone).

    Rows are sorted by length first, so that retries, whose prompts carry the reflection,
    share micro-batches with each other and first attempts keep GRPO's width."""
    prompt, completion = row_extents(batch, pad_id)
    return _pack(
        _longest_first(prompt, completion),
        lambda rows: _fits(rows, prompt, completion, limit, budget),
    )


def plan_equal_micro_batches(batch: dict, pad_id: int, rows_each: int) -> list[list[int]]:
    """Rows sorted by length in consecutive micro-batches of `rows_each` rows (the last one
    shorter): with several processes, micro-batch i must have as many rows everywhere,
    because the loss gathers per-row metrics."""
    order = _longest_first(*row_extents(batch, pad_id))
    return [order[i : i + rows_each] for i in range(0, len(order), rows_each)]


def rows_per_micro_batch(batch: dict, pad_id: int, limit: int, budget: int) -> int:
    """The most rows (at most `limit`) whose consecutive groups, sorted by length, each fit
    the budget; 1 if none does."""
    prompt, completion = row_extents(batch, pad_id)
    order = _longest_first(prompt, completion)
    for size in range(min(limit, len(order)), 1, -1):
        groups = [order[i : i + size] for i in range(0, len(order), size)]
        if all(_fits(rows, prompt, completion, limit, budget) for rows in groups):
            return size
    return 1


def _longest_first(prompt: list[int], completion: list[int]) -> list[int]:
    return sorted(range(len(prompt)), key=lambda row: prompt[row] + completion[row], reverse=True)


def _fits(rows: list[int], prompt: list[int], completion: list[int], limit, budget) -> bool:
    width = max(prompt[r] for r in rows) + max(completion[r] for r in rows)
    return len(rows) <= limit and len(rows) * width <= budget


def _pack(order: list[int], fits) -> list[list[int]]:
    """Rows in `order`, greedily grouped: a group grows while `fits(group)`; a row that
    fits nowhere goes alone."""
    plan, current = [], []
    for row in order:
        if current and not fits(current + [row]):
            plan.append(current)
            current = []
        current.append(row)
    plan.append(current)
    return plan


def plan_generation(prompt_lengths: list[int], new_tokens: int, budget: int) -> list[list[int]]:
    """Consecutive prompts per generate call: at most `budget` tokens (rows x (longest
    prompt + new tokens)), the most GRPO's own generation holds; a longer prompt goes alone."""
    return _pack(
        list(range(len(prompt_lengths))),
        lambda rows: len(rows) * (max(prompt_lengths[r] for r in rows) + new_tokens) <= budget,
    )


def split_plan(plan: list[list[int]], count: int) -> list[list[int]]:
    """`plan` cut into `count` micro-batches by halving the largest ones (every process
    must call the loss, whose metric gathers are collective, the same number of times)."""
    plan = [list(rows) for rows in plan]
    while len(plan) < count:
        largest = max(range(len(plan)), key=lambda i: len(plan[i]))
        rows = plan.pop(largest)
        if len(rows) < 2:
            raise ValueError(f"cannot cut {sum(map(len, plan)) + 1} rows into {count} parts")
        plan[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    return plan


def micro_batch(
    batch: dict, rows: list[int], pad_id: int, packed: bool, multiple: int | None = None
) -> dict:
    """The batch's `rows`, with the padding columns none of them needs cut off (rounded up
    to `multiple`, the trainer's `pad_to_multiple_of`).

    Per-token tensors in TRL's layout keep their first columns. Unsloth's packed ones
    (`packed`: old and reference log-probs, width C + M) are cut so that token j of a row
    still sits in column M' - p' + j for the micro-batch's own widest left padding M'."""
    index = torch.tensor(rows, device=batch["prompt_ids"].device)
    part = select_rows(batch, index)
    prompt, completion = row_extents(part, pad_id)
    full_prompt, full_completion = part["prompt_ids"].size(1), part["completion_ids"].size(1)

    def rounded(width: int, limit: int) -> int:
        width = max(width, 1)
        if multiple:
            width = math.ceil(width / multiple) * multiple
        return min(width, limit)

    prompt_width = rounded(max(prompt), full_prompt)
    completion_width = rounded(max(completion), full_completion)
    for key in ("prompt_ids", "prompt_mask"):
        part[key] = part[key][:, full_prompt - prompt_width :]
    for key in ("completion_ids", "completion_mask"):
        part[key] = part[key][:, :completion_width]
    # Packed column of token j: M - (P - length) + j before, M' - (P' - length) + j after,
    # with M' = P' - shortest prompt: the same shift for every row.
    left_pad = prompt_width - min(prompt)
    for key in (
        "old_per_token_logps",
        "ref_per_token_logps",
        "sampling_per_token_logps",
        "importance_sampling_ratio",
    ):
        values = part.get(key)
        if values is None or values.size(1) == 1:  # absent, or one value per sequence
            continue
        if packed and key in ("old_per_token_logps", "ref_per_token_logps"):
            start = values.size(1) - full_completion - full_prompt + min(prompt)
            part[key] = values[:, start : start + completion_width + left_pad]
        else:
            part[key] = values[:, :completion_width]
    if "max_left_pad" in part:  # Unsloth: the widest left padding, per row
        part["max_left_pad"] = torch.full_like(part["max_left_pad"], left_pad)
    return part


def micro_batch_weight(loss_type: str, rows: list[int], token_mask: torch.Tensor) -> float:
    """The weight that makes the micro-batches' weighted losses add up to the chunk's."""
    if loss_type in GLOBAL_TOKEN_LOSSES:
        return 1.0
    if loss_type in ROW_MEAN_LOSSES:
        return len(rows) / token_mask.size(0)
    if loss_type in LOCAL_TOKEN_LOSSES:  # an empty micro-batch's loss is 0 whatever its weight
        return token_mask[rows].sum().item() / token_mask.sum().clamp(min=1).item() or 1.0
    raise ValueError(f"ERLTrainer cannot micro-batch loss_type={loss_type!r}")


def merge_rows(trainer, output: dict, rows: NewRows) -> dict:
    """Append `rows` to GRPO's batch `output` in the base trainer's layout.

    Re-pads, gives the new rows every per-row tensor the batch has, pads the row count to a
    multiple of `steps_per_generation` with inert rows (TRL drops the rest when it splits
    the batch), flags the inert rows and recounts `num_items_in_batch`."""
    unknown = sorted(set(output) - ROW_KEYS - SCALAR_KEYS)
    if unknown:  # ERLTrainer refuses the known cases when it is built; this is the backstop
        raise NotImplementedError(f"ERLTrainer cannot add rows to a batch with {unknown}")
    device = output["prompt_ids"].device
    pad_id = trainer._tokenizer.pad_token_id
    multiple = trainer.pad_to_multiple_of
    # Every process adds the same number of rows, a multiple of the split.
    counts = trainer.accelerator.gather(torch.tensor([len(rows.valid)], device=device))
    target = int(counts.max().item())
    target += -(output["prompt_ids"].size(0) + target) % trainer.args.steps_per_generation
    rows.add_filler(target - len(rows.valid))
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
    width = output["prompt_ids"].size(1) + output["completion_ids"].size(1)
    merged[TOKEN_BUDGET_KEY] = torch.tensor(trainer.args.per_device_train_batch_size * width)
    before = output["prompt_ids"].size(0)
    inert = torch.zeros(merged["prompt_ids"].size(0), dtype=torch.bool, device=device)
    inert[before:] = ~torch.tensor(rows.valid, dtype=torch.bool, device=device)
    merged[INERT_KEY] = inert

    # Optional tensors exist only in some configurations (vLLM, beta > 0, generation reuse):
    # the merged batch has one exactly when GRPO's batch has it. Old and reference log-probs
    # are recomputed over the whole merged batch, since GRPO's rows were re-padded and the
    # base's own scorer (TRL's layout or Unsloth's packed one) must see one batch.
    has = {
        k
        for k in (
            "old_per_token_logps",
            "ref_per_token_logps",
            "sampling_per_token_logps",
            "importance_sampling_ratio",
        )
        if output.get(k) is not None
    }
    current = None
    if has & {"old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio"}:
        current = trainer._logps(trainer.model, merged)
    if "old_per_token_logps" in has:
        merged["old_per_token_logps"] = current
    if "sampling_per_token_logps" in has:
        width = merged["completion_ids"].size(1)
        ours = completion_layout(current, merged["prompt_mask"], width)[before:].clone()
        # Rows the generator reported log-probs for (vLLM) keep them: the importance ratio
        # then corrects for the sampler as it does for first attempts. Internalization rows
        # (original prompt -> y2) were not sampled from that prompt: current log-probs,
        # ratio 1, which keeps their loss the gradient of cross-entropy.
        for j, reported in enumerate(rows.sampling_logps):
            if reported is not None:  # vLLM reports an unavailable log-prob as None: NaN, as TRL
                values = [float("nan") if x is None else x for x in reported]
                values = torch.tensor(values, dtype=ours.dtype, device=device)[:width]
                ours[j, : values.numel()] = values
        sampling = output["sampling_per_token_logps"]
        merged["sampling_per_token_logps"] = cat_padded(
            sampling, ours.to(sampling.dtype), 0.0, "right", multiple
        )
    if "ref_per_token_logps" in has:
        merged["ref_per_token_logps"] = trainer._ref_logps(merged)
    if "importance_sampling_ratio" in has:  # TRL's layout (Unsloth computes it in its loss)
        args = trainer.args
        ratio = output["importance_sampling_ratio"]  # (B, T) per token or (B, 1) per sequence
        sampling = merged.get("sampling_per_token_logps")
        old = completion_layout(current, merged["prompt_mask"], merged["completion_ids"].size(1))
        ours = importance_sampling_ratio(
            old[before:],
            (sampling if sampling is not None else old)[before:],
            merged["completion_mask"][before:],
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        merged["importance_sampling_ratio"] = cat_padded(
            ratio, ours.to(ratio.dtype), 1.0, "right", multiple
        )
    if "max_left_pad" in output:  # Unsloth: the widest left padding of the batch, per row
        left_pad = int((merged["prompt_mask"] == 0).sum(dim=1).max().item())
        merged["max_left_pad"] = torch.full(
            (merged["prompt_ids"].size(0), 1), left_pad, dtype=output["max_left_pad"].dtype
        )
    merged["num_items_in_batch"] = trainer.accelerator.gather(merged["completion_mask"].sum()).sum()
    return merged


def normalise_parts(merged: dict, first_rows: int, rows: NewRows, gather) -> dict[str, int]:
    """Scale the advantages of a merged batch so that its token-normalised loss (DAPO,
    CISPO: sum over tokens / `num_items_in_batch`) becomes the sum of one such loss per part,
    each over the part's own tokens: first attempts weigh exactly as in GRPO's own batch,
    retries as a batch of their own, internalization as coef x mean token cross-entropy.

    Those losses are linear in the advantage (DAPO's clipping commutes with a positive
    factor), so multiplying a part's advantages by (merged tokens / part tokens) is exact.
    Tokens are counted as `num_items_in_batch` counts them (completion_mask, every process:
    `gather` is the accelerator's). `first_rows` leading rows are GRPO's; `rows` are the
    rows `merge_rows` appended, in order. Returns the global token count of each part."""
    mask = merged["completion_mask"]
    labels = [PART_FIRST] * first_rows + list(rows.parts)
    if len(labels) != mask.size(0):
        raise ValueError(f"{len(labels)} part labels for a batch of {mask.size(0)} rows")
    index = {
        part: torch.tensor([i for i, x in enumerate(labels) if x == part], dtype=torch.long)
        for part in PARTS
    }
    local = torch.stack([mask[index[part].to(mask.device)].sum() for part in PARTS])
    counts = gather(local.unsqueeze(0)).reshape(-1, len(PARTS)).sum(dim=0)
    total = merged["num_items_in_batch"]
    advantages = merged["advantages"].clone()
    for part, count in zip(PARTS, counts):
        if count > 0 and len(index[part]):
            rows_of_part = index[part].to(advantages.device)
            scale = (total.to(advantages.dtype) / count.to(advantages.dtype)).to(advantages.device)
            advantages[rows_of_part] = advantages[rows_of_part] * scale
    merged["advantages"] = advantages
    return {part: int(count.item()) for part, count in zip(PARTS, counts)}
