"""ERLTrainer on the tiny model: real generation, real scoring, real updates."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import alternating_reward, first_generation_batch, length_reward
from peft import LoraConfig
from transformers import TrainerCallback

from pipeline import ERLConfig, ERLTrainer
from pipeline.erl.experience import read_experience
from pipeline.erl.prompts import lesson_text
from pipeline.erl.step import reaches_threshold, retry_advantages
from rewards import completion_text
from rewards.weights import weighted_reward


def test_quick_start_trains_with_lora(tiny_model_dir, arithmetic_dataset, tmp_path):
    """The seed's Quick Start with `from pipeline import ...`, the tiny model and LoRA."""

    def feedback_func(completions, **kwargs):
        return [f"Your answer was: {completion_text(c)[:20]}" for c in completions]

    config = ERLConfig(
        output_dir=str(tmp_path / "erl-output"),
        num_train_epochs=1,
        max_steps=2,
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        reward_threshold=1.0,
        memory_size=50,
        memory_top_k=3,
        internalization_coef=1.0,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
    )
    lora_config = LoraConfig(r=8, lora_alpha=8, target_modules="all-linear")
    sink = LogSink()  # what every report_to integration receives: Trainer callbacks' on_log
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=config,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        feedback_func=feedback_func,
        peft_config=lora_config,
        callbacks=[sink],
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any("lora" in n for n in before)
    assert any(not torch.equal(before[n], after[n]) for n in before), "LoRA weights did not move"
    logged = [h for h in trainer.state.log_history if "erl/r1_mean" in h]
    assert len(logged) == 2
    for key in ("erl/r1_mean", "erl/gated_fraction", "erl/memory_size", "erl/internalization_rows"):
        assert key in logged[0]
        assert all(key in logs for logs in sink.logs)
    assert len(sink.logs) == 2


class LogSink(TrainerCallback):
    """Collects the training logs a report_to integration would receive."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append(dict(logs))


def test_gate_open_every_row_reflects_and_retries(tiny_model_dir, arithmetic_dataset, erl_args):
    reward, calls = alternating_reward()
    feedback_calls = []

    def feedback_func(prompts, completions, answer, **kwargs):
        feedback_calls.append(len(completions))
        return ["The answer is wrong."] * len(completions)

    # per-attempt reflection (the ERL paper's; the default is one reflection per group)
    args = erl_args(reward_threshold=0.5, internalization_coef=0.7, reflections_per_group=0)
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        feedback_func=feedback_func,
    )
    batch, out = first_generation_batch(trainer)

    n = len(batch)
    assert feedback_calls == [n]
    first, retry = calls
    # y2 is scored against the ORIGINAL rows: their prompts and answer column, in order.
    assert retry["prompts"] == first["prompts"]
    assert retry["answer"] == first["answer"] == [row["answer"] for row in batch]
    # y1 rows + reflection rows + retry rows + one internalization row per successful retry.
    assert out["prompt_ids"].size(0) == 4 * n
    assert out["advantages"][3 * n :].tolist() == pytest.approx([0.7] * n)
    assert len(trainer.memory) == n
    for key in ("prompt_mask", "completion_ids", "completion_mask", "advantages"):
        assert out[key].size(0) == 4 * n
    assert out["num_items_in_batch"].item() == out["completion_mask"].sum().item()
    metrics = trainer._metrics["train"]
    assert metrics["erl/gated_fraction"] == [1.0]
    assert metrics["erl/retry_success_rate"] == [1.0]
    assert metrics["erl/internalization_rows"] == [float(n)]
    assert math.isfinite(metrics["erl/internalization_loss"][0])


def test_one_reflection_per_group_trains_a_step(tiny_model_dir, arithmetic_dataset, erl_args):
    """reflections_per_group=1 with every row gated: each of the batch's two prompts writes
    one reflection and its four first attempts retry with it."""
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=2.0, max_steps=1, reflections_per_group=1),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        feedback_func=lambda completions, **kw: ["no"] * len(completions),
    )
    trainer.train()
    (logged,) = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(logged["loss"]) and logged["erl/gated_fraction"] == 1.0
    assert logged["erl/reflections"] == 2.0 and logged["erl/retries"] == 8.0
    assert len(trainer.memory) <= 2  # a reflection enters at most once

    # What ERL did is on disk: each reflection, and each retry with the lesson it read.
    records = read_experience(trainer.args.output_dir)
    reflections = {r["id"]: r for r in records if r["kind"] == "reflection"}
    retries = [r for r in records if r["kind"] == "retry"]
    assert len(reflections) == 2 and len(retries) == 8
    assert len({json.dumps(r["prompt"]) for r in reflections.values()}) == 2  # one a prompt
    for retry in retries:
        reflection = reflections[retry["reflection"]]
        assert retry["prompt"] == reflection["prompt"]  # its own group's reflection
        assert retry["lesson"] == reflection["lesson"] == lesson_text(reflection["reflection"])
        last = retry["retry_prompt"][-1]  # the task's turn, rewritten around the lesson
        assert retry["lesson"] in last["content"] and last["content"] != retry["prompt"][-1]
        assert isinstance(completion_text(retry["completion"]), str)
        assert isinstance(retry["r2"], float)
    assert all(r["feedback"] == "no" and r["step"] == 0 for r in reflections.values())


def test_without_reflection_retries_read_the_raw_feedback_and_train(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """enable_reflection=False: no reflection is generated; each gated attempt retries with
    its own feedback in the retry prompt, and the step trains."""
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=2.0, max_steps=1, enable_reflection=False),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        feedback_func=lambda completions, **kw: ["Feedback: the digit is 7."] * len(completions),
    )
    prompts = []
    generate = trainer._generate_single_turn

    def recording(prompt_ids, *args, **kwargs):
        prompts.extend(trainer.processing_class.batch_decode(prompt_ids))
        return generate(prompt_ids, *args, **kwargs)

    trainer._generate_single_turn = recording
    trainer.train()
    (logged,) = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(logged["loss"]) and logged["erl/gated_fraction"] == 1.0
    assert logged["erl/reflections"] == 0.0 and logged["erl/retries"] == 8.0
    # Only the 8 first attempts and their 8 retries were generated, the retries from the feedback.
    assert len(prompts) == 16
    assert sum("Feedback: the digit is 7." in t for t in prompts) == 8
    assert len(trainer.memory) == 0
    records = read_experience(trainer.args.output_dir)  # retries only, each read the feedback
    assert [r["kind"] for r in records] == ["retry"] * 8
    assert all(r["reflection"] is None for r in records)
    assert all(r["lesson"] == "Feedback: the digit is 7." for r in records)


def test_feedback_func_wrong_count_names_the_function(tiny_model_dir, arithmetic_dataset, erl_args):
    def my_feedback(completions, **kwargs):
        return ["too short"]

    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=2.0, reflections_per_group=0),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        feedback_func=my_feedback,
    )
    with pytest.raises(ValueError, match="my_feedback.*returned 1 feedback strings, but 8"):
        trainer.train()


def test_args_must_be_erl_config(tiny_model_dir, arithmetic_dataset, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="ERLConfig"):
        ERLTrainer(
            model=tiny_model_dir,
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False),
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
        )


@pytest.mark.parametrize(
    "overrides",
    [
        {"gradient_accumulation_steps": 2},
        {"steps_per_generation": 2},
        {"num_iterations": 2},
        {"beta": 0.1},
        {"loss_type": "grpo"},
        {"loss_type": "dr_grpo"},
        {"loss_type": "dapo", "steps_per_generation": 4, "gradient_accumulation_steps": 2},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_merged_batch_trains_under_grpo_variants(
    tiny_model_dir, arithmetic_dataset, erl_args, overrides
):
    """Every row gated, under gradient accumulation, generation reuse, KL and loss types."""
    args = erl_args(reward_threshold=2.0, max_steps=2, **overrides)
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        feedback_func=lambda completions, **kw: ["no"] * len(completions),
    )
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(math.isfinite(h["loss"]) for h in logs)
    # ERL metrics are logged on the steps that generate (not on buffered reuse steps).
    gated = [h["erl/gated_fraction"] for h in logs if "erl/gated_fraction" in h]
    assert gated and all(g == 1.0 for g in gated)
    if overrides.get("beta"):
        assert all("kl" in h for h in logs)
    assert any(not torch.equal(initial[n], p) for n, p in trainer.model.named_parameters())


def test_retry_advantages_group_normalised_or_r2_minus_r1():
    r1 = torch.tensor([0.0, 0.2, 0.1, 0.3])
    r2 = torch.tensor([1.0, 0.0, 0.5, 0.9])
    adv = retry_advantages(
        ["a", "a", "b", "pad"], r1, r2, valid=[True, True, True, False], scale=False
    )
    assert adv[0] == pytest.approx(0.5) and adv[1] == pytest.approx(-0.5)
    assert adv[2] == pytest.approx(0.5 - 0.1)  # alone in its group: r2 - r1
    assert adv[3] == 0.0  # filler rows carry no signal
    scaled = retry_advantages(["a", "a"], r1[:2], r2[:2], valid=[True, True], scale=True)
    assert scaled[0] == pytest.approx(0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-4))


def test_plain_text_prompts_reflect_and_retry_as_plain_text(tiny_model_dir, erl_args):
    """A dataset of plain-text prompts: reflection and retry prompts stay plain text, and
    the reward functions get string completions for y1 and y2 alike."""
    from datasets import Dataset

    dataset = Dataset.from_list(
        [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    )
    seen = []

    def reward(prompts, completions, answer, **kwargs):
        seen.append((list(prompts), list(completions)))
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    args = erl_args(
        reward_threshold=2.0, per_device_train_batch_size=8, num_generations=4,
        reflections_per_group=0,
    )  # fmt: skip
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=dataset,
        reward_funcs=reward,
        feedback_func=lambda completions, **kw: ["Give only the number."] * len(completions),
    )
    batch, out = first_generation_batch(trainer)
    (first_prompts, first), (retry_prompts, retries) = seen
    assert all(isinstance(c, str) for c in first + retries)
    assert retry_prompts == first_prompts == [row["prompt"] for row in batch]
    assert out["prompt_ids"].size(0) >= 3 * len(batch)
    n = len(batch)

    def prompt_text(row):
        ids = out["prompt_ids"][row][out["prompt_mask"][row].bool()]
        return trainer.processing_class.decode(ids, skip_special_tokens=True)

    # Rows n..2n-1 are reflections, 2n..3n-1 retries, both built from plain text (no chat template).
    assert prompt_text(n).startswith("You tried to solve this task:\n" + batch[0]["prompt"])
    assert prompt_text(2 * n).startswith(
        batch[0]["prompt"] + "\n\nFeedback on your attempt: Give only the number.\n\nAdvice from"
    )


def test_unscorable_retries_carry_no_signal_and_get_the_reward_funcs_kwargs(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """Retries every reward function returns None for (NaN r2) get advantage 0, as GRPO
    gives unscorable rows; the feedback function gets the reward functions' kwargs."""
    seen_kwargs = []

    def reward(completions, attempt=None, **kwargs):
        return [None] * len(completions) if attempt else [0.0] * len(completions)

    def feedback_func(completions, **kwargs):
        seen_kwargs.append(set(kwargs))
        return ["wrong"] * len(completions)

    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=0.5),
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        feedback_func=feedback_func,
    )
    batch, out = first_generation_batch(trainer)
    n = len(batch)
    assert out["advantages"][n:].abs().sum().item() == 0.0
    assert len(trainer.memory) == 0 and trainer._metrics["train"]["erl/retry_success_rate"] == [0.0]
    assert {
        "prompts",
        "completion_ids",
        "answer",
        "trainer_state",
        "log_metric",
        "log_extra",
    } <= seen_kwargs[0]


def test_truncated_erl_rows_are_masked_when_grpo_masks_truncation(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    args = erl_args(
        reward_threshold=2.0,
        max_completion_length=3,
        reflection_max_completion_length=3,
        mask_truncated_completions=True,
    )
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    batch, out = first_generation_batch(trainer)
    ends = {*trainer.eos_token_ids, trainer._tokenizer.pad_token_id}
    for ids, mask in zip(out["completion_ids"], out["completion_mask"]):
        if mask.sum() > 0:  # a row in the loss ended with EOS within the length
            assert ids[mask.bool()][-1].item() in ends
    assert out["completion_mask"][len(batch) :].sum() < out["completion_mask"][len(batch) :].numel()


def test_first_attempt_log_is_bounded_without_a_consumer(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=-1.0, max_steps=3),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    trainer.train()
    attempts = trainer.pop_first_attempts()
    assert len(attempts) == 3 * 8 and trainer._first_attempt_log.maxlen == 64 * 8
    assert all(row["answer"] for _, row in attempts) and trainer.pop_first_attempts() == []


def test_a_solved_row_is_not_gated_by_float_rounding(tiny_model_dir, arithmetic_dataset, erl_args):
    """Weights that sum to 1 (normalised in float64) can give a perfect completion a float32
    reward of 0.99999994: it is solved all the same, and a solved retry is remembered."""
    weights = [0.15867173140049218, 0.30712816650742214, 0.11885181058275184]
    weights += [0.18675250343598296, 0.22859578807335088]
    calls = []

    def perfect_then_perfect(completions, **kwargs):
        calls.append(len(completions))
        return [1.0] * len(completions)

    funcs = [perfect_then_perfect] * 5
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(reward_threshold=1.0, reward_weights=weights),
        train_dataset=arithmetic_dataset,
        reward_funcs=funcs,
    )
    scores = weighted_reward(torch.ones(3, 5), trainer.reward_weights)
    assert (scores < 1.0).all()  # the rounding this test is about
    _, out = first_generation_batch(trainer)
    assert trainer._metrics["train"]["erl/gated_fraction"] == [0.0]
    assert out["prompt_ids"].size(0) == 8  # GRPO's rows only

    assert reaches_threshold(scores[0].item(), 1.0) and not reaches_threshold(0.9999, 1.0)
    assert reaches_threshold(-2.0, -2.0) and not reaches_threshold(float("nan"), 0.0)


def test_repeated_prompts_are_tokenized_once_with_the_ids_trl_gives_each(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """A shared reflection's retries repeat one prompt: ERL tokenizes each distinct prompt
    once, and every row gets the ids TRL's own tokenization gives it."""
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    prompts = [row["prompt"] for row in arithmetic_dataset.select(range(3))]
    repeated = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[0]]
    calls = []
    tokenize = trainer._tokenize_prompts
    trainer._tokenize_prompts = lambda batch: calls.append(len(batch)) or tokenize(batch)
    ids = trainer._prompt_ids(repeated)
    assert calls == [3]
    assert ids == [list(row) for row in tokenize(repeated)[0]]
