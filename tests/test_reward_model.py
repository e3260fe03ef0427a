"""A reward model on the tiny model end to end, at the size that shows the wiring: rate,
train (`python -m pipeline.reward_model`), run the curriculum and the learning bench with
the learned model as the only training signal.

Whether the learned model ranks right sums first (held-out pair accuracy per format) and
whether RL on it alone raises first-attempt correctness are learning effects, measured
with seeds in `bench/learned_reward.py` (docs/results.md). The pairs and the format
conversions are that bench's, so both see the same data.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from pipeline.reward_model.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from learned_reward import (  # noqa: E402  (bench/, above)
    FORMATS,
    accuracy_of,
    in_format,
    synthetic_pairs,
    write_jsonl,
)

PROMPTS = 60  # level-1 additions: 80 pairs, 12 prompts held out


def train(pairs: Path, base: str, output: Path, *extra: str) -> list[str]:
    """`python -m pipeline.reward_model` for one optimizer step; its printed lines."""
    import contextlib
    import io

    stdout = io.StringIO()
    argv = ["--pairs", str(pairs), "--model_name_or_path", base, "--output_dir", str(output)]
    argv += ["--max_steps", "1", "--per_device_train_batch_size", "16"]
    argv += ["--heldout_fraction", "0.2", "--disable_tqdm", "true", *extra]
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return stdout.getvalue().strip().splitlines()


@pytest.fixture(scope="module")
def reward_model(tiny_model_dir, tmp_path_factory) -> str:
    """A reward model on the untrained tiny model, one step on the synthetic pairs."""
    out = tmp_path_factory.mktemp("reward-model")
    pairs = write_jsonl(synthetic_pairs(PROMPTS), out / "pairs.jsonl")
    train(pairs, tiny_model_dir, out / "rm")
    return str(out / "rm")


@pytest.mark.parametrize("name", FORMATS)
def test_each_trl_preference_format_parses_and_trains(tiny_model_dir, tmp_path, name):
    """The synthetic pairs in each of TRL's preference formats: every pair converts, the
    CLI reads the format, splits by prompt, trains a step, records the run and scores the
    held-out pairs."""
    from transformers import AutoTokenizer

    from pipeline.reward_model.signals import RewardModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rated = synthetic_pairs(PROMPTS)
    records = [r for r in (in_format(pair, name, tokenizer) for pair in rated) if r is not None]
    assert len(records) == len(rated)  # every pair fits every format
    margin = ["--margin", "true"] if "margins" in name else []
    pairs = write_jsonl(records, tmp_path / "pairs.jsonl")
    lines = train(pairs, tiny_model_dir, tmp_path / "rm", *margin)
    counts = next(
        m for line in lines if (m := re.fullmatch(r"pairs: (\d+) train, (\d+) held out", line))
    )
    assert counts and int(counts[1]) + int(counts[2]) == len(rated) and int(counts[2]) > 0, lines
    assert 0.0 <= accuracy_of(lines[-1]) <= 1.0
    info = json.loads((tmp_path / "rm" / "reward_model.json").read_text())
    assert info["margin"] is bool(margin) and info["heldout_pairs"] == int(counts[2])
    assert math.isfinite(info["train_loss"])
    scores = RewardModel(str(tmp_path / "rm")).raw_scores(
        [rated[0]["prompt"]], [rated[0]["chosen"]]
    )
    assert len(scores) == 1 and all(v == v for v in scores[0])


def test_the_curriculum_trains_on_the_learned_model_alone(tiny_model_dir, reward_model, tmp_path):
    """configs/tiny_reward_model.yaml: GRPO's reward is the learned signal alone (the
    programs only watch, with weight 0), and the stage is evaluated with the task's own
    reward on the saved stage model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from curriculum.tasks import get_task
    from pipeline.evaluate.first_attempts import evaluate_first_attempts
    from pipeline.run.cli import main as run_main

    out = tmp_path / "run"
    code = run_main(
        [
            "--config", str(ROOT / "configs" / "tiny_reward_model.yaml"),
            "--model_name_or_path", tiny_model_dir, "--build_tiny_model", "false",
            "--warmup_sft_steps", "0",
            "--reward_models", json.dumps({"correct": {"path": reward_model, "weight": 1.0, "batch_size": 8}}),
            "--output_dir", str(out), "--max_stage_steps", "2", "--min_stage_steps", "2",
            "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--max_completion_length", "8", "--reflection_max_completion_length", "8",
            "--prompts_per_stage", "16", "--eval_prompts", "4", "--save_strategy", "no",
            "--disable_tqdm", "true",
        ]
    )  # fmt: skip
    assert code == 0 and (out / "final" / "config.json").exists()
    records = [json.loads(line) for line in (out / "stage_1" / "metrics.jsonl").open()]
    steps = [r for r in records if "rewards/correct_reward_model/mean" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["reward"] == pytest.approx(r["rewards/correct_reward_model/mean"], abs=1e-4)
        assert 0 < r["rewards/correct_reward_model/mean"] < 1
    stage = json.loads((out / "curriculum_state.json").read_text())["stages"][0]
    model = AutoModelForCausalLM.from_pretrained(out / "stage_1")
    evaluation = evaluate_first_attempts(
        model, AutoTokenizer.from_pretrained(out / "stage_1"), get_task("arithmetic"), 1, 4,
        max_new_tokens=8, weights=None, progress=False,  # the task's own reward
    )  # fmt: skip
    assert stage["eval_reward"] == pytest.approx(evaluation.mean_reward)


def run_learning_bench(out: Path, *options: str) -> tuple[dict[str, str], str]:
    """`python bench/learning.py OPTIONS`, in this process (its backend is this one's);
    its `name: value` lines and all it printed."""
    import contextlib
    import io

    import learning  # bench/, on the path above

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        learning.main(["--out", str(out), *options])
    lines = (line.split(": ", 1) for line in stdout.getvalue().splitlines() if ": " in line)
    return {name: value for name, value in lines}, stdout.getvalue()


def test_the_learning_bench_trains_on_ratings_of_its_own_warm_policy(tiny_model_dir, tmp_path):
    """bench/learned_reward.py's part `rl`, shrunk: the bench's warm checkpoint, ratings of
    its own replies (`python -m pipeline.reward_model.collect`), a reward model on them plus
    synthetic pairs, and a GRPO arm of the bench whose only reward is that model."""
    from pipeline.reward_model.collect import main as collect_main

    bench = tmp_path / "bench"
    small = ["--task", "arithmetic", "--warmup_steps", "4", "--feedback_examples", "64"]
    small += ["--batch", "8", "--generations", "4", "--eval_n", "8", "--eval_every", "1"]
    figures, _ = run_learning_bench(bench, *small, "--warm_only")
    ratings = tmp_path / "ratings.jsonl"
    code = collect_main(
        [
            "--model_name_or_path", figures["warm_checkpoint"], "--task", "arithmetic", "--level", "1",
            "--prompts", "16", "--samples", "2", "--max_new_tokens", "8", "--output",
            str(ratings), "--disable_tqdm", "true",
        ]
    )  # fmt: skip
    assert code == 0 and ratings.read_text()
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        ratings.read_text()
        + write_jsonl(synthetic_pairs(PROMPTS), tmp_path / "s.jsonl").read_text()
    )
    train(pairs, tiny_model_dir, tmp_path / "rm")

    figures, printed = run_learning_bench(
        bench, *small, "--methods", "grpo", "--steps", "2", "--seeds", "1", "--skip_gates",
        "--reward_model", str(tmp_path / "rm"),
    )  # fmt: skip
    assert f"reward: the learned model {(tmp_path / 'rm').resolve()}#" in printed
    for name in ("heldout_success_start", "heldout_success_equal_steps[grpo]"):
        assert 0.0 <= float(figures[name]) <= 1.0, name
    assert "heldout_mean_equal_steps[grpo]" in figures  # what bench/learned_reward.py prints
