"""`loss_normalization="per_part"`: each part of the merged batch weighs as if trained alone.

The merged batch's DAPO loss divides by all its tokens, so with "merged" the first attempts'
GRPO signal shrinks by their share of the tokens. "per_part" must give exactly the gradient
of GRPO's loss on the first attempts + the retry rows' loss over their own tokens +
internalization_coef x the mean token cross-entropy of the internalization rows.
tests/test_unsloth_trainer.py runs this module again on Unsloth's trainer.
"""

from __future__ import annotations

import pytest
import torch
from conftest import first_generation_batch, length_reward
from test_erl_bases import BASE_PINS, GRADIENT_TOLERANCE, load_model, relative_error

from pipeline import ERLTrainer
from pipeline.erl.batch import INERT_KEY

COEF = 1.5


def _gradient(model, loss_fn) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss_fn().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rows(batch: dict, rows: torch.Tensor, num_items: torch.Tensor) -> dict:
    """A plain GRPO batch of `rows`, normalised by `num_items` tokens."""
    out = {
        k: v[rows]
        for k, v in batch.items()
        if isinstance(v, torch.Tensor) and v.dim() > 0 and k != INERT_KEY
    }
    out["num_items_in_batch"] = num_items
    return out


def _gated_trainer(tiny_model_dir, dataset, erl_args, **overrides) -> ERLTrainer:
    """length_reward varies between completions: y1 and retries both get nonzero
    advantages, some retries reach 0.5 (internalized), some do not. Memory off: two passes
    over one batch see the same reflection prompts."""
    args = erl_args(
        reward_threshold=0.5,
        internalization_coef=COEF,
        enable_memory=False,
        **BASE_PINS,
        **overrides,
    )
    trainer = ERLTrainer(
        model=load_model(tiny_model_dir),
        args=args,
        train_dataset=dataset,
        reward_funcs=length_reward,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    return trainer


def _parts(trainer, merged: dict, first: int) -> tuple[torch.Tensor, int]:
    """Which rows are which, and how many rows were gated: GRPO's `first` rows come first,
    then reflections and retries (one each per gated row), then internalization (0 first
    attempts, 1 reflections and retries, 2 internalization, 3 filler)."""
    gated = round(first_metric(trainer, "erl/gated_fraction") * first)
    internalized = int(first_metric(trainer, "erl/internalization_rows"))
    assert 0 < gated < first and internalized > 0, (gated, internalized)
    part = torch.zeros(merged["prompt_ids"].size(0), dtype=torch.long)
    part[first : first + 2 * gated] = 1
    part[first + 2 * gated : first + 2 * gated + internalized] = 2
    part[first + 2 * gated + internalized :] = 3
    return part, gated


def test_per_part_gradient_is_the_sum_of_separately_normalised_losses(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    trainer = _gated_trainer(
        tiny_model_dir, arithmetic_dataset, erl_args, loss_normalization="merged"
    )
    model = trainer.model
    batch, _ = first_generation_batch(trainer)
    torch.manual_seed(123)
    merged = trainer._generate_and_score_completions(batch)  # raw advantages
    trainer.args.loss_normalization = "per_part"
    torch.manual_seed(123)
    per_part = trainer._generate_and_score_completions(batch)
    assert torch.equal(merged["completion_ids"], per_part["completion_ids"]), "not the same rows"
    part, _ = _parts(trainer, merged, first=len(batch))
    assert not merged[INERT_KEY][part < 3].any()
    mask = merged["completion_mask"]
    tokens = [mask[part == k].sum() for k in range(3)]
    assert all(t > 0 for t in tokens)
    assert merged["advantages"][part == 0].abs().sum() > 0
    assert merged["advantages"][part == 1].abs().sum() > 0, "retries all scored alike"
    assert torch.allclose(merged["advantages"][part == 2], torch.tensor(COEF))

    # The first attempts keep exactly the normaliser GRPO gave them.
    got = _gradient(model, lambda: trainer.compute_loss(model, per_part))

    def expected_loss():
        y1 = trainer.compute_loss(model, _rows(merged, part == 0, tokens[0]))
        retry = trainer.compute_loss(model, _rows(merged, part == 1, tokens[1]))
        # coef x token-mean cross-entropy of (original prompt -> y2), written out.
        rows = _rows(merged, part == 2, tokens[2])
        ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
        attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
        logits = model(input_ids=ids, attention_mask=attention).logits
        width = rows["completion_ids"].size(1)
        logps = logits[:, -width - 1 : -1].float().log_softmax(-1)
        token_logps = logps.gather(-1, rows["completion_ids"].unsqueeze(-1)).squeeze(-1)
        mask2 = rows["completion_mask"]
        cross_entropy = -(token_logps * mask2).sum() / mask2.sum()
        return y1 + retry + COEF * cross_entropy

    expected = _gradient(model, expected_loss)
    assert got.keys() == expected.keys() and got
    errors = {name: relative_error(got[name], expected[name]) for name in expected}
    print("relative gradient error, max:", max(errors.values()))
    assert max(errors.values()) < GRADIENT_TOLERANCE, errors

    # And it is not what "merged" gives (the test would pass for a no-op otherwise).
    plain = _gradient(model, lambda: trainer.compute_loss(model, merged))
    assert max(relative_error(plain[k], expected[k]) for k in expected) > 0.1

    # The first attempts' own rows: GRPO's normaliser is their token count, as logged.
    assert first_metric(trainer, "erl/tokens_first") == tokens[0].item()


def first_metric(trainer, name: str) -> float:
    return trainer._metrics["train"][name][-1]


def test_per_part_gate_closed_trains_exactly_like_grpo(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """No gated row, no part to weigh: the same parameters as GRPOTrainer after 3 steps."""
    from trl import GRPOConfig, GRPOTrainer

    def run(trainer):
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    base = run(
        GRPOTrainer(
            model=load_model(tiny_model_dir),
            args=erl_args(GRPOConfig, max_steps=3, **BASE_PINS),
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
        )
    )
    erl = run(
        ERLTrainer(
            model=load_model(tiny_model_dir),
            args=erl_args(
                reward_threshold=-1.0, loss_normalization="per_part", max_steps=3, **BASE_PINS
            ),
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
        )
    )
    for name in base:
        assert torch.equal(base[name], erl[name]), name


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "sapo", "luspo", "vespo"])
def test_per_part_refuses_losses_not_normalised_by_the_token_count(erl_args, loss_type):
    with pytest.raises(ValueError, match=f"loss_type='{loss_type}'"):
        erl_args(loss_normalization="per_part", loss_type=loss_type)


def test_loss_normalization_and_memory_scope_are_checked(erl_args):
    with pytest.raises(ValueError, match="loss_normalization"):
        erl_args(loss_normalization="tokens")
    with pytest.raises(ValueError, match="memory_scope"):
        erl_args(memory_scope="nearest")
    assert erl_args(loss_normalization="per_part", loss_type="cispo").loss_type == "cispo"


def test_untrained_retries_leave_grpos_loss_on_the_first_attempts(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """`train_retries=False`: reflections and retries are generated (they feed the memory
    and internalization) but stay inert, so the loss is GRPO's on the first attempts,
    normalised by their own tokens, plus internalization."""
    trainer = _gated_trainer(tiny_model_dir, arithmetic_dataset, erl_args, train_retries=False)
    model = trainer.model
    batch, _ = first_generation_batch(trainer)
    merged = trainer._generate_and_score_completions(batch)
    first = len(batch)
    part, gated = _parts(trainer, merged, first)
    assert merged[INERT_KEY][part == 1].all() and not merged[INERT_KEY][part == 2].any()
    mask = merged["completion_mask"]
    assert mask[part == 1].sum() == 0 and mask[part == 2].sum() > 0

    got = _gradient(model, lambda: trainer.compute_loss(model, merged))
    y1_and_internalization = (part == 0) | (part == 2)
    expected = _gradient(
        model,
        lambda: trainer.compute_loss(
            model, _rows(merged, y1_and_internalization, mask[y1_and_internalization].sum())
        ),
    )
    errors = {name: relative_error(got[name], expected[name]) for name in expected}
    assert got.keys() == expected.keys() and max(errors.values()) < GRADIENT_TOLERANCE, errors
    # Trained (the default), reflections and retries bring their tokens into the loss.
    trainer.args.train_retries = True
    torch.manual_seed(0)
    trained = trainer._generate_and_score_completions(batch)
    assert trained["completion_mask"][first : first + 2 * gated].sum() > 0
