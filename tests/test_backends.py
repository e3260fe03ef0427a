"""Backends: Unsloth when it can, transformers + PEFT otherwise; both train on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pipeline.models.backend import activate_backend, check_trainer_base, resolve_backend
from pipeline.models.cpu_logprob import torch_logprobs


def test_auto_takes_transformers_without_a_gpu_and_bad_names_are_listed():
    if not torch.cuda.is_available():
        assert resolve_backend("auto") == "transformers"
    assert resolve_backend("unsloth") == "unsloth"
    with pytest.raises(
        ValueError,
        match=r"unknown backend 'vllm'; valid backends: \['auto', 'unsloth', 'transformers'\]",
    ):
        resolve_backend("vllm")


def test_switching_backend_after_activation_is_refused():
    active = activate_backend()
    other = "unsloth" if active == "transformers" else "transformers"
    with pytest.raises(RuntimeError, match=f"backend '{active}' is already active"):
        activate_backend(other)
    assert activate_backend() == active


def test_trainer_base_mismatch_fails_loudly(monkeypatch):
    import trl
    from trl import GRPOTrainer

    check_trainer_base(GRPOTrainer)  # the base ERLTrainer was built on: fine

    class Rebound(GRPOTrainer):  # what `import unsloth` after ERLTrainer would do on a GPU
        pass

    monkeypatch.setattr(trl, "GRPOTrainer", Rebound)
    with pytest.raises(RuntimeError, match="something rebound TRL's trainer"):
        check_trainer_base(GRPOTrainer)


def test_cpu_logprob_fallback_matches_log_softmax():
    torch.manual_seed(0)
    hidden = torch.randn(7, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (7,))
    log_probs, entropy, _, _, is_top1 = torch_logprobs(
        hidden,
        weight,
        None,
        targets,
        temperature=0.7,
        softcap=30.0,
        logit_scale=0.5,
        outputs=("entropy", "is_top1"),
    )
    logits = 30.0 * torch.tanh((hidden @ weight.T) * 0.5 / 30.0) / 0.7
    reference = logits.log_softmax(-1)
    torch.testing.assert_close(log_probs, reference.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(reference.exp() * reference).sum(-1))
    assert torch.equal(is_top1, logits.argmax(-1) == targets)
    log_probs.sum().backward()
    assert hidden.grad is not None and weight.grad.abs().sum() > 0


def test_transformers_backend_routes_trl_kernel_through_the_cpu_fallback():
    activate_backend()
    from trl.trainer import utils as trl_utils

    from pipeline.models.cpu_logprob import _DeviceDispatchingLogProb

    assert isinstance(trl_utils._ChunkedLogProbFunction, _DeviceDispatchingLogProb)


def test_load_policy_transformers_gives_a_lora_model(tiny_model_dir):
    from peft import PeftModel

    from pipeline.models.loading import ModelConfig, load_policy

    model, tokenizer = load_policy(
        ModelConfig(
            model_name_or_path=tiny_model_dir, backend=activate_backend(), lora_r=4, lora_alpha=8
        )
    )
    assert isinstance(model, PeftModel)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


def test_model_config_rejects_bad_values():
    from pipeline.models.loading import ModelConfig

    with pytest.raises(ValueError, match="backend must be one of"):
        ModelConfig(backend="fast").validate()
    with pytest.raises(ValueError, match="lora_r must be >= 1, got 0"):
        ModelConfig(lora_r=0).validate()
    with pytest.raises(ValueError, match="load_in_4bit needs use_lora"):
        ModelConfig(load_in_4bit=True, use_lora=False).validate()


UNSLOTH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pipeline.models.loading import ModelConfig, load_policy
    model, tokenizer = load_policy(ModelConfig(model_name_or_path=sys.argv[1], backend="unsloth", lora_r=4))
    from datasets import Dataset
    from curriculum.tasks import get_task
    from pipeline import ERLConfig, ERLTrainer, active_backend
    ds = Dataset.from_list(get_task("arithmetic").generate(1, 16, seed=0))
    def reward(completions, **kw):
        return [(len(c[0]["content"]) % 4) / 3 for c in completions]
    args = ERLConfig(output_dir=sys.argv[2], per_device_train_batch_size=8, num_generations=4,
                     max_completion_length=8, max_steps=2, bf16=False, use_cpu=True, report_to=[],
                     logging_steps=1, reward_threshold=2.0, learning_rate=1e-3)
    trainer = ERLTrainer(model=model, args=args, train_dataset=ds, reward_funcs=reward,
                         processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    moved = any(not p.detach().equal(before[n]) for n, p in trainer.model.named_parameters() if n in before)
    print("RESULT " + json.dumps({"backend": active_backend(), "unsloth": "unsloth" in sys.modules,
        "model": type(model).__name__, "moved": moved, "steps": trainer.state.global_step,
        "gated": [h["erl/gated_fraction"] for h in trainer.state.log_history if "erl/gated_fraction" in h]}))
    """
)


def test_unsloth_backend_trains_erl_on_cpu(tiny_model_dir, tmp_path):
    """Forced Unsloth on CPU: Unsloth's CPU loader + get_peft_model, then two ERL steps.
    A fresh process, because `import unsloth` must come before trl."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-c", UNSLOTH_SCRIPT, tiny_model_dir, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["backend"] == "unsloth" and result["unsloth"]
    assert result["model"].startswith("PeftModel")
    assert result["moved"] and result["steps"] == 2 and result["gated"] == [1.0, 1.0]
