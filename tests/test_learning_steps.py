"""bench/learning_steps.py: the ERL steps of the learning bench's ablations (issue 48) each
change the one thing they name, driven by test_erl_step's deterministic backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_erl_step import Backend, first_attempts, ids, settings

from pipeline.erl.memory import ReflectionMemory
from pipeline.erl.step import ERLStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
steps = pytest.importorskip("learning_steps")

QUESTIONS = ["What is 1+1?", "What is 1+1?", "What is 2+2?", "What is 4+4?"]
R1 = torch.tensor([0.0, 0.5, 0.2, 1.0])


def run(step_class, **overrides):
    step = step_class(settings(**overrides), ReflectionMemory(10))
    return step(Backend(solvable={"What is 1+1?"}), first_attempts(QUESTIONS, R1), step=1).rows


def test_no_reflection_rows_keeps_the_retries_and_internalization_only():
    product, ablated = run(ERLStep), run(steps.NoReflectionRows)
    # The product: 3 reflections, 3 retries, 2 internalized; the ablation drops the first 3.
    assert len(product.advantages) == 8 and len(ablated.advantages) == 5
    assert ablated.completion_ids == product.completion_ids[3:]
    assert ablated.advantages == product.advantages[3:]


def test_loss_weighted_internalization_weighs_its_rows_against_the_whole_batch():
    """Advantage coef x all loss tokens / internalization tokens: under token-level
    normalisation the internalization rows then carry coef x their own mean CE."""
    product, ablated = run(ERLStep), run(steps.LossWeightedInternalization)
    assert ablated.advantages[:-2] == product.advantages[:-2]
    first_tokens = 4 * len(ids("guess"))
    total = first_tokens + sum(len(c) for c in product.completion_ids)
    internalized = 2 * len(ids("right"))
    assert ablated.advantages[-2:] == pytest.approx([0.7 * total / internalized] * 2)


def test_raft_internalization_copies_every_retry_with_a_positive_reward():
    class Partial(Backend):  # r2: 1.0 right, 0.4 wrong (partial credit), never 0
        def score(self, rows, prompts, completions, completion_ids, environments=None):
            return 0.4 + 0.6 * super().score(rows, prompts, completions, completion_ids)

    step = steps.RaftInternalization(settings(), ReflectionMemory(10))
    rows = step(Partial(solvable={"What is 1+1?"}), first_attempts(QUESTIONS, R1), step=1).rows
    # 3 reflections, 3 retries, then all 3 retries internalized at coef x r2.
    assert len(rows.advantages) == 9
    assert rows.advantages[6:] == pytest.approx([0.7, 0.7, 0.7 * 0.4])
    assert rows.completion_ids[6:] == [ids("right"), ids("right"), ids("wrong")]


def test_internalization_only_zeroes_every_row_but_the_internalized():
    weighted, ablated = run(steps.LossWeightedInternalization), run(steps.InternalizationOnly)
    # 3 reflections and 3 retries at advantage 0; the 2 internalized rows as weighted.
    assert ablated.completion_ids == weighted.completion_ids
    assert ablated.advantages[:6] == [0.0] * 6
    assert ablated.advantages[6:] == weighted.advantages[6:] and weighted.advantages[6] > 0
