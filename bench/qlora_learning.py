"""Does a short ERL run with gated rows raise the reward of a 4-bit NF4 + LoRA policy (the
recipes' QLoRA setting) on a CPU? Per seed, before and after.

    python bench/qlora_learning.py                 # 5 seeds, 15 steps, both bases' trainer here
    python bench/qlora_learning.py --seeds 3 --steps 10
    ERL_BACKEND=unsloth ERL_UNSLOTH_CPU_TRAINER=1 python bench/qlora_learning.py   # Unsloth's trainer

The policy: the tiny model after 60 full-precision SFT steps on `<answer>D</answer>` with a
random digit D (it answers in the format, with no preference among the digits), loaded by
the project's 4-bit loader with a LoRA adapter (r 16). The reward: 1 for a digit in
`REWARDED` (3 of 10), else 0; the feedback names the digits. Every first attempt below 1
reflects, retries and, when the retry succeeds, is internalized. Sampling at temperature
0.3, in training and in the measure: the tiny model's adapter moves the digits' logits by
a fraction of a nat (its frozen tied embeddings bound them), which the temperature turns
into a visible change of what is sampled.

Prints per seed the sampled reward on 128 held-out prompts before and after, and the mean
of r1 over the first and the last 3 steps; then mean ± sd and `name: value` lines. A
learning effect, so it lives here, not in the tests (tests/test_erl_4bit.py runs a short
gated 4-bit run that shows the wiring).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
from pathlib import Path
from types import SimpleNamespace

ANSWER = re.compile(r"^<answer>(\d)</answer>$")
REWARDED = "012"  # 3 of the 10 digits the warm model answers at random


def digit_reward(completions, **kwargs) -> list[float]:
    """1.0 for `<answer>D</answer>` with D in REWARDED, else 0.0."""
    return [
        1.0 if (m := ANSWER.match(c[0]["content"].strip())) and m[1] in REWARDED else 0.0
        for c in completions
    ]


def digit_feedback(completions, **kwargs) -> list[str]:
    return [f"The digit must be one of {REWARDED}."] * len(completions)


def warm_model(tiny: str, folder: Path, steps: int = 60) -> str:
    """The tiny model after `steps` SFT steps on `<answer>D</answer>`, D a random digit."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from curriculum.tasks import get_task
    from pipeline.run.warmup import sft_warmup

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    task, rng = get_task("arithmetic"), random.Random(0)
    rows = [
        {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": answer}]}
        for row in task.generate(1, 2000, seed=0)
        for answer in [f"<answer>{rng.randrange(10)}</answer>"]
    ]
    args = SimpleNamespace(
        report_to=[], bf16=False, fp16=False, use_cpu=True, seed=0, disable_tqdm=True,
        log_level="passive",
    )  # fmt: skip
    sft_warmup(
        model, tokenizer, task, 1, steps=steps, examples=0, batch_size=32, learning_rate=3e-3,
        args=args, output_dir=str(folder.parent / "sft"), dataset=Dataset.from_list(rows),
    )  # fmt: skip
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def one_seed(warm: str, seed: int, steps: int, work: Path) -> dict[str, float]:
    """One gated 4-bit ERL run; the sampled reward before and after, and r1's ends. The
    seed is the trainer's (its sampling and shuffling); the policy, the rows and the
    held-out prompts are the same for every seed."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from curriculum.tasks import get_task
    from pipeline import ERLConfig, ERLTrainer
    from pipeline.evaluate.first_attempts import generate_completions
    from pipeline.models.backend import active_backend
    from pipeline.models.loading import ModelConfig, load_policy

    task = get_task("arithmetic")
    model, tokenizer = load_policy(
        ModelConfig(
            model_name_or_path=warm, backend=active_backend(), load_in_4bit=True, lora_r=16,
            lora_alpha=32,
        )
    )  # fmt: skip
    held_out = [row["prompt"] for row in task.generate(1, 128, seed=10**6)]

    def sampled_reward() -> float:
        texts = generate_completions(
            model, tokenizer, held_out, max_new_tokens=8, do_sample=True, temperature=0.3,
            batch_size=64, progress=False,
        )  # fmt: skip
        return sum(digit_reward([[{"content": t}] for t in texts])) / len(texts)

    args = ERLConfig(
        output_dir=str(work / f"seed{seed}"), per_device_train_batch_size=16, num_generations=4,
        max_completion_length=8, reflection_max_completion_length=8, max_steps=steps,
        learning_rate=2e-3, lr_scheduler_type="constant", warmup_steps=0, temperature=0.3,
        reward_threshold=1.0, optim="adamw_torch", gradient_checkpointing=False, loss_type="dapo",
        beta=0.0, mask_truncated_completions=False, bf16=False, use_cpu=True, report_to=[],
        logging_steps=1, save_strategy="no", seed=seed, disable_tqdm=True,
    )  # fmt: skip
    trainer = ERLTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(task.generate(1, 512, seed=1)),
        reward_funcs=digit_reward,
        feedback_func=digit_feedback,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # the per-seed line below says what matters
    before = sampled_reward()
    trainer.train()
    after = sampled_reward()
    r1 = [h["erl/r1_mean"] for h in trainer.state.log_history if "erl/r1_mean" in h]
    return {"before": before, "after": after, "r1_first": statistics.mean(r1[:3]),
            "r1_last": statistics.mean(r1[-3:])}  # fmt: skip


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    opts = parser.parse_args(argv)
    if opts.seeds < 1 or opts.steps < 1:
        parser.error(f"--seeds and --steps must be >= 1, got {opts.seeds} and {opts.steps}")
    from pipeline.models.backend import activate_backend

    backend = activate_backend()  # before trl
    import torch

    from pipeline.models.tiny import build_tiny_model

    torch.set_num_threads(1)  # stable on a shared machine
    with tempfile.TemporaryDirectory(prefix="bench-qlora-") as work:
        work = Path(work)
        warm = warm_model(build_tiny_model(str(work / "tiny")), work / "warm")
        runs = []
        for seed in range(opts.seeds):
            run = one_seed(warm, seed, opts.steps, work)
            runs.append(run)
            print(f"seed {seed}: sampled reward {run['before']:.3f} -> {run['after']:.3f}; "
                  f"r1 {run['r1_first']:.3f} -> {run['r1_last']:.3f}", flush=True)  # fmt: skip
    gains = [r["after"] - r["before"] for r in runs]
    print(f"\nbackend: {backend}")
    print(f"sampled reward before: {spread([r['before'] for r in runs])}")
    print(f"sampled reward after {opts.steps} steps: {spread([r['after'] for r in runs])}")
    print(f"gain per seed: {[round(g, 3) for g in gains]}")
    print(f"sampled_reward_gain: {statistics.mean(gains):.3f}")
    print(f"sampled_reward_gain_min: {min(gains):.3f}")
    print(f"seeds_gaining: {sum(g > 0 for g in gains)}/{len(gains)}")


if __name__ == "__main__":
    main()
