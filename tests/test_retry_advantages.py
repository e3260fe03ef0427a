"""`retry_advantage`: how reflection and retry rows are credited (a pure function + config)."""

from __future__ import annotations

import pytest
import torch

from pipeline import ERLConfig
from pipeline.erl.step import retry_advantages


def test_improvement_credits_retries_that_all_succeed():
    """Two retries of one prompt that both fix a wrong answer: 'group' gives them 0 (no
    spread to normalise), 'improvement' gives each its gain over the first attempt."""
    r1, r2 = torch.tensor([0.0, -0.5, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    groups, valid = ["a", "a", "b"], [True, True, True]
    assert retry_advantages(groups, r1, r2, valid, scale=True) == [0.0, 0.0, 0.0]
    improvement = retry_advantages(groups, r1, r2, valid, scale=True, mode="improvement")
    assert improvement == pytest.approx([1.0, 1.5, 0.0])
    # Filler rows still carry nothing.
    assert retry_advantages(["a"], r1[:1], r2[:1], [False], scale=True, mode="improvement") == [0.0]


def test_retry_advantage_is_validated():
    ERLConfig(output_dir="unused", use_cpu=True, bf16=False, retry_advantage="improvement")
    with pytest.raises(ValueError, match="retry_advantage must be one of"):
        ERLConfig(output_dir="unused", use_cpu=True, bf16=False, retry_advantage="zscore")
