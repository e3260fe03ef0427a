"""A learned reward model on the tiny model, end to end: does it rank the right sum first,
in each of TRL's preference formats, and does RL on it alone raise first-attempt correctness?

    python bench/learned_reward.py                         # both parts, 3 seeds
    python bench/learned_reward.py --part accuracy --seeds 5
    python bench/learned_reward.py --part rl --seeds 5 --steps 300

Part `accuracy`. The base is the tiny model after 300 + 500 SFT steps on level-1 references
(one 800-step run gave a weaker reward model). The pairs are `synthetic_pairs`: the right
sum against a random wrong one, and well-formed against malformed replies, over level-1
additions, converted to each of TRL's preference formats (`in_format`). For every format
and seed, `python -m pipeline.reward_model` trains a reward model (12 epochs, lr 3e-3,
batch 64, 20% of the prompts held out) and the bench prints its held-out pair accuracy.
On the standard format it also prints the accuracy on the held-out right-vs-wrong-sum
pairs alone, and the calibrated score of the preferred reply and of the other.

Part `rl`. docs/reward_models.md's three steps in the learning bench's setting: the bench's
warm checkpoint (`bench/learning.py --task arithmetic --warm_only`), ratings of its own
replies (`python -m pipeline.reward_model.collect`), a reward model on those ratings plus
the synthetic pairs, then GRPO with that model as the only reward (`bench/learning.py
--reward_model`), against the same GRPO on the correctness program. Held-out success is
the task's correctness, which the policy trained on the learned model never hears.

Every figure is printed per seed, then mean ± sd and a `name: value` line. This is a
learning-effect claim, so it lives here and not in the tests (tests/test_reward_model.py
runs the same wiring at a size that shows only that it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SEED = 5  # the pairs' prompts; the held-out evaluation prompts use seeds from 10**6
FORMATS = (
    "standard",
    "standard, implicit prompt",
    "conversational",
    "conversational, implicit prompt",
    "conversational, with margins",
)
WELL_FORMED = re.compile(r"<answer>\d+</answer>")
# What a reward model trains with here (the measured settings of docs/results.md).
REWARD_MODEL_OPTIONS = (
    "--num_train_epochs", "12", "--learning_rate", "3e-3", "--per_device_train_batch_size", "64",
    "--heldout_fraction", "0.2", "--disable_tqdm", "true",
)  # fmt: skip


# The data ---------------------------------------------------------------------------------


def synthetic_pairs(n: int = 1800, seed: int = TRAIN_SEED) -> list[dict]:
    """Rated pairs over `n` level-1 additions: the correct reply beats a wrong sum, and, for
    every third prompt, any parseable reply beats a malformed one."""
    from curriculum.tasks import get_task

    rng = random.Random(0)
    pairs = []
    for i, row in enumerate(get_task("arithmetic").generate(1, n, seed=seed)):
        answer = int(row["answer"])
        wrong = rng.choice([x for x in range(19) if x != answer])
        right, bad = f"<answer>{answer}</answer>", f"<answer>{wrong}</answer>"
        pairs.append({"prompt": row["prompt"], "chosen": right, "rejected": bad})
        if i % 3 == 0:
            for reply, value in ((right, answer), (bad, wrong)):
                malformed = rng.choice(
                    ["", "<answer>", f"<answer>{value}", f"{value}", f"{reply}{rng.randint(0, 9)}"]
                )
                pairs.append({"prompt": row["prompt"], "chosen": reply, "rejected": malformed})
    return pairs


def in_format(pair: dict, name: str, tokenizer) -> dict | None:
    """A pair of `synthetic_pairs` (system and user messages, text replies) in one of TRL's
    preference formats; None where the format cannot hold it. The standard (text) ones are
    TRL's own conversion, `trl.apply_chat_template`: the chat-formatted text."""
    from trl import apply_chat_template

    def said(reply: str) -> list[dict]:
        return [{"role": "assistant", "content": reply}]

    prompt, chosen, rejected = pair["prompt"], said(pair["chosen"]), said(pair["rejected"])
    explicit = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if name == "standard":
        return apply_chat_template(explicit, tokenizer)
    if name == "standard, implicit prompt":
        text = apply_chat_template(explicit, tokenizer)
        a, b = text["chosen"], text["rejected"]
        if a.startswith(b) or b.startswith(a):
            return None  # a reply that starts the other would be all prompt: refused
        return {"chosen": text["prompt"] + a, "rejected": text["prompt"] + b}
    if name == "conversational":
        return explicit
    if name == "conversational, implicit prompt":
        return {"chosen": prompt + chosen, "rejected": prompt + rejected}
    if name == "conversational, with margins":  # a wrong sum by 1, a malformed reply by 2
        return {**explicit, "margin": 1.0 if WELL_FORMED.fullmatch(pair["rejected"]) else 2.0}
    raise ValueError(f"unknown format {name!r}; choose from {list(FORMATS)}")


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# The steps, as a user runs them ----------------------------------------------------------------


def train_reward_model(pairs: Path, base: str, output: Path, *extra: str) -> str:
    """`python -m pipeline.reward_model` in this process (`extra` after the settings, which
    it overrides); returns its last line, `heldout_pair_accuracy: X`."""
    from pipeline.reward_model.cli import main

    argv = ["--pairs", str(pairs), "--model_name_or_path", base, "--output_dir", str(output)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main([*argv, *REWARD_MODEL_OPTIONS, *extra])
    if code != 0:
        raise SystemExit(f"reward model training failed ({code}): {stdout.getvalue()[-2000:]}")
    return stdout.getvalue().strip().splitlines()[-1]


def accuracy_of(line: str) -> float:
    name, value = line.split(": ")
    if name != "heldout_pair_accuracy":
        raise ValueError(f"expected heldout_pair_accuracy, got {line!r}")
    return float(value)


def sft_base(tiny: str, folder: Path) -> str:
    """The tiny model after 300 + 500 SFT steps on level-1 references (built once)."""
    if (folder / "config.json").exists():
        return str(folder)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from curriculum.tasks import get_task
    from pipeline.run.warmup import sft_warmup

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    args = SimpleNamespace(
        report_to=[], bf16=False, fp16=False, use_cpu=True, seed=0, disable_tqdm=True,
        log_level="passive",
    )  # fmt: skip
    for steps in (300, 500):  # 300 teach the format, 500 more every level-1 sum
        sft_warmup(
            model, tokenizer, get_task("arithmetic"), 1, steps=steps, examples=6000,
            batch_size=64, learning_rate=3e-3, args=args, output_dir=str(folder.parent / "sft"),
        )  # fmt: skip
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.replace(folder)  # complete or absent: a killed bench rebuilds it
    return str(folder)


def run_learning_bench(out: Path, *options: str) -> dict[str, str]:
    """`python bench/learning.py OPTIONS` in its own process (it sets the backend); echoes
    its report and returns its `name: value` lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "bench" / "learning.py"), "--out", str(out), *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench/learning.py failed: {done.stderr[-3000:]}")
    print(done.stdout)
    lines = (line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return {name.strip(): value for name, value in lines}


# The two parts ----------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f}"


def part_accuracy(base: str, out: Path, seeds: int) -> None:
    from transformers import AutoTokenizer

    from pipeline.reward_model.pairs import read_pairs, split_by_prompt
    from pipeline.reward_model.signals import RewardModel

    tokenizer = AutoTokenizer.from_pretrained(base)
    rated = synthetic_pairs()
    print(f"\n{len(rated)} synthetic pairs; reward models on {base}")
    for name in FORMATS:
        records = [r for r in (in_format(p, name, tokenizer) for p in rated) if r is not None]
        pairs = write_jsonl(records, out / "pairs" / f"{name.replace(', ', '-')}.jsonl")
        margin = ["--margin", "true"] if "margins" in name else []
        accuracies = []
        for seed in range(seeds):
            folder = out / "rm" / f"{name.replace(', ', '-').replace(' ', '_')}-s{seed}"
            line = train_reward_model(pairs, base, folder, "--seed", str(seed), *margin)
            accuracies.append(accuracy_of(line))
            if name == "standard" and seed == 0:
                standard = folder
        print(f"  {name:34s} held-out pair accuracy per seed {accuracies}: {spread(accuracies)}")
        print(f"heldout_pair_accuracy[{name}]: {statistics.mean(accuracies):.4f}")

    # The arithmetic alone (both replies well formed) and the calibration, on prompts that
    # training never showed (the first standard model).
    _, held = split_by_prompt(read_pairs(write_jsonl(rated, out / "pairs" / "raw.jsonl")), 0.2, 0)
    sums = [p for p in held if WELL_FORMED.fullmatch(p.rejected)]
    model = RewardModel(str(standard))
    chosen = model.raw_scores([p.prompt for p in sums], [p.chosen for p in sums])
    rejected = model.raw_scores([p.prompt for p in sums], [p.rejected for p in sums])
    right = sum(c[0] > r[0] for c, r in zip(chosen, rejected)) / len(sums)
    high = sum(model.normalise(c)[0] for c in chosen) / len(sums)
    low = sum(model.normalise(r)[0] for r in rejected) / len(sums)
    print(f"right_vs_wrong_sum_accuracy: {right:.4f} ({len(sums)} held-out pairs)")
    print(f"calibrated_score_preferred: {high:.4f}")
    print(f"calibrated_score_other: {low:.4f}")


def part_rl(base: str, out: Path, seeds: int, steps: int) -> None:
    from pipeline.reward_model.collect import main as collect

    bench = out / "learning"
    warm = run_learning_bench(bench, "--task", "arithmetic", "--warm_only")["warm_checkpoint"]
    ratings = out / "ratings.jsonl"
    code = collect(
        [
            "--model_name_or_path", warm, "--task", "arithmetic", "--level", "1", "--prompts", "400",
            "--samples", "8", "--max_new_tokens", "12", "--output", str(ratings), "--disable_tqdm", "true",
        ]
    )  # fmt: skip
    if code != 0:
        raise SystemExit(f"collecting ratings failed ({code})")
    pairs = out / "rl-pairs.jsonl"
    pairs.write_text(
        ratings.read_text() + write_jsonl(synthetic_pairs(), out / "s.jsonl").read_text()
    )
    accuracy = accuracy_of(train_reward_model(pairs, base, out / "rl-rm"))
    print(f"rl_reward_model_heldout_pair_accuracy: {accuracy:.4f}")
    common = ["--task", "arithmetic", "--methods", "grpo", "--steps", str(steps)]
    common += ["--seeds", str(seeds), "--skip_gates"]
    for label, extra in (("program", []), ("learned", ["--reward_model", str(out / "rl-rm")])):
        print(f"\n--- GRPO, the only signal: {label} ---")
        figures = run_learning_bench(bench, *common, *extra)
        print(f"heldout_success_start: {figures['heldout_success_start']}")
        print(f"heldout_success_median[{label}]: {figures['heldout_success_equal_steps[grpo]']}")
        print(f"heldout_mean[{label}]: {figures['heldout_mean_equal_steps[grpo]']}")  # and CI


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("accuracy", "rl", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="part rl: GRPO steps")
    parser.add_argument("--out", default=".cache/bench-learned-reward")
    opts = parser.parse_args(argv)
    if opts.seeds < 1 or opts.steps < 1:
        parser.error(f"--seeds and --steps must be >= 1, got {opts.seeds} and {opts.steps}")
    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl: the CPU stand-in for TRL's Triton kernel
    import torch

    from pipeline.models.tiny import build_tiny_model

    torch.set_num_threads(1)  # stable on a shared machine
    out = Path(opts.out)
    base = sft_base(build_tiny_model(str(out / "tiny")), out / "base")
    if opts.part in ("accuracy", "both"):
        part_accuracy(base, out, opts.seeds)
    if opts.part in ("rl", "both"):
        part_rl(base, out, opts.seeds, opts.steps)


if __name__ == "__main__":
    main()
