"""pipeline.erl.budget: the memory budget planned from measured loss forwards."""

from __future__ import annotations

import pytest
import torch
from conftest import length_reward

from pipeline.erl.budget import (
    CALIBRATION_CHUNKS,
    LossCost,
    MemoryModel,
    StepBudget,
)

ESTIMATE = MemoryModel(activation=100.0, cache=10.0, layer=20.0, logits=1000.0)


def one_process(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def test_loss_cost_fits_growth_with_the_forward_and_inverts():
    """A forward holding T x (1000 + 2 T) bytes (attention over a packed sequence) is fitted
    exactly; one proportional to its tokens, plus a fixed cost that weighs on small
    forwards, gets no growth."""
    grown = LossCost.fit([(t, t * (1000 + 2 * t), 0.1) for t in (200, 500, 900, 1300)])
    assert grown.per_token == pytest.approx(1000) and grown.growth == pytest.approx(2)
    assert grown.tokens_within(grown.bytes(1234)) == pytest.approx(1234)
    flat = LossCost.fit([(t, 50_000 + 1000 * t, 0.1) for t in (100, 400, 800, 1600)])
    assert flat.growth == 0 and flat.tokens_within(2 * flat.bytes(800)) == pytest.approx(1600)


def test_before_any_measurement_the_plan_stays_within_grpos_forward():
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 880
    assert budget.calibrating and budget.loss_tokens() == 880
    assert budget.generation_bytes() == 1.5 * 880 * 100.0  # the estimate of GRPO's forward
    tiny = StepBudget(0.01, ESTIMATE, "cpu")
    tiny.reference_tokens = 880
    assert tiny.loss_tokens() == 8


def chunk(budget, forwards, gather=one_process, held=0):
    """A chunk whose loss forwards allocate `tokens x per_token` bytes each; `held` bytes
    stay allocated from the first forward on, as the gradients of a backward do."""
    kept = []
    with budget.chunk(gather):
        for tokens, per_token in forwards:
            with budget.loss_forward(tokens):
                activations = torch.empty(tokens * per_token, dtype=torch.uint8)
            if held and not kept:
                kept.append(torch.empty(held, dtype=torch.uint8))
            del activations


def test_measured_forwards_set_the_plan_then_measuring_stops():
    """Forwards proportional to their tokens give factor x GRPO's tokens, less what the
    chunk already holds when a later forward starts; after CALIBRATION_CHUNKS chunks
    nothing more is measured."""
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 800
    chunk(budget, [(800, 1000), (400, 1000), (600, 1000)], held=60_000)
    assert budget.cost.per_token == pytest.approx(1000) and budget.cost.growth == 0
    assert budget.held == 60_000
    assert budget.loss_tokens() == 1200 - 60
    assert budget.generation_bytes() == pytest.approx(1.5 * 800 * 1000)
    for _ in range(CALIBRATION_CHUNKS - 1):
        chunk(budget, [(800, 3000)])
    assert not budget.calibrating
    fitted = budget.cost
    chunk(budget, [(800, 9000)])  # no longer measured
    assert budget.cost == fitted


def test_gradients_larger_than_grpos_forward_set_the_reference():
    """GRPO's step holds at least the gradients its backward leaves: when they outweigh its
    forward, a micro-batch may add the factor's excess over them."""
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 100
    chunk(budget, [(100, 1000), (50, 1000)], held=400_000)  # forward 100 KB, gradients 400 KB
    assert budget.loss_tokens() == 200  # (1.5 - 1) x 400 KB at 1000 bytes a token


def test_a_packed_forward_that_grows_faster_than_its_tokens_gets_fewer_tokens():
    """Unsloth's packed layout: the growth is fitted. TRL's padded rows: the same samples
    fit none (no tensor of a padded forward spans more than one row)."""
    budget = StepBudget(1.5, ESTIMATE, "cpu", packed=True)
    budget.reference_tokens = 500
    for _ in range(CALIBRATION_CHUNKS):
        chunk(budget, [(t, 1000 + 2 * t) for t in (200, 400, 500)])
    assert budget.cost.growth == pytest.approx(2)
    padded = StepBudget(1.5, ESTIMATE, "cpu")
    chunk(padded, [(t, 1000 + 2 * t) for t in (200, 400, 500)])
    assert padded.cost.growth == 0
    limit = 1.5 * 500 * (1000 + 2 * 500)
    tokens = budget.loss_tokens()
    assert tokens < 1.5 * 500
    assert tokens * (1000 + 2 * tokens) <= limit < (tokens + 2) * (1000 + 2 * (tokens + 2))


def test_while_calibrating_a_packed_plan_never_outgrows_a_square_cost():
    """A first chunk of alike forwards (tokens within 10%) hides the growth; the second
    chunk's plan still stays within the factor under the true cost T x (1000 + 2 T)."""

    def cost(tokens):
        return tokens * (1000 + 2 * tokens)

    budget = StepBudget(1.5, ESTIMATE, "cpu", packed=True)
    budget.reference_tokens = 880
    chunk(budget, [(t, 1000 + 2 * t) for t in (800, 820, 840)])
    assert budget.calibrating and budget.cost.growth == 0  # the fit alone would overshoot
    tokens = budget.loss_tokens()
    assert budget.cost.tokens_within(1.5 * budget.cost.bytes(880)) > tokens
    assert cost(tokens) <= 1.5 * cost(880)
    assert tokens == int(840 * (1.5 * budget.cost.bytes(880) / cost(840)) ** 0.5)


def test_an_unmeasured_budget_plans_within_grpos_forward():
    """`measure=False` (a CPU under Unsloth's compiled loss): nothing is measured, and a
    micro-batch holds GRPO's own forward's tokens."""
    budget = StepBudget(1.5, ESTIMATE, "cpu", measure=False)
    budget.reference_tokens = 880
    assert not budget.calibrating
    chunk(budget, [(800, 3000)])
    assert budget.cost is None and budget.loss_tokens() == 880


def test_every_process_plans_from_the_pooled_samples():
    """`gather` pools the processes' samples: here the other process's forwards held
    twice the bytes, and the plan follows the mean of both."""
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 800

    def two_processes(tensor):
        other = tensor.clone()
        if other.dim() == 2:  # the loss samples: (tokens, bytes, share, held)
            other[:, 1] *= 2
        return torch.cat([tensor, other])

    chunk(budget, [(800, 1000), (400, 1000)], gather=two_processes)
    assert budget.cost.per_token == pytest.approx(1500)


def test_generate_calls_scale_the_estimate_by_the_largest_measured_ratio():
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 800
    estimate = ESTIMATE.generate_call(2, 10, 5)
    with budget.generate_call(2, 10, 5):
        held = torch.empty(int(3 * estimate), dtype=torch.uint8)
    del held
    with budget.generate_call(1, 10, 5):
        pass
    chunk(budget, [(800, 1000)])
    assert budget.generate_scale == pytest.approx(3.0, rel=1e-3)
    plan = budget.plan_generation([10] * 40, 5)
    scaled = ESTIMATE.scaled(budget.generate_scale)
    assert all(scaled.generate_call(len(rows), 10, 5) <= budget.generation_bytes() for rows in plan)

    # Calls that hold less than estimated lower it, to the largest ratio measured so far.
    budget = StepBudget(1.5, ESTIMATE, "cpu")
    budget.reference_tokens = 800
    scales = []
    for share in (0.5, 0.7, 0.6)[:CALIBRATION_CHUNKS]:
        with budget.generate_call(2, 10, 5):
            held = torch.empty(int(share * estimate), dtype=torch.uint8)
        del held
        chunk(budget, [(800, 1000)])
        scales.append(budget.generate_scale)
    assert scales == pytest.approx([0.5, 0.7, 0.7][:CALIBRATION_CHUNKS], rel=1e-3)


def test_a_gated_run_calibrates_its_budget_on_its_first_chunks(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """Training the default step measures the backend's loss forwards on the first merged
    chunks and plans from them: on TRL's trainer (padded rows) the bytes are proportional
    to the tokens, and a later micro-batch starts on the gradients the earlier ones left."""
    from pipeline import ERLTrainer

    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=2.0, max_steps=CALIBRATION_CHUNKS + 1),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    trainer.train()
    budget = trainer.budget
    assert not budget.calibrating and len(budget._pooled) > CALIBRATION_CHUNKS
    assert budget.cost.per_token > 0 and budget.cost.growth == 0
    gradients = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert budget.held >= gradients
    limit = 1.5 * budget.cost.bytes(budget.reference_tokens) - budget.held
    assert budget.loss_tokens() == int(limit / budget.cost.per_token)
