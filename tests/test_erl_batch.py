"""pipeline.erl.batch: ERL's rows in the base trainer's layout (TRL's here; Unsloth's in
tests/test_erl_bases.py, run on its trainer by tests/test_unsloth_trainer.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import length_reward

from pipeline import ERLTrainer
from pipeline.erl.batch import INERT_KEY, NewRows, cat_padded, completion_layout
from pipeline.erl.upstream import importance_sampling_ratio


def test_cat_padded_keeps_pad_to_multiple_of_when_new_rows_are_wider():
    a = torch.ones(2, 8, dtype=torch.long)  # GRPO's batch, padded to a multiple of 8
    b = torch.full((1, 11), 2, dtype=torch.long)
    merged = cat_padded(a, b, 0, "right", multiple=8)
    assert merged.shape == (3, 16) and merged[0, 8:].sum() == 0 and merged[2, 11:].sum() == 0
    assert cat_padded(a, b, 0, "left").shape == (3, 11)
    assert cat_padded(a, b, 0, "left", multiple=8)[2, :5].tolist() == [0] * 5


def test_completion_layout_undoes_unsloths_packed_layout():
    """Packed: width C + M, token j of a row with left padding p in column M - p + j."""
    prompt_mask = torch.tensor([[0, 0, 1], [1, 1, 1], [0, 1, 1]])
    trl = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    m = 2
    packed = torch.zeros(3, 2 + m)
    for row, p in enumerate((2, 0, 1)):
        packed[row, m - p : m - p + 2] = trl[row]
    assert torch.equal(completion_layout(packed, prompt_mask, 2), trl)
    assert completion_layout(trl, prompt_mask, 2) is trl


def test_importance_sampling_ratio_follows_trls_modes():
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    sampling = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    token = importance_sampling_ratio(old, sampling, mask, "token_truncate", None, 2.0)
    torch.testing.assert_close(token, torch.tensor([[1.6487, 0.3679, 1.0]]), atol=1e-4, rtol=0)
    sequence = importance_sampling_ratio(old, sampling, mask, "sequence_mask", None, 3.0)
    torch.testing.assert_close(sequence, torch.exp(torch.tensor([[-0.5]])))
    masked = importance_sampling_ratio(old, sampling, mask, "token_mask", 0.5, 1.5)
    assert masked.tolist()[0][:2] == [0.0, 0.0]


def test_merge_rows_pads_to_split_and_keeps_optional_tensors(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """Optional per-token tensors get rows exactly when GRPO's batch has them; the row
    count becomes a multiple of steps_per_generation with inert pad-only rows; reported
    sampling log-probs are kept and give the importance ratio TRL would compute."""
    args = erl_args(steps_per_generation=4, beta=0.1)
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    b, p, c = 8, 5, 3
    output = {
        "prompt_ids": torch.ones(b, p, dtype=torch.long),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.ones(b, c, dtype=torch.long),
        "completion_mask": torch.ones(b, c, dtype=torch.long),
        "advantages": torch.zeros(b),
        "num_items_in_batch": torch.tensor(b * c),
        "ref_per_token_logps": torch.zeros(b, c),
        "old_per_token_logps": torch.zeros(b, c),
        "sampling_per_token_logps": torch.full((b, c), -0.25),
        "importance_sampling_ratio": torch.full((b, 1), 0.5),
    }
    reported = [-1.0, -2.0, None, -1.0, -1.0]  # vLLM's log-probs for row 8 (None: unavailable)
    rows = NewRows(
        [[5, 6], [7]],
        [[8, 9, 10, 11, 12], [13]],
        [0.5, -0.5],
        [True, True],
        [True, True],
        [reported, None],
    )
    merged = trainer._merge_rows(output, rows)
    pad_id = trainer._tokenizer.pad_token_id
    assert set(merged) == {*output, INERT_KEY}  # the token budget stays on the trainer
    assert merged["prompt_ids"].size(0) == 12  # 8 + 2 real + 2 filler, a multiple of 4
    assert merged["completion_ids"].shape == (12, 5)
    assert merged[INERT_KEY].tolist() == [False] * 10 + [True] * 2
    # Old/reference log-probs are recomputed over the merged batch with the policy's scorer.
    logps = trainer._logps(trainer.model, merged)
    torch.testing.assert_close(merged["old_per_token_logps"], logps)
    assert merged["ref_per_token_logps"].shape == (12, 5)
    # GRPO's rows keep their sampling log-probs; row 8 keeps vLLM's, row 9 (none reported)
    # gets the current ones.
    sampling = merged["sampling_per_token_logps"]
    assert torch.equal(sampling[:b, :c], torch.full((b, c), -0.25))
    assert sampling[8, [0, 1, 3, 4]].tolist() == [-1.0, -2.0, -1.0, -1.0]
    assert torch.isnan(sampling[8, 2])
    torch.testing.assert_close(sampling[9, :1], logps[9, :1])
    # New rows' importance ratio is TRL's (sequence_mask by default) from old vs sampling.
    ratio = merged["importance_sampling_ratio"].squeeze(1)
    assert ratio[:b].tolist() == [0.5] * b
    diff = (logps[8] - sampling[8]).nan_to_num(0.0).sum()
    expected = torch.exp(diff) if torch.exp(diff) <= args.vllm_importance_sampling_clip_max else 0
    torch.testing.assert_close(ratio[8], torch.as_tensor(expected, dtype=ratio.dtype))
    torch.testing.assert_close(ratio[9], torch.tensor(1.0))
    # Filler rows: a pad-only completion under a zero mask.
    assert merged["completion_mask"][10:].sum() == 0
    assert (merged["completion_ids"][10:] == pad_id).all()
    assert merged["completion_mask"][8].tolist() == [1, 1, 1, 1, 1]
    assert merged["completion_mask"][9].tolist() == [1, 0, 0, 0, 0]
    assert merged["prompt_ids"][9].tolist() == [pad_id] * 4 + [7]
    assert merged["advantages"][8:].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert merged["num_items_in_batch"].item() == b * c + 6


def test_tool_masks_join_the_batch_and_leave_tool_results_out_of_the_item_count():
    """An episode's rows carry TRL's tool_mask (0 over tool results, padded with 1 as TRL
    pads it); rows without one get ones; num_items_in_batch counts the model's tokens."""
    from pipeline.erl.batch import loss_mask, merge_rows, pad_rows

    rows = NewRows(
        [[1], [2]],
        [[5, 6, 7, 8], [9]],
        [1.0, -1.0],
        [True, True],
        [True, True],
        tool_masks=[[1, 0, 0, 1], None],
    )
    batch = pad_rows(rows, 0, "cpu")
    assert batch["tool_mask"].tolist() == [[1, 0, 0, 1], [1, 1, 1, 1]]
    assert loss_mask(batch).tolist() == [[1, 0, 0, 1], [1, 0, 0, 0]]
    assert "tool_mask" not in pad_rows(NewRows([[1]], [[5]], [0.0], [True], [True]), 0, "cpu")

    output = {  # GRPO's batch of two episodes, the second with a tool result
        "prompt_ids": torch.ones(2, 1, dtype=torch.long),
        "prompt_mask": torch.ones(2, 1, dtype=torch.long),
        "completion_ids": torch.ones(2, 3, dtype=torch.long),
        "completion_mask": torch.ones(2, 3, dtype=torch.long),
        "tool_mask": torch.tensor([[1, 1, 1], [1, 0, 1]]),
        "advantages": torch.zeros(2),
        "num_items_in_batch": torch.tensor(5),
    }
    merged = merge_rows(
        output, rows, pad_id=0, multiple=None, steps_per_generation=1, gather=lambda t: t,
        logps=None, ref_logps=None, importance_sampling=("token_truncate", None, None),
    )  # fmt: skip
    assert merged["tool_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1]]
    assert merged["num_items_in_batch"].item() == 3 + 2 + 2 + 1
    with pytest.raises(ValueError, match="a tool mask of 2 tokens for a 4-token completion"):
        pad_rows(
            NewRows([[1]], [[5, 6, 7, 8]], [0.0], [True], [True], tool_masks=[[1, 0]]), 0, "cpu"
        )


def test_a_retry_rows_vllm_ratio_leaves_its_tool_results_out_as_trl_does():
    """A retry episode with a tool result, sampled by vLLM: TRL's tool loop records 0.0 as
    the sampling log-prob of the tool's tokens. The sequence-mode ratio is TRL's formula
    over the model's own tokens: 1.0 where the sampler and the policy agree (counting the
    tool tokens gave exp(5 x -0.5) = 0.082)."""
    from pipeline.erl.batch import merge_rows

    current = -0.5  # the policy's log-prob of every token
    tool = [1, 0, 0, 0, 0, 0, 1]  # a call, five tokens of the tool's reply, the answer
    sampled = [current if m else 0.0 for m in tool]
    rows = NewRows([[1]], [[5] * len(tool)], [1.0], [True], [True], [sampled], [tool])
    output = {
        "prompt_ids": torch.ones(1, 1, dtype=torch.long),
        "prompt_mask": torch.ones(1, 1, dtype=torch.long),
        "completion_ids": torch.ones(1, 2, dtype=torch.long),
        "completion_mask": torch.ones(1, 2, dtype=torch.long),
        "tool_mask": torch.ones(1, 2, dtype=torch.long),
        "advantages": torch.zeros(1),
        "num_items_in_batch": torch.tensor(2),
        "sampling_per_token_logps": torch.full((1, 2), current),
        "importance_sampling_ratio": torch.ones(1, 1),
    }
    merged = merge_rows(
        output, rows, pad_id=0, multiple=None, steps_per_generation=1, gather=lambda t: t,
        logps=lambda batch: torch.full(batch["completion_ids"].shape, current),
        ref_logps=None, importance_sampling=("sequence_mask", None, 3.0),
    )  # fmt: skip
    mask = merged["completion_mask"][1] * merged["tool_mask"][1]  # TRL's mask for the ratio
    diff = ((current - merged["sampling_per_token_logps"][1]) * mask).sum()
    trl = torch.exp(diff)
    assert merged["importance_sampling_ratio"][1].item() == pytest.approx(trl.item()) == 1.0
