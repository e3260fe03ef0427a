"""On-policy ratings: the policy's own sampled replies, rated by the task's verifier."""

from __future__ import annotations

import json

from curriculum.tasks import get_task
from curriculum.tasks.base import prompt_key
from pipeline.reward_model.collect import SEED_OFFSET, main


def collect(model, output, *extra):
    return main(
        [
            "--model",
            model,
            "--task",
            "arithmetic",
            "--level",
            "1",
            "--prompts",
            "4",
            "--samples",
            "6",
            "--max_new_tokens",
            "12",
            "--output",
            str(output),
            "--quiet",
            *extra,
        ]
    )


def test_ratings_are_the_policys_distinct_replies_scored_by_the_verifier(tiny_model_dir, tmp_path):
    assert collect(tiny_model_dir, tmp_path / "a.jsonl") == 0
    ratings = [json.loads(line) for line in (tmp_path / "a.jsonl").open()]
    task = get_task("arithmetic")
    rows = {prompt_key(r["prompt"]): r for r in task.generate(1, 4, seed=SEED_OFFSET)}
    keys = [(prompt_key(r["prompt"]), r["completion"]) for r in ratings]
    assert len(keys) == len(set(keys))  # a reply repeated in the samples is written once
    for rating in ratings:
        assert set(rating) == {"prompt", "completion", "score"}
        row = rows[prompt_key(rating["prompt"])]  # training prompts of the seed given
        assert rating["score"] == task.evaluate(row, rating["completion"]).reward
    for key in rows:
        assert 1 <= sum(k == key for k, _ in keys) <= 6
    # Seeded: the same command writes the same file.
    assert collect(tiny_model_dir, tmp_path / "b.jsonl") == 0
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_bad_values_are_named(tiny_model_dir, tmp_path, capsys):
    assert collect(tiny_model_dir, tmp_path / "x.jsonl", "--level", "9") == 2
    assert "--level is not a level of task 'arithmetic' (9)" in capsys.readouterr().err
    assert collect(tiny_model_dir, tmp_path / "x.jsonl", "--seed", str(SEED_OFFSET)) == 2
    assert f"--seed must be in [0, {SEED_OFFSET})" in capsys.readouterr().err
    assert collect(tiny_model_dir, tmp_path / "x.jsonl", "--temperature", "0") == 2
    assert "--temperature must be a finite number > 0 (0.0)" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
