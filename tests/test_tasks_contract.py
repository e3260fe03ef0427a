"""The contract every registered task family keeps, checked the same way for all of them.

Per family and level: generation is deterministic and in the common schema, the reference
solves the row with every signal at its maximum, and bad or hostile completions never
raise, score below 1.0, keep every signal in [0, 1] and get feedback.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from conftest import family_config

from curriculum.tasks import SIGNALS, Evaluation, Task, get_task, list_tasks

ROW_KEYS = {"prompt", "task", "level", "answer", "meta"}

# Hostile text must stay text: if anything ever evaluated it, this file would appear.
PWNED = "pwned"


def load_family(name: str, data_dir: Path) -> Task:
    """The family's task; skipped only while its module is still being written."""
    try:
        return get_task(name, **family_config(name, data_dir))
    except ImportError as exc:
        if exc.name is not None and exc.name.startswith("curriculum.tasks."):
            pytest.skip(f"task module {exc.name} does not exist yet")
        raise


def bad_completions(reference: str, tmp_path: Path) -> dict[str, str]:
    """Completions that must never solve a row, whatever the family."""
    command = f"__import__('os').system('touch {tmp_path / PWNED}')"
    return {
        "empty": "",
        "whitespace": " \n\t ",
        "garbage": "Sure! Here is my answer: banana. Hope this helps.",
        "truncated reference": reference[: len(reference) // 2],
        "empty answer": "<answer></answer>",
        "enormous": "A" * 1_000_000,
        "enormous answer": "<answer>" + "1 " * 500_000 + "</answer>",
        "surrogates": "\udcff\x00\ufffd" * 50,
        "surrogates in answer": "<answer>\udcff\x00\ufffd</answer>",
        "hostile": f"<answer>{command}</answer>",
        "hostile json": f'<answer>{{"actions": "{command}", "__class__": 1}}</answer>',
        "power tower": "<answer>9**9**9**9</answer>",
        "deep nesting": "<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>",
    }


def check_evaluation(task: Task, evaluation: Evaluation, what: str) -> None:
    """Reward and breakdown in [0, 1], covering every signal the family declares."""
    assert isinstance(evaluation, Evaluation), what
    assert 0.0 <= evaluation.reward <= 1.0 and math.isfinite(evaluation.reward), what
    missing = set(task.signals) - set(evaluation.breakdown)
    assert not missing, f"{what}: breakdown lacks {missing}"
    for signal, value in evaluation.breakdown.items():
        assert signal in SIGNALS, f"{what}: unknown signal {signal!r}"
        assert math.isfinite(value) and 0.0 <= value <= 1.0, f"{what}: {signal}={value}"


@pytest.mark.parametrize("name", list_tasks())
def test_generation_is_deterministic_and_in_the_common_schema(name, data_dir):
    datasets = pytest.importorskip("datasets")
    task = load_family(name, data_dir)
    assert set(task.signals) <= set(SIGNALS) and task.num_levels >= 1
    all_rows = []
    for level in task.levels:
        rows = task.generate(level, 8, seed=0)
        assert rows == task.generate(level, 8, seed=0), f"level {level}: not deterministic"
        fresh = load_family(name, data_dir)  # no hidden state carried between calls or instances
        assert rows == fresh.generate(level, 8, seed=0), f"level {level}: differs on a new instance"
        assert rows != task.generate(level, 8, seed=1), f"level {level}: seed changes nothing"
        for row in rows:
            assert set(row) == ROW_KEYS, f"level {level}: keys {sorted(row)}"
            assert row["task"] == name and row["level"] == level
            assert isinstance(row["answer"], str) and isinstance(json.loads(row["meta"]), dict)
            assert row["prompt"] and all(
                set(m) == {"role", "content"} and isinstance(m["content"], str)
                for m in row["prompt"]
            ), f"level {level}: prompt {row['prompt']!r}"
        all_rows += rows
    # All levels in one dataset: the schema is common, not just per level.
    assert datasets.Dataset.from_list(all_rows).to_list() == all_rows


@pytest.mark.parametrize("name", list_tasks())
def test_reference_solves_every_row_with_every_signal_at_its_maximum(name, data_dir):
    task = load_family(name, data_dir)
    for level in task.levels:
        for row in task.generate(level, 6, seed=11):
            evaluation = task.evaluate(row, task.reference(row))
            what = f"level {level} reference {task.reference(row)!r}"
            check_evaluation(task, evaluation, what)
            assert evaluation.error is None and evaluation.reward == 1.0, f"{what}: {evaluation}"
            assert all(evaluation.breakdown[s] == 1.0 for s in task.signals), (
                f"{what}: {evaluation}"
            )


@pytest.mark.parametrize("name", list_tasks())
def test_bad_and_hostile_completions_score_low_with_feedback(name, data_dir, tmp_path):
    task = load_family(name, data_dir)
    for level in task.levels:
        row = task.generate(level, 1, seed=5)[0]
        for kind, completion in bad_completions(task.reference(row), tmp_path).items():
            what = f"level {level}, {kind} completion"
            evaluation = task.evaluate(row, completion)
            check_evaluation(task, evaluation, what)
            assert evaluation.reward < 1.0 and not evaluation.solved, f"{what}: {evaluation}"
            assert evaluation.feedback_text().strip(), f"{what}: no feedback"
            assert evaluation.feedback_text(task.signals).strip(), f"{what}: no feedback"
    assert not (tmp_path / PWNED).exists()


@pytest.mark.parametrize("name", list_tasks())
def test_unclosed_answer_tags_are_scored_in_linear_time(name, data_dir):
    """A model stuck repeating `<answer>` must not stall training (a lazy regex is quadratic)."""
    task = load_family(name, data_dir)
    row = task.generate(task.num_levels, 1)[0]
    start = time.perf_counter()
    evaluation = task.evaluate(row, "<answer>" * 8_000)  # 64 kB: ~4 s if quadratic, ~1 ms if not
    elapsed = time.perf_counter() - start
    check_evaluation(task, evaluation, "unclosed tags")
    assert elapsed < 0.5, f"64 kB of unclosed <answer> tags took {elapsed:.2f} s to score"
