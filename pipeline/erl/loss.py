"""ERLTrainer's loss on a merged chunk.

`merged_chunk_loss` is `ERLTrainer.compute_loss` for a chunk that holds ERL's rows: the
base trainer's own loss, leaving out inert rows, in micro-batches of at most the tokens the
memory budget allows (`pipeline.erl.budget`), each followed by its backward, every term
counted once for the chunk (`pipeline.erl.micro_batches`).

The hand copies of upstream code it relies on live in `pipeline.erl.upstream`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace

import torch

from pipeline.erl.budget import StepBudget
from pipeline.erl.micro_batches import (
    ROW_MEAN_LOSSES,
    PartWeights,
    collapse_metrics,
    completion_share,
    forward_tokens,
    loss_token_mask,
    micro_batch,
    part_weights,
    plan_equal_micro_batches,
    plan_micro_batches,
    rows_per_micro_batch,
    select_rows,
)
from pipeline.erl.upstream import (
    adaptive_entropy_step,
    entropy_quantile,
    high_entropy_mask,
    returned_loss_scale,
)
from pipeline.models.backend import unsloth_trainer_active

BaseLoss = Callable[..., torch.Tensor]
"""The base trainer's `compute_loss(model, inputs, return_outputs, num_items_in_batch)`."""


def merged_chunk_loss(
    trainer,
    base_loss: BaseLoss,
    model,
    inputs: dict,
    inert: torch.Tensor,
    budget: StepBudget,
    return_outputs: bool = False,
    num_items_in_batch=None,
) -> torch.Tensor:
    """The loss of a merged chunk (`inert`: its rows that carry no signal), as the base
    would compute it in one forward, trained in micro-batches.

    Every term of the base's loss is counted once for the chunk: policy and KL through the
    advantages and beta, the entropy bonus through entropy_coef, the MoE router loss
    through its coefficient; the adaptive entropy controller steps once per optimizer step,
    `top_entropy_quantile` is taken over the whole chunk, and the logged metrics get one
    value per chunk."""
    accelerator = trainer.accelerator
    # Several processes keep their inert rows (masked, pad-only): every process must pass
    # the same number of rows through the loss, whose metric gathers are collective.
    if not inert.all() and accelerator.num_processes == 1:
        inputs = select_rows(inputs, ~inert)  # an all-inert chunk has a zero loss as it is
    scale = _inert_rows_scale(trainer, inert)
    pad_id = trainer._tokenizer.pad_token_id
    unsloth = unsloth_trainer_active()  # Unsloth's trainer packs a forward's rows
    plan = _plan(accelerator, inputs, pad_id, budget.loss_tokens(), unsloth, inert.device)
    if len(plan) == 1:  # one forward: the base's loss as it is
        with (
            budget.chunk(accelerator.gather),
            budget.loss_forward(*_size(inputs, pad_id, unsloth)),
        ):
            loss = base_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss if scale == 1.0 else loss * scale

    token_mask = loss_token_mask(
        inputs, pad_id, unsloth=unsloth, mask_truncated=bool(trainer.mask_truncated_completions)
    )
    weights = part_weights(trainer.args.loss_type, plan, inputs, token_mask)
    weights = [replace(w, policy=w.policy * scale) for w in weights]
    parts = [
        micro_batch(inputs, rows, pad_id, unsloth, trainer.pad_to_multiple_of) for rows in plan
    ]
    # Each micro-batch's loss tokens and rows over every process, for the metric means.
    counts = torch.tensor(
        [[float(token_mask[rows].sum()), float(len(rows))] for rows in plan],
        device=token_mask.device,
    )
    counts = accelerator.reduce(counts, reduction="sum")
    mode = "train" if trainer.model.training else "eval"
    metrics = trainer._metrics[mode]
    # No base call (and no backward of ERL's) runs at the accumulation boundary: TRL's
    # adaptive entropy controller would step once per call there (it steps once below),
    # and under DeepSpeed a backward there steps the optimizer.
    sync, accelerator.sync_gradients = accelerator.sync_gradients, False
    try:
        with budget.chunk(accelerator.gather):
            threshold = None
            if trainer.top_entropy_quantile < 1.0:
                threshold, weights = _chunk_entropy_threshold(
                    trainer, base_loss, model, parts, weights, metrics
                )
            before = {key: len(values) for key, values in metrics.items()}
            with _entropy_threshold(trainer, threshold):
                loss, done = _train_parts(
                    trainer, base_loss, model, parts, weights, budget, return_outputs,
                    num_items_in_batch,
                )  # fmt: skip
    finally:
        accelerator.sync_gradients = sync
    _chunk_metrics(trainer, metrics, before, weights, counts, sync and mode == "train")
    return loss + done


def _inert_rows_scale(trainer, inert: torch.Tensor) -> float:
    """The factor on the policy loss that gives each real row, under several processes, the
    weight one process gives it. TRL's row-mean losses (grpo, sapo, dr_grpo, luspo) divide
    by the chunk's row count, which there includes the inert rows each process keeps, and
    DDP then averages the processes: every real row weighed 1/(rows, inert included), a
    scale that differs from chunk to chunk and from one process (Adam mostly undoes it;
    SGD, a binding gradient clip and several chunks a step do not). Scaled by the chunk's
    rows x processes / the real rows of every process, the average is the one-process mean
    over the real rows. One process drops its inert rows; the token-normalised losses do
    not count rows: 1."""
    accelerator = trainer.accelerator
    if accelerator.num_processes == 1 or trainer.args.loss_type not in ROW_MEAN_LOSSES:
        return 1.0
    real = accelerator.gather(torch.tensor([float((~inert).sum())], device=inert.device))
    real = real.sum().item()
    return inert.numel() * accelerator.num_processes / real if real else 1.0


def _plan(accelerator, inputs, pad_id: int, tokens: int, packed: bool, device):
    """The chunk's micro-batches (row indices) within `tokens` a forward."""
    if accelerator.num_processes == 1:
        return plan_micro_batches(inputs, pad_id, tokens, packed=packed)
    # The loss's metric gathers need equal micro-batches on every process.
    size = rows_per_micro_batch(inputs, pad_id, tokens, packed=packed)
    size = accelerator.gather(torch.tensor([size], device=device)).min()
    return plan_equal_micro_batches(inputs, pad_id, int(size))


def _chunk_metrics(trainer, metrics, before, weights, counts, boundary: bool) -> None:
    """One logged value per chunk for each metric its micro-batches logged; at the optimizer
    step's `boundary` (training), the adaptive entropy step TRL takes there."""
    unsloth = unsloth_trainer_active()
    collapse_metrics(
        metrics,
        before,
        weights,
        tokens=counts[:, 0].tolist(),
        rows=counts[:, 1].tolist(),
        unsloth=unsloth,
        sequence_level=trainer.importance_sampling_level == "sequence",
    )
    # Unsloth's loss has no adaptive control and logs no entropy_coef.
    if boundary and not unsloth and trainer._entropy_bonus_enabled:
        if trainer.use_adaptive_entropy:
            adaptive_entropy_step(trainer)
        metrics["entropy_coef"].append(trainer.entropy_coef)  # TRL logs it at the boundary


def _train_parts(
    trainer, base_loss, model, parts, weights, budget, return_outputs, num_items_in_batch
):
    """Each micro-batch's weighted loss, all but the last back-propagated here (Trainer's
    training_step back-propagates what compute_loss returns): the last loss, and the sum
    of the others' (detached)."""
    accelerator, pad_id = trainer.accelerator, trainer._tokenizer.pad_token_id
    packed = unsloth_trainer_active()
    done = None
    for part, weight in zip(parts, weights):
        with budget.loss_forward(*_size(part, pad_id, packed)):
            loss = _weighted_loss(
                trainer, base_loss, model, part, weight, return_outputs, num_items_in_batch
            )
        if part is parts[-1]:
            return loss, done
        # What Trainer.training_step does with the returned loss, for the parts it never sees.
        with accelerator.no_sync(model):
            accelerator.backward(loss * returned_loss_scale(trainer, num_items_in_batch))
        done = loss.detach() if done is None else done + loss.detach()
    raise ValueError("a merged chunk needs at least one micro-batch")


def _size(batch: dict, pad_id: int, packed: bool) -> tuple[int, float]:
    """A forward's tokens and the completions' share of them, as the budget measures them."""
    return forward_tokens(batch, pad_id, packed), completion_share(batch, pad_id, packed)


def _weighted_loss(
    trainer, base_loss, model, part, weight: PartWeights, return_outputs, num_items_in_batch
):
    """The base loss of micro-batch `part`, each term weighted by its share of the chunk.

    The weights go into what the base reads at call time (advantages, beta, entropy_coef,
    router_aux_loss_coef), not onto the returned loss: Unsloth's loss functions hand
    autograd gradients computed in their forward and ignore the upstream gradient in
    their backward, so a scaled loss kept its unscaled gradient. Every supported loss
    is linear in (advantages, beta) for a positive weight: the clipped surrogate, the
    KL term and the normalisers; clipping and masks read only the advantages' sign."""
    saved = trainer.beta, trainer.entropy_coef, trainer.router_aux_loss_coef
    part = {**part, "advantages": part["advantages"] * weight.policy}
    trainer.beta = trainer.beta * weight.policy
    trainer.entropy_coef = trainer.entropy_coef * weight.entropy
    trainer.router_aux_loss_coef = trainer.router_aux_loss_coef * weight.aux
    try:
        return base_loss(model, part, return_outputs, num_items_in_batch)
    finally:
        trainer.beta, trainer.entropy_coef, trainer.router_aux_loss_coef = saved


def _chunk_entropy_threshold(trainer, base_loss, model, parts, weights, metrics):
    """The `top_entropy_quantile` threshold over every loss token of the chunk, on every
    process, as one forward of the chunk would take it, and the parts' weights with the
    entropy bonus (then a mean over the kept tokens) weighed by each part's share of them.

    The population is read from the base's own loss: each micro-batch goes through it once
    without gradients, and `get_high_entropy_mask` (ERLTrainer's) collects the entropies
    and mask it is handed, in the base's own layout (TRL's, or Unsloth's packed one). What
    those calls log, and the entropy window they add to, is put back."""
    population: list[torch.Tensor] = []
    saved_window = trainer._entropy_window_stats
    before = {key: len(values) for key, values in metrics.items()}
    state = _CHUNK_ENTROPY.set(population)
    try:
        with torch.no_grad():
            for part in parts:
                base_loss(model, part, False, None)
    finally:
        _CHUNK_ENTROPY.reset(state)
        trainer._entropy_window_stats = saved_window
        for key, values in metrics.items():
            del values[before.get(key, 0) :]
    local = torch.cat(population) if population else torch.zeros(0)
    threshold = entropy_quantile(trainer.accelerator, local, 1 - trainer.top_entropy_quantile)
    kept = [int((values >= threshold).sum()) for values in population]
    weights = [replace(w, entropy=k / max(sum(kept), 1)) for w, k in zip(weights, kept)]
    return threshold, weights


@contextmanager
def _entropy_threshold(trainer, threshold: float | None):
    """While the chunk's micro-batches train, their entropy mask uses `threshold`."""
    state = _CHUNK_ENTROPY.set(threshold)
    try:
        yield
    finally:
        _CHUNK_ENTROPY.reset(state)


# Inside a micro-batched chunk with top_entropy_quantile < 1: the list its first pass
# collects the base's entropy population in, then the chunk's threshold; else None.
_CHUNK_ENTROPY: ContextVar[list[torch.Tensor] | float | None] = ContextVar(
    "chunk_entropy", default=None
)


def chunk_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """What `get_high_entropy_mask` answers inside a micro-batched chunk (None outside)."""
    state = _CHUNK_ENTROPY.get()
    if state is None:
        return None
    if isinstance(state, list):  # the first pass: collect (its loss is thrown away)
        state.append(entropies[mask.bool()].detach().float())
        return mask.bool()
    return high_entropy_mask(entropies, mask, state)
