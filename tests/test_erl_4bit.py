"""ERL on the tiny model in 4-bit NF4 with a LoRA adapter (QLoRA), on whichever base trainer
this process has: TRL's here, Unsloth's generated one in tests/test_unsloth_trainer.py.

The both-bases claims that compare gradients or parameters are collected here again from
their own modules, with their `load_model` swapped for the project's 4-bit loader: the
gate-closed equality with the base trainer, the internalization gradient and the
micro-batched gradient, at the same float32 tolerance. Then what is 4-bit's own: the
loader's layers, the adapter kept in float32 (TRL's trainer casts it to bf16), a short
gated run (whether its reward rises is `bench/qlora_learning.py`'s), and a trainer
checkpoint that resumes exactly.
"""

from __future__ import annotations

import pytest
import test_erl_bases
import test_erl_internalization
import torch
from conftest import length_reward
from test_erl_bases import (  # noqa: F401  (collected here again, on the 4-bit model)
    UNSLOTH,
    test_gate_closed_trains_exactly_like_the_base,
    test_micro_batched_loss_counts_every_term_once,
)
from test_erl_internalization import (  # noqa: F401  (collected here again, on the 4-bit model)
    test_internalization_gradient_equals_weighted_cross_entropy,
)

from pipeline import ERLTrainer
from pipeline.models.backend import active_backend
from pipeline.models.loading import ModelConfig, add_mode_switches, load_policy

bnb = pytest.importorskip("bitsandbytes")
make_args = test_erl_bases.make_args  # the fixture the collected tests take


def load_4bit_model(folder, **lora):
    """The tiny model as `load_policy` loads it with `load_in_4bit`: NF4 + a LoRA adapter."""
    config = ModelConfig(
        model_name_or_path=folder,
        backend=active_backend(),
        load_in_4bit=True,
        **{"lora_r": 8, "lora_alpha": 16, **lora},
    )
    model, _ = load_policy(config)
    add_mode_switches(model)  # what Unsloth's trainer calls (ERLTrainer adds them too)
    return model


@pytest.fixture(autouse=True)
def four_bit_policy(monkeypatch):
    """The collected tests load their models through `load_model`: make it the 4-bit one."""
    for module in (test_erl_bases, test_erl_internalization):
        monkeypatch.setattr(module, "load_model", load_4bit_model)


def linear_4bit_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def test_the_4bit_policy_trains_a_float32_adapter_on_unpacked_nf4_layers(
    tiny_model_dir, arithmetic_dataset, make_args
):
    from trl import GRPOConfig, GRPOTrainer

    model = load_4bit_model(tiny_model_dir)
    layers = linear_4bit_layers(model)
    assert len(layers) == 14  # 7 projections x 2 layers; embeddings and the tied head stay float
    assert {m.weight.quant_state.quant_type for m in layers} == {"nf4"}
    assert {m.compute_dtype for m in layers} == {torch.float32}  # the CPU's compute dtype
    # bitsandbytes' AVX512-BF16 CPU packing is off on every layer: training through a
    # packed weight is wrong (pipeline.models.quantization.disable_cpu_weight_packing).
    assert all(m.support_avx512bf16_for_cpu is False for m in layers)
    assert not model.base_model.model.is_gradient_checkpointing  # the trainer's setting: off
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)

    trainer = ERLTrainer(
        model=model, args=make_args(), train_dataset=arithmetic_dataset, reward_funcs=length_reward
    )
    dtypes = {p.dtype for p in trainer.model.parameters() if p.requires_grad}
    assert dtypes == {torch.float32}
    grpo = GRPOTrainer(
        model=load_4bit_model(tiny_model_dir),
        args=make_args(GRPOConfig),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    # What ERLTrainer undoes: TRL's own trainer casts the adapter to bf16; Unsloth's does not.
    grpo_dtypes = {p.dtype for p in grpo.model.parameters() if p.requires_grad}
    assert grpo_dtypes == ({torch.float32} if UNSLOTH else {torch.bfloat16})


def test_the_recipes_learning_rate_moves_every_adapter_weight(
    tiny_model_dir, arithmetic_dataset, make_args
):
    """At 5e-6 (configs/colab_t4.yaml, qwen2.5-1.5b.yaml) a bf16 lora_A (|w| ~0.1, spacing
    ~5e-4) keeps 99% of its entries: Adam's lr-sized steps round away. Float32 moves them."""
    args = make_args(reward_threshold=-1.0, max_steps=3, learning_rate=5e-6)
    trainer = ERLTrainer(
        model=load_4bit_model(tiny_model_dir),
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    lora_a = {n: p for n, p in trainer.model.named_parameters() if "lora_A" in n}
    before = {n: p.detach().clone() for n, p in lora_a.items()}
    trainer.train()
    changed = sum((p.detach() != before[n]).sum().item() for n, p in lora_a.items())
    total = sum(p.numel() for p in lora_a.values())
    print(f"lora_A entries changed by 3 steps at lr 5e-6: {changed} of {total}")
    assert changed / total > 0.95, f"{changed} of {total} lora_A entries changed"


def test_a_gated_4bit_run_reflects_retries_internalizes_and_moves_the_adapter(
    tiny_model_dir, arithmetic_dataset, make_args
):
    """Every first attempt gated on the 4-bit policy: each step logs its retries and
    internalized rows, and training moves the adapter. Whether such a run raises the
    reward is a learning effect: `python bench/qlora_learning.py` (docs/results.md)."""
    from conftest import alternating_reward

    reward, _ = alternating_reward()  # y1 fails, every retry succeeds
    trainer = ERLTrainer(
        model=load_4bit_model(tiny_model_dir),
        args=make_args(reward_threshold=0.5, max_steps=2),
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        feedback_func=lambda completions, **kw: ["wrong"] * len(completions),
    )
    assert len(linear_4bit_layers(trainer.model)) == 14
    adapter = {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    trainer.train()
    logs = [h for h in trainer.state.log_history if "erl/r1_mean" in h]
    assert len(logs) == 2
    for h in logs:
        assert h["erl/gated_fraction"] == 1.0 and h["erl/retry_success_rate"] == 1.0
        assert h["erl/internalization_rows"] > 0 and "erl/internalization_loss" in h
    assert len(trainer.memory) > 0
    after = dict(trainer.model.named_parameters())
    moved = [n for n in adapter if not torch.equal(adapter[n], after[n])]
    assert moved and all("lora_" in n for n in moved)


def test_a_4bit_trainer_checkpoint_resumes_exactly(
    tiny_model_dir, arithmetic_dataset, make_args, tmp_path
):
    """4 steps in one go, and 3 steps then a fresh model resumed from checkpoint-3 for the
    4th: the same adapter, to the bit (a bf16 adapter came back float32, 4.7e-4 away). The
    gate is closed: the memory's own resume is tests/test_run.py's."""
    from peft import get_peft_model_state_dict

    def trainer(output, max_steps, save):
        args = make_args(
            output_dir=str(output), reward_threshold=-1.0, max_steps=max_steps,
            lr_scheduler_type="constant", save_strategy="steps" if save else "no", save_steps=1,
        )  # fmt: skip
        return ERLTrainer(
            model=load_4bit_model(tiny_model_dir),
            args=args,
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
        )

    def adapter(t):
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(t.model).items()}

    whole = trainer(tmp_path / "whole", 4, save=False)
    whole.train()
    stopped = trainer(tmp_path / "stopped", 3, save=True)
    stopped.train()
    checkpoint = tmp_path / "stopped" / "checkpoint-3"
    assert (checkpoint / "base_quantization.json").exists()  # evaluation reads it
    resumed = trainer(tmp_path / "stopped", 4, save=False)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    assert {p.dtype for p in resumed.model.parameters() if p.requires_grad} == {torch.float32}
    expected, got = adapter(whole), adapter(resumed)
    assert expected.keys() == got.keys() and expected
    assert any(not torch.equal(expected[n], v) for n, v in adapter(stopped).items())
    gap = max((expected[n] - got[n]).abs().max().item() for n in expected)
    print(f"largest adapter difference, resumed vs uninterrupted: {gap:.3e}")
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
