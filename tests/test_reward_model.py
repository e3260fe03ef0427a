"""A reward model trained on the tiny model end to end: it learns which sums are right.

The three steps of docs/reward_models.md on the offline tiny model: rate (correct, wrong and
malformed replies to level-1 additions), train (`python -m pipeline.reward_model`), and
run the curriculum with the learned model as the only training signal.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from curriculum.tasks import get_task
from pipeline.reward_model.cli import main
from pipeline.reward_model.pairs import read_pairs, split_by_prompt

pytestmark = pytest.mark.slow

SEED = 5  # training prompts; the held-out evaluation prompts use seeds from 10**6
ROOT = Path(__file__).resolve().parents[1]


def sft(model, tokenizer, steps: int, learning_rate: float) -> None:
    """The run's own warm-up: SFT on level-1 reference solutions."""
    from pipeline.run.warmup import sft_warmup

    args = SimpleNamespace(
        report_to=[],
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        log_level="passive",
    )
    sft_warmup(
        model,
        tokenizer,
        get_task("arithmetic"),
        1,
        steps=steps,
        examples=6000,
        batch_size=64,
        learning_rate=learning_rate,
        args=args,
        output_dir=str(Path(tokenizer.name_or_path).parent / "sft-trainer"),
    )


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """The tiny model after the demo's SFT warm-up: the reward model's base and a policy."""
    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl: the CPU stand-in for TRL's Triton kernel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("reward-model")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Two warm-ups in a row, as measured: 300 steps teach the format (greedy success 0.09),
    # 500 more every level-1 sum (1.0). One 800-step run gave a weaker reward model (0.83).
    sft(model, tokenizer, steps=300, learning_rate=3e-3)
    sft(model, tokenizer, steps=500, learning_rate=3e-3)
    model.save_pretrained(out / "base")
    tokenizer.save_pretrained(out / "base")
    return {"base": str(out / "base"), "dir": str(out)}


def rated_pairs(path: Path, n: int = 1800) -> Path:
    """Step 1, rate: the correct reply beats a wrong sum, and any parseable reply beats a
    malformed one."""
    rng = random.Random(0)
    lines = []
    for i, row in enumerate(get_task("arithmetic").generate(1, n, seed=SEED)):
        answer = int(row["answer"])
        wrong = rng.choice([x for x in range(19) if x != answer])
        right, bad = f"<answer>{answer}</answer>", f"<answer>{wrong}</answer>"
        lines.append({"prompt": row["prompt"], "chosen": right, "rejected": bad})
        if i % 3 == 0:
            for reply, value in ((right, answer), (bad, wrong)):
                malformed = rng.choice(
                    ["", "<answer>", f"<answer>{value}", f"{value}", f"{reply}{rng.randint(0, 9)}"]
                )
                lines.append({"prompt": row["prompt"], "chosen": reply, "rejected": malformed})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def train_reward_model(pairs: Path, base: str, output: Path, *extra: str) -> str:
    """Step 2, train: the command line, as a user runs it (`extra` options after the
    settings here, which they override); returns its last line."""
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(
            [
                "--pairs",
                str(pairs),
                "--base",
                base,
                "--output_dir",
                str(output),
                "--num_train_epochs",
                "12",
                "--learning_rate",
                "3e-3",
                "--per_device_train_batch_size",
                "64",
                "--heldout_fraction",
                "0.2",
                "--disable_tqdm",
                "true",
                *extra,
            ]
        )
    assert code == 0
    return stdout.getvalue().strip().splitlines()[-1]


@pytest.fixture(scope="module")
def reward_model(models) -> tuple[str, str, Path]:
    """The reward model on the made-up pairs; returns (folder, last line, pairs file)."""
    out = Path(models["dir"])
    pairs = rated_pairs(out / "pairs.jsonl")
    return str(out / "rm"), train_reward_model(pairs, models["base"], out / "rm"), pairs


def test_a_reward_model_learns_to_prefer_correct_sums(reward_model):
    from pipeline.reward_model.signals import RewardModel

    folder, last_line, pairs = reward_model
    name, value = last_line.split(": ")
    assert name == "heldout_pair_accuracy" and float(value) >= 0.9
    info = json.loads(Path(folder, "reward_model.json").read_text())
    assert info["heldout_pair_accuracy"] == pytest.approx(float(value), abs=1e-4)

    # The arithmetic alone (both replies well formed), on prompts training never showed.
    _, held = split_by_prompt(read_pairs(pairs), 0.2, seed=0)
    sums = [p for p in held if p.rejected.endswith("</answer>") and p.rejected.startswith("<")]
    model = RewardModel(folder)
    chosen = model.raw_scores([p.prompt for p in sums], [p.chosen for p in sums])
    rejected = model.raw_scores([p.prompt for p in sums], [p.rejected for p in sums])
    accuracy = sum(c[0] > r[0] for c, r in zip(chosen, rejected)) / len(sums)
    assert len(sums) > 100 and accuracy >= 0.9
    # Calibrated: the preferred reply of a held-out pair scores well above the other.
    high = sum(model.normalise(c)[0] for c in chosen) / len(sums)
    low = sum(model.normalise(r)[0] for r in rejected) / len(sums)
    assert high > 0.7 and low < 0.5


WELL_FORMED = re.compile(r"<answer>\d+</answer>")
FORMATS = [
    "standard",
    "standard, implicit prompt",
    "conversational",
    "conversational, implicit prompt",
    "conversational, with margins",
]


def in_format(pair: dict, name: str, tokenizer) -> dict | None:
    """A pair of `rated_pairs` (system and user messages, text replies) in one of TRL's
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
    # With margins: a wrong sum by 1, a malformed reply by 2 (used with --margin true).
    return {**explicit, "margin": 1.0 if WELL_FORMED.fullmatch(pair["rejected"]) else 2.0}


@pytest.mark.parametrize("name", FORMATS)
def test_each_trl_preference_format_trains_a_reward_model(models, tmp_path, name):
    """The made-up pairs, converted to each of TRL's preference formats, train a reward
    model that ranks the replies to held-out prompts (on a third of `reward_model`'s
    prompts, for time)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models["base"])
    rated = [json.loads(line) for line in rated_pairs(tmp_path / "rated.jsonl", 600).open()]
    records = [r for r in (in_format(pair, name, tokenizer) for pair in rated) if r is not None]
    assert len(records) == len(rated)  # every pair fits every format
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in records))
    margin = ["--margin", "true"] if "margins" in name else []
    fast = ["--gradient_checkpointing", "false"]  # a tiny model: nothing to save, time to win
    last = train_reward_model(pairs, models["base"], tmp_path / "rm", *fast, *margin)
    assert last.startswith("heldout_pair_accuracy: ") and float(last.split(": ")[1]) >= 0.9
    info = json.loads((tmp_path / "rm" / "reward_model.json").read_text())
    assert info["margin"] is bool(margin) and info["heldout_pairs"] > 100


def test_the_curriculum_trains_on_the_learned_model_alone(models, reward_model, tmp_path):
    """Step 3, run: the recipe with the reward model as the only weighted signal."""
    from pipeline.run.cli import main as run_main

    folder, _, _ = reward_model
    out = tmp_path / "run"
    recipe = ROOT / "configs" / "tiny_reward_model.yaml"
    code = run_main(
        [
            "--config",
            str(recipe),
            "--model_name_or_path",
            models["base"],
            "--build_tiny_model",
            "false",
            "--warmup_sft_steps",
            "0",
            "--reward_models",
            json.dumps({"correct": {"path": folder, "weight": 1.0, "batch_size": 8}}),
            "--output_dir",
            str(out),
            "--max_stage_steps",
            "3",
            "--min_stage_steps",
            "3",
            "--per_device_train_batch_size",
            "16",
            "--num_generations",
            "4",
            "--prompts_per_stage",
            "64",
            "--eval_prompts",
            "16",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
        ]
    )
    assert code == 0 and (out / "final" / "config.json").exists()
    records = [json.loads(line) for line in (out / "stage_1" / "metrics.jsonl").open()]
    steps = [r for r in records if "rewards/correct_reward_model/mean" in r]
    assert len(steps) == 3
    for r in steps:
        # The programs only watch (weight 0): GRPO's reward is the learned signal alone.
        assert r["reward"] == pytest.approx(r["rewards/correct_reward_model/mean"], abs=1e-4)
        assert 0 < r["rewards/correct_reward_model/mean"] < 1
    stage = json.loads((out / "curriculum_state.json").read_text())["stages"][0]
    assert stage["eval_reward"] > 0.5  # evaluated with the task's own reward (the base solves it)


def run_learning_bench(out: Path, *options: str) -> dict[str, str]:
    """`python bench/learning.py OPTIONS` in its own process; its `name: value` lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "bench" / "learning.py"), "--out", str(out), *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return {name: value for name, value in lines}


def test_rl_on_the_learned_model_alone_raises_first_attempt_correctness(models, tmp_path):
    """The three steps of docs/reward_models.md in the learning bench's setting: rate the warm policy's own
    replies, train a reward model on those ratings plus the made-up pairs, then train the
    policy with that model as its only reward. Held-out success is the task's correctness,
    which the policy never hears: only a reward model that ranks right sums first can raise
    it (shuffled, the same scores drove every seed to 0: docs/results.md)."""
    from pipeline.reward_model.collect import main as collect_main

    bench = tmp_path / "bench"
    warm = run_learning_bench(bench, "--task", "arithmetic", "--warm_only")["warm_checkpoint"]
    ratings = tmp_path / "ratings.jsonl"
    code = collect_main(
        [
            "--model", warm, "--task", "arithmetic", "--level", "1", "--prompts", "400",
            "--samples", "8", "--max_new_tokens", "12", "--output", str(ratings), "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    pairs = tmp_path / "pairs.jsonl"
    made_up = rated_pairs(tmp_path / "made_up.jsonl")
    pairs.write_text(ratings.read_text() + made_up.read_text())
    last = train_reward_model(pairs, models["base"], tmp_path / "rm")
    assert last.startswith("heldout_pair_accuracy: ") and float(last.split(": ")[1]) >= 0.9

    figures = run_learning_bench(
        bench, "--task", "arithmetic", "--methods", "grpo", "--steps", "300", "--seeds", "3",
        "--skip_gates", "--reward_model", str(tmp_path / "rm"),
    )  # fmt: skip
    start = float(figures["heldout_success_start"])
    assert start < 0.2  # the warm policy mostly fails level 1
    # The median of 3 seeds gains 0.05. Not every seed: one can collapse to 0 (1 of 3 in the
    # 2026-12-01 rerun, docs/results.md). With the scores shuffled (the control) all ended at 0.
    assert float(figures["heldout_success_equal_steps[grpo]"]) >= start + 0.05
