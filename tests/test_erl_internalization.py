"""Internalization rows have exactly the gradient of weighted token-level cross-entropy.

Runs on both bases: tests/test_unsloth_trainer.py runs it again under Unsloth's loss."""

from __future__ import annotations

import pytest
import torch
from conftest import alternating_reward, first_generation_batch
from test_erl_bases import BASE_PINS, GRADIENT_TOLERANCE, load_model, relative_error

from pipeline import ERLTrainer
from pipeline.erl.micro_batches import select_rows


@pytest.mark.parametrize("coef", [0.7, 2.5])
def test_internalization_gradient_equals_weighted_cross_entropy(
    tiny_model_dir, arithmetic_dataset, erl_args, coef
):
    reward, _ = alternating_reward()  # y1 fails, every retry succeeds -> every row internalized
    args = erl_args(reward_threshold=0.5, internalization_coef=coef, **BASE_PINS)
    trainer = ERLTrainer(
        model=load_model(tiny_model_dir),
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
    )
    model = trainer.model
    batch, out = first_generation_batch(trainer)

    # The internalization rows: advantage == coef (retry advantages are 0 here: every
    # retry of a prompt scored the same), original prompt -> y2.
    rows = torch.isclose(out["advantages"], torch.tensor(coef)) & (
        out["completion_mask"].sum(1) > 0
    )
    assert rows.sum().item() == len(batch)
    # Scalars (num_items_in_batch: the same normalisation as the RL tokens) are kept.
    restricted = select_rows(out, rows)

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    model.zero_grad()
    trainer.compute_loss(model, restricted).backward()
    erl_grads = {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }

    # Token-level cross-entropy of (prompt -> y2), normalised by the batch's token count.
    model.zero_grad()
    input_ids = torch.cat([restricted["prompt_ids"], restricted["completion_ids"]], dim=1)
    attention = torch.cat([restricted["prompt_mask"], restricted["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention).logits
    width = restricted["completion_ids"].size(1)
    log_probs = logits[:, -width - 1 : -1].float().log_softmax(-1)
    token_logps = log_probs.gather(-1, restricted["completion_ids"].unsqueeze(-1)).squeeze(-1)
    cross_entropy = -(token_logps * restricted["completion_mask"]).sum() / out["num_items_in_batch"]
    (coef * cross_entropy).backward()

    assert erl_grads and any(g.abs().sum() > 0 for g in erl_grads.values())
    errors = {
        name: relative_error(erl_grads[name], p.grad)
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    print("relative gradient error, max:", max(errors.values()))
    assert max(errors.values()) < GRADIENT_TOLERANCE, errors
