"""A merged chunk trained in micro-batches whose losses add up to the chunk's.

An all-gated chunk holds up to ~4x GRPO's rows, and retries' prompts carry the reflection,
so `ERLTrainer.compute_loss` (`pipeline.erl.loss`) cuts it into micro-batches of at most
the tokens its memory budget allows (`pipeline.erl.budget`), each followed by its
backward. For the sum to be the loss of one batch, every term of the base trainer's loss
must be counted once:

- the policy term and the KL term, through the advantages and `beta`, by the weight of
  the loss type's normaliser (`micro_batch_weight`);
- the entropy bonus, a mean over each call's loss tokens in both bases, through
  `entropy_coef`, by the micro-batch's share of the chunk's loss tokens;
- the MoE router loss, through `router_aux_loss_coef`, by its share of the chunk's
  attention tokens (that loss is not linear in the tokens: this weighting counts it once,
  as a token-weighted mean of the micro-batches' losses);
- the logged metrics, which each call appends: `collapse_metrics` turns the K values into
  the one a single batch logs (sums, token- or row-weighted means, min and max).

All weights reach the loss through attributes the base reads at call time, not through
the returned loss: Unsloth's loss functions compute their gradients in the forward and
ignore the upstream gradient in their backward.

A forward's tokens, which the budget counts, are rows x (widest prompt + widest
completion) on TRL's trainer, which pads; on Unsloth's (`packed`), which packs the rows of
a forward into one sequence, the rows' own prompt and completion tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Loss types whose normaliser is the global token count `num_items_in_batch` (a micro-batch
# needs no reweighting), per-row means (weight: share of rows) and local token means
# (weight: share of loss tokens). TRL 1.15 and Unsloth 2026.10.9 normalise alike.
GLOBAL_TOKEN_LOSSES = {"dapo", "cispo", "vespo"}
ROW_MEAN_LOSSES = {"grpo", "sapo", "dr_grpo", "luspo"}
LOCAL_TOKEN_LOSSES = {"bnpo"}


def loss_token_mask(batch: dict, pad_id: int, unsloth: bool, mask_truncated: bool) -> torch.Tensor:
    """The completion tokens the base trainer's loss counts: TRL's completion_mask, or, for
    Unsloth, the non-pad tokens (it rebuilds the mask from the ids) of rows it keeps."""
    mask = batch["completion_mask"]
    tools = batch.get("tool_mask")  # both bases leave tool results out (TRL's layout)
    if not unsloth:
        return mask if tools is None else mask * tools
    rebuilt = (batch["completion_ids"] != pad_id).to(mask.dtype)
    if mask_truncated:  # Unsloth re-applies the rows TRL emptied for truncation
        rebuilt = rebuilt * (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
    return rebuilt if tools is None else rebuilt * tools.to(mask.dtype)


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The batch restricted to `rows` (a bool mask or indices) in every per-row tensor (one
    whose first dimension is the batch's row count), wherever it lives; anything else is
    kept. Unsloth's trainer on a GPU puts tensors of its own in the batch, some on the CPU
    (seen on an H200: indexing one with the CUDA mask raised)."""
    count = batch["prompt_ids"].size(0)

    def per_row(value) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == count

    return {
        key: value[rows.to(value.device)] if per_row(value) else value
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


def forward_tokens(batch: dict, pad_id: int, packed: bool) -> int:
    """The tokens a forward of `batch` holds (see the module docstring)."""
    prompt, completion = row_extents(batch, pad_id)
    return _tokens(range(len(prompt)), prompt, completion, packed)


def completion_share(batch: dict, pad_id: int, packed: bool) -> float:
    """The completions' share of a forward's tokens (where the base computes logits)."""
    prompt, completion = row_extents(batch, pad_id)
    if packed:
        return sum(completion) / max(sum(prompt) + sum(completion), 1)
    width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
    return batch["completion_ids"].size(1) / width


def reference_tokens(batch: dict, pad_id: int, rows: int, packed: bool) -> int:
    """The tokens of one forward of `rows` rows of GRPO's own `batch`: at its width, or,
    packed, at its mean row length."""
    if not packed:
        return rows * (batch["prompt_ids"].size(1) + batch["completion_ids"].size(1))
    prompt, completion = row_extents(batch, pad_id)
    return round(rows * (sum(prompt) + sum(completion)) / max(len(prompt), 1))


def plan_micro_batches(
    batch: dict, pad_id: int, budget: int, packed: bool = False
) -> list[list[int]]:
    """Rows of each micro-batch: at most `budget` tokens (`forward_tokens`; a row over it
    goes alone).

    Rows are sorted by length first, so that retries, whose prompts carry the reflection,
    share micro-batches with each other and first attempts keep GRPO's width."""
    prompt, completion = row_extents(batch, pad_id)
    return pack(
        _longest_first(prompt, completion),
        lambda rows: _tokens(rows, prompt, completion, packed) <= budget,
    )


def plan_equal_micro_batches(batch: dict, pad_id: int, rows_each: int) -> list[list[int]]:
    """Rows sorted by length in consecutive micro-batches of `rows_each` rows (the last one
    shorter): with several processes, micro-batch i must have as many rows everywhere,
    because the loss gathers per-row metrics."""
    order = _longest_first(*row_extents(batch, pad_id))
    return [order[i : i + rows_each] for i in range(0, len(order), rows_each)]


def rows_per_micro_batch(batch: dict, pad_id: int, budget: int, packed: bool = False) -> int:
    """The most rows whose consecutive groups, sorted by length, each fit the budget; 1 if
    none does."""
    prompt, completion = row_extents(batch, pad_id)
    order = _longest_first(prompt, completion)
    for size in range(len(order), 1, -1):
        groups = [order[i : i + size] for i in range(0, len(order), size)]
        if all(_tokens(rows, prompt, completion, packed) <= budget for rows in groups):
            return size
    return 1


def _longest_first(prompt: list[int], completion: list[int]) -> list[int]:
    return sorted(range(len(prompt)), key=lambda row: prompt[row] + completion[row], reverse=True)


def _tokens(rows, prompt: list[int], completion: list[int], packed: bool) -> int:
    if packed:
        return sum(prompt[r] + completion[r] for r in rows)
    return len(rows) * (max(prompt[r] for r in rows) + max(completion[r] for r in rows))


def pack(order: list[int], fits) -> list[list[int]]:
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
    for key in ("completion_ids", "completion_mask", "tool_mask"):
        if key in part:
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


@dataclass(frozen=True)
class PartWeights:
    """How much of the chunk one micro-batch is, term by term."""

    policy: float  # policy and KL terms: through the advantages and beta
    entropy: float  # entropy bonus: share of the chunk's loss tokens
    aux: float  # MoE router loss: share of the chunk's attention tokens


def part_weights(loss_type: str, plan: list[list[int]], batch: dict, token_mask: torch.Tensor):
    """The `PartWeights` of each micro-batch of `plan` (rows of `batch`)."""
    attention = batch["prompt_mask"].sum(dim=1) + batch["completion_mask"].sum(dim=1)
    tokens, seen = token_mask.sum().clamp(min=1).item(), attention.sum().clamp(min=1).item()
    weights = []
    for rows in plan:
        index = torch.tensor(rows, device=token_mask.device)
        weights.append(
            PartWeights(
                policy=micro_batch_weight(loss_type, rows, token_mask),
                entropy=token_mask[index].sum().item() / tokens,
                aux=attention[index.to(attention.device)].sum().item() / seen,
            )
        )
    return weights


# How the K values a metric got from K micro-batches become the chunk's one value. Every
# other metric is a mean over loss tokens (entropy, kl, clip ratios, sampling/*).
SUM_METRICS = {"policy_loss"}  # each micro-batch's value is already weighted, like its loss
ROW_METRICS = {"vespo/phi_seq_mean"}  # TRL: one value per sequence
UNSLOTH_ROW_METRICS = {"completion_length", "kl"}  # Unsloth: means over rows
# Unsloth: min and max over processes of each process's token mean (TRL's are over rows).
UNSLOTH_MEAN_METRICS = {"clip_ratio/low_min", "clip_ratio/high_max"}


def collapse_metrics(
    metrics: dict[str, list[float]],
    before: dict[str, int],
    parts: Sequence[PartWeights],
    tokens: Sequence[float],
    rows: Sequence[float],
    *,
    unsloth: bool,
    sequence_level: bool,
) -> None:
    """Replace, for every metric that got one value per micro-batch since `before` (its
    length then), those values by the one a single batch would have logged. `tokens` and
    `rows`: each micro-batch's loss tokens and rows over every process."""
    row_metrics = UNSLOTH_ROW_METRICS if unsloth else ROW_METRICS
    for key, values in metrics.items():
        start = before.get(key, 0)
        new = values[start:]
        if len(new) != len(parts):
            continue
        if key in SUM_METRICS:
            value = _nan_reduce(sum, new)
        elif unsloth and key in UNSLOTH_MEAN_METRICS:
            value = _weighted_mean(new, tokens)
        elif key.endswith("min"):
            value = _nan_reduce(min, new)
        elif key.endswith("max"):
            value = _nan_reduce(max, new)
        elif key == "aux_loss":
            value = _weighted_mean(new, [p.aux for p in parts])
        elif key in row_metrics or (sequence_level and key.startswith(("clip_ratio/", "cispo"))):
            value = _weighted_mean(new, rows)
        else:
            value = _weighted_mean(new, tokens)
        del values[start:]
        values.append(value)


def _nan_reduce(reduce: Callable, values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return reduce(kept) if kept else math.nan


def _weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights) if not math.isnan(v) and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else math.nan
