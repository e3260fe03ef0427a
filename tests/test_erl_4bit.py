"""ERL on the tiny model in 4-bit NF4 with a LoRA adapter (QLoRA), on whichever base trainer
this process has: TRL's here, Unsloth's generated one in tests/test_unsloth_trainer.py.

The both-bases claims that compare gradients or parameters are collected here again from
their own modules, with their `load_model` swapped for the project's 4-bit loader: the
gate-closed equality with the base trainer, the internalization gradient and the
micro-batched gradient, at the same float32 tolerance. Then what is 4-bit's own: the
loader's layers, the adapter kept in float32 (TRL's trainer casts it to bf16), a reward
that rises over a short gated run, and a trainer checkpoint that resumes exactly.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
import test_erl_bases
import test_erl_internalization
import torch
from conftest import length_reward
from test_erl_bases import (  # noqa: F401  (collected here again, on the 4-bit model)
    BASE_PINS,
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


# A reward the tiny model's adapter can learn in a few steps ------------------------------

ANSWER = re.compile(r"^<answer>(\d)</answer>$")
REWARDED = "012"  # 3 of the 10 digits the warm model answers at random


def digit_reward(completions, **kwargs) -> list[float]:
    """1.0 for `<answer>D</answer>` with D in REWARDED, else 0.0."""
    return [
        1.0 if (m := ANSWER.match(c[0]["content"].strip())) and m[1] in REWARDED else 0.0
        for c in completions
    ]


@pytest.fixture(scope="module")
def warm_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model after 60 full-precision SFT steps on `<answer>D</answer>` with a
    random digit D: it answers in the format, with no preference among the digits."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from curriculum.tasks import get_task
    from pipeline.run.warmup import sft_warmup

    folder = tmp_path_factory.mktemp("warm") / "model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    task, rng = get_task("arithmetic"), random.Random(0)
    rows = [
        {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": answer}]}
        for row in task.generate(1, 2000, seed=0)
        for answer in [f"<answer>{rng.randrange(10)}</answer>"]
    ]
    args = SimpleNamespace(
        report_to=[], bf16=False, fp16=False, use_cpu=True, seed=0, disable_tqdm=True
    )
    args.log_level = "passive"
    sft_warmup(
        model,
        tokenizer,
        task,
        1,
        steps=60,
        examples=0,
        batch_size=32,
        learning_rate=3e-3,
        args=args,
        output_dir=str(folder.parent / "sft"),
        dataset=Dataset.from_list(rows),
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_short_4bit_erl_run_with_gated_rows_raises_the_reward(warm_model_dir, erl_args):
    """15 ERL steps on the 4-bit model: first attempts below 1.0 reflect, retry and are
    internalized when the retry succeeds, and the sampled reward rises from ~0.23 to
    0.63-0.88 (5 seeds measured, docs/results.md). Sampling at temperature 0.3: the tiny
    model's adapter moves the digits' logits by a fraction of a nat (its frozen tied
    embeddings bound them), which the temperature turns into a large change of what is
    sampled, as it does for the measure.
    """
    from datasets import Dataset

    from curriculum.tasks import get_task
    from pipeline.evaluate.first_attempts import generate_completions

    task = get_task("arithmetic")
    model, tokenizer = load_policy(
        ModelConfig(
            model_name_or_path=warm_model_dir,
            backend=active_backend(),
            load_in_4bit=True,
            lora_r=16,
            lora_alpha=32,
        )
    )
    held_out = [row["prompt"] for row in task.generate(1, 128, seed=10**6)]

    def sampled_reward() -> float:
        texts = generate_completions(
            model, tokenizer, held_out, max_new_tokens=8, do_sample=True, temperature=0.3,
            batch_size=64, progress=False,
        )  # fmt: skip
        return sum(digit_reward([[{"content": t}] for t in texts])) / len(texts)

    args = erl_args(
        **BASE_PINS,
        per_device_train_batch_size=16,
        max_completion_length=8,
        reflection_max_completion_length=8,
        max_steps=15,
        learning_rate=2e-3,  # 3e-3 collapsed 1 seed in 5 (docs/log.md, 2026-12-01)
        lr_scheduler_type="constant",
        warmup_steps=0,
        temperature=0.3,
        reward_threshold=1.0,
    )
    trainer = ERLTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(task.generate(1, 512, seed=1)),
        reward_funcs=digit_reward,
        feedback_func=lambda completions, **kw: (
            [f"The digit must be one of {REWARDED}."] * len(completions)
        ),
        processing_class=tokenizer,
    )
    assert len(linear_4bit_layers(trainer.model)) == 14
    before = sampled_reward()
    trainer.train()
    after = sampled_reward()
    logs = [h for h in trainer.state.log_history if "erl/r1_mean" in h]
    r1 = [h["erl/r1_mean"] for h in logs]
    gated = [h["erl/gated_fraction"] for h in logs]
    print(f"sampled reward {before:.3f} -> {after:.3f}; r1 {[round(r, 2) for r in r1]}")
    assert len(logs) == 15 and sum(g > 0 for g in gated[:5]) == 5  # reflection, retry, ...
    assert all("erl/r2_mean" in h for h, g in zip(logs, gated) if g > 0)
    assert before < 0.45 and after > before + 0.3, (before, after)
    assert sum(r1[-3:]) / 3 > sum(r1[:3]) / 3 + 0.2, r1


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
