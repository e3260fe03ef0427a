"""pipeline.erl.micro_batches and pipeline.erl.budget: how a merged chunk is cut into
micro-batches and generate calls, and how each term of the loss is counted once."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.erl.batch import completion_layout
from pipeline.erl.budget import MemoryModel, plan_generation
from pipeline.erl.micro_batches import (
    PartWeights,
    collapse_metrics,
    micro_batch,
    micro_batch_weight,
    part_weights,
    plan_equal_micro_batches,
    plan_micro_batches,
    rows_per_micro_batch,
    select_rows,
    split_plan,
)


def test_micro_batch_weights_add_up_to_the_chunk():
    mask = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 1], [1, 0]])
    plan = [[0, 1], [2, 3], [4]]
    assert [micro_batch_weight("grpo", rows, mask) for rows in plan] == [0.4, 0.4, 0.2]
    assert [micro_batch_weight("bnpo", rows, mask) for rows in plan] == [0.5, 1 / 3, 1 / 6]
    assert [micro_batch_weight("dapo", rows, mask) for rows in plan] == [1.0, 1.0, 1.0]
    assert micro_batch_weight("bnpo", [2], mask) == 1.0  # no tokens: a zero loss anyway


def padded_batch(prompt_lengths, completion_lengths, pad=0):
    """Left-padded prompts and right-padded completions of the given lengths (ids 1..)."""
    rows, width_p, width_c = len(prompt_lengths), max(prompt_lengths), max(completion_lengths)
    batch = {
        "prompt_ids": torch.full((rows, width_p), pad),
        "prompt_mask": torch.zeros(rows, width_p, dtype=torch.long),
        "completion_ids": torch.full((rows, width_c), pad),
        "completion_mask": torch.zeros(rows, width_c, dtype=torch.long),
        "num_items_in_batch": torch.tensor(sum(completion_lengths)),
    }
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        batch["prompt_ids"][row, width_p - p :] = torch.arange(1, p + 1)
        batch["prompt_mask"][row, width_p - p :] = 1
        batch["completion_ids"][row, :c] = torch.arange(1, c + 1)
        batch["completion_mask"][row, :c] = 1
    return batch


def test_plan_keeps_tokens_per_forward_within_the_budget():
    """First attempts (short prompts) and retries (long prompts) of one chunk: no micro-batch
    has more padded tokens than the budget (a row wider than it goes alone), every row is in
    one, and rows of alike length share micro-batches."""
    prompts = [3, 12, 3, 11, 3, 2, 12, 3]
    completions = [4, 4, 2, 4, 4, 1, 3, 4]
    batch = padded_batch(prompts, completions)
    budget = 4 * (3 + 4)  # GRPO: 4 rows of width 7
    plan = plan_micro_batches(batch, 0, budget)
    assert sorted(r for rows in plan for r in rows) == list(range(8))
    for rows in plan:
        area = len(rows) * (max(prompts[r] for r in rows) + max(completions[r] for r in rows))
        assert area <= budget or len(rows) == 1, (rows, area)
    # Long rows (16 tokens) go alone; first attempts fill a micro-batch of 4 rows of width 7.
    assert sorted(map(sorted, plan)) == [[0, 2, 4, 7], [1], [3], [5], [6]]
    assert len(plan_micro_batches(batch, 0, 8 * 16)) == 1
    # A budget of 1.5x GRPO's forward: two long rows share one (2 x 16 <= 42), the third
    # takes a short one along, and the short rows fill the last.
    assert sorted(map(sorted, plan_micro_batches(batch, 0, 42))) == [[0, 6], [1, 3], [2, 4, 5, 7]]
    # Several processes: equal micro-batches, as many rows as every group allows.
    assert rows_per_micro_batch(batch, 0, budget) == 1  # two long rows: 32 > 28
    assert rows_per_micro_batch(batch, 0, 64) == 4  # 4 x 16 and 4 x 7 both fit
    equal = plan_equal_micro_batches(batch, 0, 3)
    assert [len(rows) for rows in equal] == [3, 3, 2]
    assert [set(rows) for rows in equal] == [{1, 3, 6}, {0, 4, 7}, {2, 5}]


def test_micro_batch_trims_padding_in_both_layouts():
    """A micro-batch keeps only the columns its rows need; TRL-layout log-probs keep token j
    in column j, Unsloth's packed ones in column M' - p' + j for the new widest padding."""
    prompts, completions = [5, 2, 3, 1], [3, 1, 2, 1]
    batch = padded_batch(prompts, completions)
    width_p, width_c = 5, 3
    m = 6  # a generation batch's widest left padding can exceed this chunk's (4)
    trl = torch.arange(4 * width_c, dtype=torch.float).view(4, width_c)
    packed = torch.full((4, width_c + m), -1.0)
    for row, p in enumerate(prompts):
        left = width_p - p
        packed[row, m - left : m - left + width_c] = trl[row]
    batch["sampling_per_token_logps"] = trl
    batch["old_per_token_logps"] = packed
    part = micro_batch(batch, [1, 2], 0, packed=True)
    assert part["prompt_ids"].tolist() == [[0, 1, 2], [1, 2, 3]]
    assert part["completion_ids"].tolist() == [[1, 0], [1, 2]]
    assert torch.equal(part["sampling_per_token_logps"], trl[[1, 2], :2])
    torch.testing.assert_close(
        completion_layout(part["old_per_token_logps"], part["prompt_mask"], 2), trl[[1, 2], :2]
    )
    assert part["old_per_token_logps"].size(1) == 2 + 1  # C' + M' (M' = 3 - 2)
    trl_part = micro_batch(batch, [1, 2], 0, packed=False)
    assert torch.equal(trl_part["old_per_token_logps"], packed[[1, 2], :2])
    wide = micro_batch(batch, [1, 2], 0, packed=False, multiple=4)  # pad_to_multiple_of
    assert wide["prompt_ids"].size(1) == 4 and wide["completion_ids"].size(1) == 3


def test_split_plan():
    assert split_plan([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert split_plan([[0], [1]], 2) == [[0], [1]]


def test_part_weights_count_every_term_once():
    """Policy weights by the loss type's normaliser; the entropy bonus by the share of loss
    tokens; the MoE router loss by the share of attention tokens: each adds up to 1."""
    batch = padded_batch([3, 12, 3, 11], [4, 4, 2, 1])
    mask = batch["completion_mask"]
    plan = [[0, 2], [1], [3]]
    for loss_type in ("dapo", "bnpo", "grpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"):
        weights = part_weights(loss_type, plan, batch, mask)
        assert math.isclose(sum(w.entropy for w in weights), 1.0)
        assert math.isclose(sum(w.aux for w in weights), 1.0)
        assert [w.policy for w in weights] == [micro_batch_weight(loss_type, r, mask) for r in plan]
    dapo = part_weights("dapo", plan, batch, mask)
    assert [w.entropy for w in dapo] == [6 / 11, 4 / 11, 1 / 11]
    assert [w.aux for w in dapo] == [12 / 40, 16 / 40, 12 / 40]


def test_collapse_metrics_gives_the_one_batch_values():
    """K values appended by K micro-batches become one: a sum for the (already weighted)
    policy loss, min and max for extremes, token- or row-weighted means for the rest; a
    metric not logged once per micro-batch is left alone."""
    parts = [PartWeights(1.0, 0.75, 0.6), PartWeights(1.0, 0.25, 0.4)]
    metrics = {
        "reward": [0.5],
        "policy_loss": [9.0, 0.3, 0.1],
        "entropy": [2.0, 1.0, 3.0],
        "clip_ratio/low_min": [0.0, 0.2, float("nan")],
        "clip_ratio/high_max": [0.1, 0.3],
        "aux_loss": [1.0, 2.0],
        "vespo/phi_seq_mean": [1.0, 0.5],
        "kl": [1.0, 2.0, 0.0],  # one value since `before`: not per micro-batch
    }
    before = {"policy_loss": 1, "entropy": 1, "clip_ratio/low_min": 1, "kl": 2}
    collapse_metrics(
        metrics,
        before,
        parts,
        tokens=[30.0, 10.0],
        rows=[1.0, 3.0],
        unsloth=False,
        sequence_level=False,
    )
    assert metrics["reward"] == [0.5] and metrics["kl"] == [1.0, 2.0, 0.0]
    assert metrics["policy_loss"] == [9.0, pytest.approx(0.4)]
    assert metrics["entropy"] == [2.0, pytest.approx(0.75 * 1.0 + 0.25 * 3.0)]
    assert metrics["clip_ratio/low_min"] == [0.0, 0.2]  # NaN: no clipped token there
    assert metrics["clip_ratio/high_max"] == [0.3]
    assert metrics["aux_loss"] == [pytest.approx(0.6 * 1.0 + 0.4 * 2.0)]
    assert metrics["vespo/phi_seq_mean"] == [pytest.approx((1.0 + 3 * 0.5) / 4)]  # by rows
    unsloth = {"clip_ratio/low_min": [0.0, 0.4], "kl": [1.0, 2.0]}  # per-process means there
    collapse_metrics(
        unsloth, {}, parts, tokens=[30.0, 10.0], rows=[1.0, 3.0], unsloth=True, sequence_level=False
    )
    assert unsloth == {"clip_ratio/low_min": [pytest.approx(0.1)], "kl": [pytest.approx(1.75)]}


def test_memory_model_and_generation_plan():
    """A generate call keeps the KV cache, one layer's activations for the prompt and each
    row's next-token distribution, not every layer's activations as a loss forward does,
    so it holds several times the tokens of a loss forward in the same bytes; prompts are
    packed into calls within the budget, a prompt over it alone."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512,
    )  # fmt: skip
    memory = MemoryModel.of(config, dtype_bytes=4, gradient_checkpointing=False)
    layer = (6 * 64 + 2 * 32 + 4 * 128) * 4
    assert memory == MemoryModel(
        activation=2 * layer, cache=2 * 2 * 32 * 4, layer=layer, logits=12 * 512
    )
    checkpointed = MemoryModel.of(config, dtype_bytes=4, gradient_checkpointing=True)
    assert checkpointed.activation == 2 * 64 * 4 + layer < memory.activation
    # Two layers: the prompt's one-layer activations weigh half of a forward's; more layers, less.
    assert memory.generate_call(16, 260, 24) < 0.6 * memory.loss_forward(16 * (260 + 24))
    budget = memory.loss_forward(1.5 * 16 * 55)  # 1.5x GRPO's forward of 16 rows of 55
    plan = plan_generation([260] * 16, 24, memory, budget)
    assert sum(map(len, plan)) == 16 and len(plan) <= 2  # today's token rule made 6 calls
    assert all(memory.generate_call(len(r), 260, 24) <= budget for r in plan)
    assert plan_generation([5, 5, 5, 5], 3, memory, memory.generate_call(4, 5, 3)) == [[0, 1, 2, 3]]
    tight = memory.generate_call(2, 13, 3)
    assert plan_generation([12, 5, 13, 2, 300], 3, memory, tight) == [[0, 1], [2, 3], [4]]


def test_a_micro_batch_keeps_the_tool_mask_of_its_columns_and_counts_the_models_tokens():
    from pipeline.erl.micro_batches import loss_token_mask

    batch = padded_batch([2, 1], [3, 1])
    batch["tool_mask"] = torch.tensor([[1, 0, 1], [1, 1, 1]])
    part = micro_batch(batch, [1], 0, packed=False)
    assert part["completion_ids"].size(1) == 1 and part["tool_mask"].tolist() == [[1]]
    assert loss_token_mask(batch, 0, unsloth=False, mask_truncated=False).tolist() == [
        [1, 0, 1],
        [1, 0, 0],
    ]
    # Unsloth rebuilds the mask from the ids; tool results stay out there too.
    assert loss_token_mask(batch, 0, unsloth=True, mask_truncated=False)[0].tolist() == [1, 0, 1]


def test_select_rows_restricts_the_per_row_tensors_and_keeps_the_rest():
    batch = {
        "prompt_ids": torch.arange(6).view(3, 2),
        "advantages": torch.tensor([0.5, 1.0, -1.0]),
        "num_items_in_batch": torch.tensor(7),  # a scalar
        "max_left_pad": torch.tensor([2]),  # not per row (one value for the batch)
        "logits_to_keep": 4,
    }
    kept = select_rows(batch, torch.tensor([True, False, True]))
    assert kept["prompt_ids"].tolist() == [[0, 1], [4, 5]]
    assert kept["advantages"].tolist() == [0.5, -1.0]
    assert kept["num_items_in_batch"].item() == 7 and kept["max_left_pad"].tolist() == [2]
    assert kept["logits_to_keep"] == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_select_rows_takes_a_cuda_mask_to_a_tensor_on_the_cpu():
    """Unsloth's trainer on a GPU leaves tensors of its own on the CPU in the batch: the
    mask follows each tensor (this raised on an H200 before, in gpu_check.sh)."""
    batch = {"prompt_ids": torch.ones(3, 2, device="cuda"), "extra": torch.arange(3)}
    kept = select_rows(batch, torch.tensor([True, False, True], device="cuda"))
    assert kept["extra"].tolist() == [0, 2] and kept["prompt_ids"].shape == (2, 2)
