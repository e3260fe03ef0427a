"""`top_entropy_quantile < 1` on a micro-batched chunk, on whichever base this process has
(tests/test_unsloth_trainer.py runs it again on Unsloth's generated trainer).

The base trains only the loss tokens whose entropy reaches the quantile of its call's
tokens. ERLTrainer trains a merged chunk in several calls, so it takes the quantile over the
whole chunk first (pipeline/erl/loss.py): the micro-batched chunk then trains as the chunk
in one forward does.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import test_erl_bases
from test_erl_bases import (
    GRADIENT_TOLERANCE,
    all_gated_chunk,
    micro_batch_harness,
    relative_error,
)

import pipeline.erl.loss as erl_loss

make_args = test_erl_bases.make_args  # the fixture the test takes


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo"])
def test_entropy_quantile_over_the_chunk_gives_the_one_forward_result(
    tiny_model_dir, arithmetic_dataset, make_args, monkeypatch, loss_type
):
    """Loss, gradient and logged metrics of the micro-batched chunk equal those of the chunk
    in one forward (where the base takes the quantile itself), with the entropy bonus on the
    same tokens; with the quantile taken per micro-batch instead, the gradient differs."""
    trainer, _, merged = all_gated_chunk(
        tiny_model_dir,
        arithmetic_dataset,
        make_args,
        top_entropy_quantile=0.5,
        entropy_coef=0.3,
        loss_type=loss_type,
    )
    step = micro_batch_harness(trainer, merged, monkeypatch)
    width = merged["prompt_ids"].size(1) + merged["completion_ids"].size(1)
    tokens = 4 * width // 3  # several forwards
    micro_loss, micro, micro_logged, seen = step(tokens)
    assert len(seen) > 2, seen
    whole_loss, whole, whole_logged, seen = step(10**9)
    assert len(seen) == 1
    assert micro_loss.item() == pytest.approx(whole_loss.item(), rel=1e-4, abs=1e-7)
    errors = {name: relative_error(micro[name], g) for name, g in whole.items()}
    assert max(errors.values()) < GRADIENT_TOLERANCE, errors
    assert micro_logged.keys() == whole_logged.keys()
    for key, values in whole_logged.items():
        assert micro_logged[key] == pytest.approx(values, rel=1e-4, abs=1e-6, nan_ok=True), key

    # What the chunk's threshold fixes: each micro-batch's own quantile trains other tokens.
    monkeypatch.setattr(erl_loss, "_entropy_threshold", lambda trainer, threshold: nullcontext())
    _, per_call, _, _ = step(tokens)
    errors = {name: relative_error(per_call[name], g) for name, g in whole.items()}
    assert max(errors.values()) > 100 * GRADIENT_TOLERANCE, errors
