"""The claims that matter, on whichever base trainer this process has.

In the main test process that is TRL's GRPOTrainer. tests/test_unsloth_trainer.py runs
this module again in a process with `ERL_BACKEND=unsloth ERL_UNSLOTH_CPU_TRAINER=1`, where
the base is Unsloth's generated UnslothGRPOTrainer (its config, batch layout and loss).
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
from conftest import alternating_reward, first_generation_batch, length_reward

from pipeline import ERLConfig, ERLTrainer
from pipeline.erl.batch import INERT_KEY, NewRows, completion_layout
from pipeline.erl.micro_batches import forward_tokens
from pipeline.models.backend import unsloth_trainer_active
from pipeline.models.tiny import PAD_TOKEN, SPECIAL_TOKENS

UNSLOTH = unsloth_trainer_active()
# The tiny model samples any token, its pad token included. Unsloth's loss takes a pad id
# inside a completion for padding (it rebuilds the mask from ids and moves pads to the
# end), so the tests keep the sampler off it, as a trained model is.
NO_PAD = {"suppress_tokens": [SPECIAL_TOKENS.index(PAD_TOKEN)]}
LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo")
# Every loss type ERLTrainer trains a merged chunk with in several micro-batches.
ALL_LOSS_TYPES = (*LOSS_TYPES, "cispo", "sapo", "luspo", "vespo")
# Largest relative error of a gradient (per parameter, in norm) counted as equal: float32
# round-off, on both bases. (Unsloth's trainer would turn the float32 tiny model's training
# into fp16 autocast, 1-5% off; `add_mode_switches` marks float32 as wanted on a CPU.)
GRADIENT_TOLERANCE = 1e-5


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||."""
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-12)).item()


def load_model(folder):
    """A fresh copy of the tiny model (Unsloth's trainer takes model objects only)."""
    from transformers import AutoModelForCausalLM

    from pipeline.models.loading import add_mode_switches

    model = AutoModelForCausalLM.from_pretrained(folder)
    add_mode_switches(model)
    return model


# Options Unsloth's config defaults differently from TRL's, pinned so both bases train alike
# (Unsloth's config turns mask_truncated_completions on for an explicit dapo).
BASE_PINS = dict(
    optim="adamw_torch",
    gradient_accumulation_steps=1,
    gradient_checkpointing=False,
    loss_type="dapo",
    beta=0.0,
    mask_truncated_completions=False,
    generation_kwargs=NO_PAD,
)


@pytest.fixture
def make_args(erl_args):
    """conftest's small CPU configs with BASE_PINS; `config_cls` as there."""

    def make(config_cls=ERLConfig, **overrides):
        return erl_args(config_cls=config_cls, **{**BASE_PINS, **overrides})

    return make


def close(actual, expected, label):
    torch.testing.assert_close(
        actual,
        expected,
        rtol=1e-4,
        atol=1e-6,
        msg=lambda m: f"{label}: {actual} vs {expected}; {m}",
    )


def make_trainer(folder, args, dataset, reward=length_reward, **extra):
    return ERLTrainer(
        model=load_model(folder),
        args=args,
        train_dataset=dataset,
        reward_funcs=reward,
        feedback_func=lambda completions, **kw: ["wrong"] * len(completions),
        **extra,
    )


def test_base_is_the_one_the_backend_chose():
    from trl import GRPOConfig, GRPOTrainer

    base = ERLTrainer.__bases__[0]
    assert base is GRPOTrainer
    assert base.__name__ == ("UnslothGRPOTrainer" if UNSLOTH else "GRPOTrainer")
    assert ("unsloth_num_chunks" in GRPOConfig.__dataclass_fields__) == UNSLOTH
    assert ("unsloth" in sys.modules) == (os.environ.get("ERL_BACKEND") == "unsloth")


@pytest.mark.parametrize(
    "options",
    [{}, {"learning_rate": 3e-4, "loss_type": "bnpo", "temperature": 0.7}, {"use_vllm": True}],
    ids=["defaults", "set", "vllm"],
)
def test_erl_config_holds_exactly_what_the_base_config_makes(options):
    """ERLConfig goes through the active base config's __init__ (Unsloth's adjusts the
    learning-rate default, vLLM correction and top_k, checkpointing kwargs, ...)."""
    from trl import GRPOConfig

    common = dict(output_dir="unused", use_cpu=True, bf16=False, **options)
    erl, base = ERLConfig(reward_threshold=0.5, **common), GRPOConfig(**common)
    erl_only = {"reward_threshold", "memory_size", "memory_top_k", "reflection_system_prompt"}
    erl_only |= {"retry_system_prompt", "internalization_coef", "enable_memory"}
    erl_only |= {"enable_internalization", "reflection_max_completion_length"}
    erl_only |= {"memory_scope", "peak_memory_factor", "reflections_per_group"}
    erl_only |= {"reflection_attempt_max_chars", "enable_reflection"}
    ours = {k: v for k, v in erl.to_dict().items() if k not in erl_only}
    assert ours == base.to_dict() and set(erl.to_dict()) - set(base.to_dict()) == erl_only
    assert erl.reward_threshold == 0.5 and erl.memory_size == 50
    if UNSLOTH and not options:  # what the review measured a @dataclass ERLConfig to skip
        assert erl.learning_rate == 5e-5 and erl.vllm_importance_sampling_correction is False
        assert erl.gradient_checkpointing_kwargs == {"use_reentrant": True}


def test_gate_closed_trains_exactly_like_the_base(tiny_model_dir, arithmetic_dataset, make_args):
    """Threshold below every reward: the same parameters as the base trainer after 3 steps."""
    from trl import GRPOConfig, GRPOTrainer

    def run(trainer):
        initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        return initial, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    from pipeline.models.quantization import undo_qlora_bf16_cast

    grpo = GRPOTrainer(
        model=load_model(tiny_model_dir),
        args=make_args(GRPOConfig, max_steps=3),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    # What ERLTrainer's __init__ does after TRL's (tests/test_erl_4bit.py): a 4-bit model's
    # adapter back in float32. A no-op on a float model and on Unsloth's base.
    undo_qlora_bf16_cast(grpo.model)
    initial, base = run(grpo)
    erl_trainer = make_trainer(
        tiny_model_dir, make_args(reward_threshold=-1.0, max_steps=3), arithmetic_dataset
    )
    _, erl = run(erl_trainer)
    assert any(not torch.equal(initial[n], base[n]) for n in initial), "the base did not train"
    for name in base:
        assert torch.equal(base[name], erl[name]), name
    gated = [
        h["erl/gated_fraction"] for h in erl_trainer.state.log_history if "erl/gated_fraction" in h
    ]
    assert gated == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_inert_rows_leave_every_loss_type_unchanged(
    tiny_model_dir, arithmetic_dataset, make_args, beta
):
    """Cross-process padding and filler rows: pad-only completions (a base that rebuilds the
    mask from token ids trains nothing there) that ERLTrainer.compute_loss also leaves out
    of the per-row means of grpo and dr_grpo."""
    from trl import GRPOTrainer

    args = make_args(reward_threshold=-1.0, beta=beta, num_iterations=2)  # old log-probs too
    trainer = make_trainer(tiny_model_dir, args, arithmetic_dataset)
    batch, out = first_generation_batch(trainer)
    assert INERT_KEY not in out
    n = out["prompt_ids"].size(0)
    # Eight padding rows as _experience makes them: copies of a real row, not valid.
    prompt = out["prompt_ids"][0][out["prompt_mask"][0].bool()].tolist()
    completion = out["completion_ids"][0][out["completion_mask"][0].bool()].tolist()
    rows = NewRows([prompt] * 8, [completion] * 8, [0.5] * 8, [False] * 8, [True] * 8)
    merged = trainer._merge_rows(out, rows)
    trainer.budget.loss_tokens = lambda: 10**6  # one forward
    assert merged[INERT_KEY].tolist() == [False] * n + [True] * 8
    assert (merged["completion_ids"][n:] == trainer._tokenizer.pad_token_id).all()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    for loss_type in LOSS_TYPES:
        trainer.loss_type = trainer.args.loss_type = loss_type
        with torch.no_grad():
            expected = trainer.compute_loss(trainer.model, out)
            got = trainer.compute_loss(trainer.model, merged)
            # Same rows as GRPO's batch: the same loss up to float summation order.
            close(got, expected, loss_type)
            if loss_type in ("dapo", "bnpo"):  # token means: the base's own loss ignores them too
                plain = {k: v for k, v in merged.items() if k != INERT_KEY}
                own = GRPOTrainer.compute_loss(trainer, trainer.model, plain)
                # Old log-probs recomputed over more rows: float noise, not -0.55 vs -0.41.
                close(own, expected, loss_type)


def micro_batch_harness(trainer, merged, monkeypatch):
    """`step(tokens)`: one training_step on the merged chunk with `tokens` tokens per forward
    (the budget's count: padded on TRL's trainer, the rows' own on Unsloth's, which packs);
    returns the loss, the gradients, the metrics the step logged (new values per key) and,
    per backward, the rows and tokens the base's loss got since the last one (those whose
    activations are alive at once)."""
    model = trainer.model
    pending, seen = [0, 0], []
    base = type(trainer).__mro__[1]
    base_loss, backward = base.compute_loss, trainer.accelerator.backward

    def counting_loss(self, model, inputs, *args, **kwargs):
        pending[0] += inputs["prompt_ids"].size(0)
        pending[1] += forward_tokens(inputs, self._tokenizer.pad_token_id, packed=UNSLOTH)
        return base_loss(self, model, inputs, *args, **kwargs)

    def counting_backward(loss, **kwargs):
        seen.append(tuple(pending))
        pending[:] = [0, 0]
        return backward(loss, **kwargs)

    monkeypatch.setattr(base, "compute_loss", counting_loss)
    monkeypatch.setattr(trainer.accelerator, "backward", counting_backward)

    def step(tokens, sync=True, accumulate=False):
        trainer.budget.loss_tokens = lambda: tokens
        trainer._buffered_inputs, trainer._step = [merged], 1
        trainer.current_gradient_accumulation_steps = 2
        trainer.accelerator.sync_gradients = sync  # False: inside an accumulation window
        metrics = trainer._metrics["train"]
        before = {key: len(values) for key, values in metrics.items()}
        seen.clear()
        if not accumulate:
            model.zero_grad()
        loss = trainer.training_step(model, {}, None)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        logged = {
            key: values[before.get(key, 0) :]
            for key, values in metrics.items()
            if len(values) > before.get(key, 0) and key != "step_time"  # wall time
        }
        return loss, grads, logged, list(seen)

    return step


def all_gated_chunk(tiny_model_dir, arithmetic_dataset, make_args, **overrides):
    """A trainer and one merged all-gated chunk (~4x GRPO's rows, retries wider than first
    attempts, internalization rows), with completions of different lengths (so a part's
    share of the loss tokens, bnpo's weight, differs from its share of rows, grpo's) and old
    and reference log-probs moved off the policy's (so the ratio clips and KL is not 0)."""
    reward, _ = alternating_reward()  # y1 fails, retries succeed: internalization rows too
    args = make_args(
        reward_threshold=0.5,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=1,
        num_iterations=2,  # old log-probs; the second step reuses the buffer
        **overrides,
    )
    trainer = make_trainer(tiny_model_dir, args, arithmetic_dataset, reward=reward)
    first, merged = first_generation_batch(trainer)
    assert merged["prompt_ids"].size(0) > 3 * 4 and len(first) == 4
    width = merged["completion_ids"].size(1)
    for row in range(merged["completion_ids"].size(0)):
        merged["completion_ids"][row, 1 + row % width :] = trainer._tokenizer.pad_token_id
        merged["completion_mask"][row, 1 + row % width :] = 0
    merged["num_items_in_batch"] = merged["completion_mask"].sum()
    noise = torch.Generator().manual_seed(0)
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        if merged.get(key) is not None:
            merged[key] = merged[key] + 0.3 * torch.randn(merged[key].shape, generator=noise)
    return trainer, first, merged


@pytest.mark.parametrize(
    "beta, entropy_coef", [(0.0, 0.0), (0.1, 0.3)], ids=["policy", "kl_and_entropy_bonus"]
)
def test_micro_batched_loss_counts_every_term_once(
    tiny_model_dir, arithmetic_dataset, make_args, monkeypatch, beta, entropy_coef
):
    """A merged chunk trained in micro-batches within the token budget has the loss, the
    gradient and the logged metrics of the chunk in one forward, for every loss type
    ERLTrainer micro-batches: the policy term, KL, the entropy bonus and every metric
    (policy_loss, entropy, kl, clip ratios, ...) counted once."""
    trainer, first, merged = all_gated_chunk(
        tiny_model_dir, arithmetic_dataset, make_args, beta=beta, entropy_coef=entropy_coef
    )
    step = micro_batch_harness(trainer, merged, monkeypatch)
    # Nothing measured yet: a micro-batch holds at most one forward of GRPO's own 4 rows.
    assert 0 < trainer.budget.loss_tokens() == trainer.budget.reference_tokens
    merged_width = merged["prompt_ids"].size(1) + merged["completion_ids"].size(1)
    budget = 4 * merged_width // 3  # tighter, so that every loss type needs several forwards
    for loss_type in ALL_LOSS_TYPES:
        trainer.loss_type = trainer.args.loss_type = loss_type
        micro_loss, micro, micro_logged, seen = step(budget)
        assert len(seen) > 2, (loss_type, seen)
        over = [(rows, tokens) for rows, tokens in seen if tokens > budget and rows > 1]
        assert not over, (loss_type, budget, over)
        whole_loss, whole, whole_logged, seen = step(10**9)
        assert [rows for rows, _ in seen] == [int((~merged[INERT_KEY]).sum())]  # one forward
        torch.testing.assert_close(micro_loss, whole_loss, rtol=1e-4, atol=1e-7)
        assert whole and any(g.abs().sum() > 0 for g in whole.values())
        errors = {name: relative_error(micro[name], g) for name, g in whole.items()}
        print(loss_type, "relative gradient error, max:", max(errors.values()))
        assert max(errors.values()) < GRADIENT_TOLERANCE, (loss_type, errors)
        assert micro_logged.keys() == whole_logged.keys(), loss_type
        for key, values in whole_logged.items():
            assert len(micro_logged[key]) == len(values), (loss_type, key, micro_logged[key])
            assert micro_logged[key] == pytest.approx(values, rel=1e-4, abs=1e-6, nan_ok=True), (
                loss_type,
                key,
            )
        if entropy_coef and not UNSLOTH:  # Unsloth's loss logs neither
            assert {"policy_loss", "entropy_coef"} <= whole_logged.keys()
        if beta:
            assert whole_logged["kl"][0] > 0


@pytest.mark.skipif(UNSLOTH, reason="Unsloth's loss has no adaptive entropy control (it warns)")
def test_adaptive_entropy_steps_once_per_optimizer_step_with_accumulation(
    tiny_model_dir, arithmetic_dataset, make_args, monkeypatch
):
    """Adaptive entropy control with gradient accumulation 2: ERL in micro-batches gives the
    entropy_coef trajectory, the logged coefficient and the parameters of the chunk trained
    in one forward (before, every micro-batch at the boundary stepped the controller)."""
    trainer, _, merged = all_gated_chunk(
        tiny_model_dir,
        arithmetic_dataset,
        make_args,
        use_adaptive_entropy=True,
        entropy_coef=0.01,
        entropy_coef_delta=0.005,
        entropy_target=100.0,  # above any entropy here: the coefficient rises every step
    )
    step = micro_batch_harness(trainer, merged, monkeypatch)
    model = trainer.model
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    controller = trainer.entropy_coef, trainer._last_world_entropy
    width = merged["prompt_ids"].size(1) + merged["completion_ids"].size(1)
    runs = {}
    for name, tokens in (("micro", 2 * width), ("whole", 10**9)):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(initial[n])
        trainer.entropy_coef, trainer._last_world_entropy = controller
        trainer._entropy_window_stats = None
        trainer.optimizer = None
        trainer.create_optimizer()
        coefs, logged, forwards = [], [], 0
        for _ in range(3):  # optimizer steps of two accumulated micro-steps each
            for sync in (False, True):
                _, _, new, seen = step(tokens, sync=sync, accumulate=not sync)
                logged += new.get("entropy_coef", [])
                forwards = max(forwards, len(seen))
            trainer.optimizer.step()
            coefs.append(trainer.entropy_coef)
        runs[name] = coefs, logged, {n: p.detach().clone() for n, p in model.named_parameters()}
        assert forwards > 1 if name == "micro" else forwards == 1, (name, forwards)
    assert runs["whole"][0] == pytest.approx([0.015, 0.02, 0.025])  # once per optimizer step
    assert runs["micro"][0] == pytest.approx(runs["whole"][0])
    assert runs["micro"][1] == pytest.approx(runs["whole"][1]) and len(runs["micro"][1]) == 3
    errors = {
        n: relative_error(runs["micro"][2][n] - initial[n], d - initial[n])
        for n, d in runs["whole"][2].items()
    }
    # Adam divides by the gradient's running RMS: float round-off in the gradients (< 1e-5,
    # the test above) grows to ~1e-4 in the updates of parameters with tiny gradients.
    assert max(errors.values()) < 1e-3, errors


@pytest.mark.parametrize("factor", [1.5, 0.01], ids=["default", "tiny"])
def test_reflections_and_retries_generate_within_the_memory_budget(
    tiny_model_dir, arithmetic_dataset, make_args, factor
):
    """Reflection and retry prompts are several times longer than the task's. Each of their
    generate calls holds at most the memory budget (its estimated bytes against
    peak_memory_factor x GRPO's loss forward), as many rows as fit: with the default factor
    a couple of calls for 2 x 8 rows (the old token rule made one call per row here), with a
    tiny one a row per call; erl/generate_calls logs how many. (Since issue 48 the default
    retry prompt also holds the attempt's feedback, so retries may take two calls.)"""
    args = make_args(
        reward_threshold=2.0, per_device_train_batch_size=8, peak_memory_factor=factor,
        reflections_per_group=0,  # a reflection for every row
    )  # fmt: skip
    trainer = make_trainer(tiny_model_dir, args, arithmetic_dataset)
    calls, generate = [], trainer._generate_single_turn

    def counting_generate(prompt_ids, *rest):
        new_tokens = trainer.generation_config.max_new_tokens
        calls.append((len(prompt_ids), max(map(len, prompt_ids)), new_tokens))
        return generate(prompt_ids, *rest)

    trainer._generate_single_turn = counting_generate
    _, merged = first_generation_batch(trainer)
    (grpo_rows, grpo_prompt, _), *erl = calls
    assert grpo_rows == 8 and sum(rows for rows, _, _ in erl) == 2 * 8  # every row, twice
    assert max(prompt for _, prompt, _ in erl) > 3 * grpo_prompt  # reflections are long
    # The first batch: nothing measured yet, the estimate of GRPO's forward is the reference.
    estimate = trainer.budget.estimate
    budget = factor * estimate.loss_forward(trainer.budget.reference_tokens)
    over = [c for c in erl if estimate.generate_call(*c) > budget and c[0] > 1]
    assert not over, (budget, erl)
    assert trainer._metrics["train"]["erl/generate_calls"] == [len(erl)]
    if factor == 1.5:  # at least 3 rows a call on average (the old token rule: 1)
        assert 3 * len(erl) <= 2 * 8, erl
    else:
        assert all(rows == 1 for rows, _, _ in erl)


@pytest.mark.skipif(UNSLOTH, reason="Unsloth's GRPO trainer refuses MoE router losses")
def test_moe_router_loss_is_counted_once_per_chunk(
    tiny_model_dir, arithmetic_dataset, make_args, monkeypatch, tmp_path
):
    """A Mixture-of-Experts policy: its router (load-balancing) loss, added by the base's
    loss per call, is counted once for a micro-batched chunk, as a token-weighted mean of
    the micro-batches' (it is not linear in the tokens, so that is as close to one forward
    as weighting gets); before, K micro-batches added it K times."""
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=1.0,
        output_router_logits=False, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / "moe"
    Qwen3MoeForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    trainer, _, merged = all_gated_chunk(str(folder), arithmetic_dataset, make_args)
    assert trainer.aux_loss_enabled
    step = micro_batch_harness(trainer, merged, monkeypatch)
    width = merged["prompt_ids"].size(1) + merged["completion_ids"].size(1)
    micro_loss, _, micro_logged, seen = step(4 * width // 3)
    assert len(seen) > 2
    whole_loss, _, whole_logged, _ = step(10**9)
    aux = whole_logged["aux_loss"][0]  # with coefficient 1: most of the loss
    assert aux > 1.0 and len(micro_logged["aux_loss"]) == 1
    assert micro_logged["aux_loss"][0] == pytest.approx(aux, rel=0.01)
    assert micro_loss.item() == pytest.approx(whole_loss.item(), rel=0.01, abs=0.01)


def test_generation_reuse_and_kl_train(tiny_model_dir, arithmetic_dataset, make_args):
    """Every row gated with steps_per_generation 2, num_iterations 2 and beta > 0."""
    args = make_args(
        reward_threshold=2.0,
        max_steps=3,
        steps_per_generation=2,
        num_iterations=2,
        beta=0.1,
        per_device_train_batch_size=4,
    )
    trainer = make_trainer(tiny_model_dir, args, arithmetic_dataset)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) and "kl" in h for h in logs)
    assert [h["erl/gated_fraction"] for h in logs if "erl/gated_fraction" in h] == [1.0]
    assert any(not torch.equal(initial[n], p) for n, p in trainer.model.named_parameters())


def test_sampling_logprobs_from_the_generator_give_sane_ratios(
    tiny_model_dir, arithmetic_dataset, make_args
):
    """vLLM simulated: the generator reports per-token log-probs (here the policy's own,
    shifted by 0.01 nats). After the merge, the base trainer's loss must see, for ERL rows
    as for first attempts, sampling log-probs aligned with the old ones."""
    args = make_args(reward_threshold=2.0, num_iterations=2)  # old log-probs are computed
    trainer = make_trainer(tiny_model_dir, args, arithmetic_dataset)
    generate = trainer._generate_single_turn

    def generate_with_logprobs(prompt_ids, *rest, **kwargs):
        completion_ids, _ = generate(prompt_ids, *rest, **kwargs)
        rows = NewRows(
            [list(p) for p in prompt_ids],
            [list(c) for c in completion_ids],
            [0.0] * len(prompt_ids),
            [True] * len(prompt_ids),
            [True] * len(prompt_ids),
        )
        from pipeline.erl.batch import pad_rows

        batch = pad_rows(rows, trainer._tokenizer.pad_token_id, "cpu")
        logps = completion_layout(
            trainer._logps(trainer.model, batch),
            batch["prompt_mask"],
            batch["completion_ids"].size(1),
        )
        return completion_ids, [
            (logps[i, : len(c)] - 0.01).tolist() for i, c in enumerate(completion_ids)
        ]

    trainer._generate_single_turn = generate_with_logprobs
    batch, out = first_generation_batch(trainer)
    n = len(batch)
    assert out["sampling_per_token_logps"].size(0) == out["prompt_ids"].size(0)
    pad_id = trainer._tokenizer.pad_token_id
    old = out["old_per_token_logps"]
    if UNSLOTH:  # what Unsloth's loss does: re-align sampling log-probs to its packed layout
        unsloth_module = sys.modules[type(trainer).__mro__[1].__module__]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        width = out["completion_ids"].size(1)
        left_pad = unsloth_module.calculate_pad_tokens_in_prompt(ids, width, pad_id)
        max_left_pad = old.size(1) - width
        packed = unsloth_module.left_pack_padding(ids, pad_id)[:, -(width + max_left_pad) :]
        mask = unsloth_module.create_completion_attention_mask(
            packed, left_pad, max_left_pad, pad_id
        ).long()
        sampling = unsloth_module.align_logprobs_with_mask(out["sampling_per_token_logps"], mask)
    else:
        mask, sampling = out["completion_mask"], out["sampling_per_token_logps"]
    mask = mask.float() * (~out[INERT_KEY]).float().unsqueeze(1)
    gap = ((old - sampling).abs() * mask).sum(1) / mask.sum(1).clamp(min=1)
    erl_rows = mask[n:].sum(1) > 0
    assert erl_rows.sum() >= n  # reflections and retries
    # First attempts and ERL rows alike: old - sampling is the 0.01 nats shift, no more.
    torch.testing.assert_close(gap[:n], torch.full((n,), 0.01), atol=2e-3, rtol=0)
    torch.testing.assert_close(
        gap[n:][erl_rows], torch.full((int(erl_rows.sum()),), 0.01), atol=2e-3, rtol=0
    )


def test_unsupported_inputs_are_refused_when_built(
    tiny_model_dir, arithmetic_dataset, make_args, monkeypatch
):
    from datasets import Dataset

    images = Dataset.from_list([{**row, "image": None} for row in arithmetic_dataset])
    with pytest.raises(NotImplementedError, match="multimodal"):
        make_trainer(tiny_model_dir, make_args(), images)
    monkeypatch.setenv("UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD", "1")
    if UNSLOTH:
        with pytest.raises(ValueError, match="UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD"):
            make_trainer(tiny_model_dir, make_args(), arithmetic_dataset)
        with pytest.raises(TypeError, match="needs a loaded model"):
            ERLTrainer(model=tiny_model_dir, args=make_args(), train_dataset=arithmetic_dataset)
    else:  # only Unsloth reads it
        make_trainer(tiny_model_dir, make_args(), arithmetic_dataset)


@pytest.mark.skipif(not UNSLOTH, reason="TRL's run of the recipe is tests/test_run.py's")
def test_tiny_recipe_runs_end_to_end_on_unsloths_trainer(tiny_model_dir, tmp_path):
    import json

    from pipeline.run.cli import main

    out = tmp_path / "run"
    argv = ["--config", "configs/tiny.yaml", "--backend", "unsloth"]
    argv += ["--model_name_or_path", tiny_model_dir, "--output_dir", str(out)]
    argv += ["--warmup_sft_steps", "10", "--warmup_sft_examples", "200", "--max_level", "2"]
    argv += ["--min_stage_steps", "2", "--max_stage_steps", "2", "--promote_threshold", "-1.0"]
    argv += ["--promote_window", "8", "--eval_prompts", "8", "--prompts_per_stage", "64"]
    argv += ["--per_device_train_batch_size", "16", "--num_generations", "4"]
    argv += ["--max_completion_length", "8", "--reflection_max_completion_length", "8"]
    argv += ["--save_steps", "2", "--disable_tqdm", "true"]
    assert main(argv) == 0
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["level"] for s in state["stages"]] == [1, 2]
    assert state["stages"][0]["status"] == "promoted"
