"""The reasoning-gym adapter: curriculum levels, rescoring from rows, hostile completions."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks import get_task

rg_factory = pytest.importorskip("reasoning_gym.factory")
from curriculum.tasks.reasoning_gym_adapter import REFUSED_DATASETS  # noqa: E402

# Datasets checked at every level, with their level count under reasoning-gym 0.1.25.
ALL_LEVELS = {"chain_sum": 11, "basic_arithmetic": 5, "leg_counting": 36}

GARBAGE = [
    "",
    "no tags",
    "<answer></answer>",
    "<answer>" * 100_000,
    "y" * 1_000_000,
    "<answer>" + "7" * 1_000_000 + "</answer>",
    "<answer>__import__('os').system('true')</answer>",
    "<answer>" + "(" * 5000 + "</answer>",
    "<answer>1e999999999</answer>",
    "<answer>[[1, 2], [3]]</answer>",
    "<answer>\x00\ud800</answer>",
    "</answer><answer>",
]


def _meta(row):
    return json.loads(row["meta"])


@pytest.fixture(scope="module")
def chain_sum():
    return get_task("reasoning_gym", dataset="chain_sum")


@pytest.mark.parametrize("name", sorted(ALL_LEVELS))
def test_every_level_is_deterministic_and_its_reference_scores_one(name):
    task = get_task("reasoning_gym", dataset=name)
    assert task.num_levels == ALL_LEVELS[name]
    for level in task.levels:
        rows = task.generate(level, 2, seed=level)
        assert rows == task.generate(level, 2, seed=level)
        assert all(r["level"] == level and r["task"] == "reasoning_gym" for r in rows)
        for row in rows:
            assert not _meta(row)["regenerate"]  # these rescore from the JSON copy
            result = task.evaluate(row, task.reference(row))
            assert result.solved and result.reward == 1.0 and not result.feedback


def test_row_i_uses_seed_plus_i(chain_sum):
    batch = chain_sum.generate(3, 3, seed=40)
    assert [r["prompt"][-1]["content"] for r in batch] == [
        chain_sum.generate(3, 1, seed=40 + i)[0]["prompt"][-1]["content"] for i in range(3)
    ]
    assert batch != chain_sum.generate(3, 3, seed=41)


def test_level_k_sets_each_attribute_to_its_kth_value(chain_sum):
    # chain_sum: terms 2..12 (11 levels), digits 1..10 (10 levels, so level 11 clamps).
    for level in (1, 4, 11):
        terms, digits = level + 1, min(level, 10)
        assert chain_sum.level_config(level) == {
            "min_terms": terms,
            "max_terms": terms,
            "min_digits": digits,
            "max_digits": digits,
        }
        for row in chain_sum.generate(level, 5, seed=0):
            metadata = _meta(row)["metadata"]
            assert (metadata["num_terms"], metadata["num_digits"]) == (terms, digits)


def test_inclusive_mode_keeps_easier_values():
    task = get_task("reasoning_gym", dataset="chain_sum", range_mode="inclusive")
    assert task.level_config(5) == {
        "min_terms": 2,
        "max_terms": 6,
        "min_digits": 1,
        "max_digits": 5,
    }
    seen = {_meta(r)["metadata"]["num_terms"] for r in task.generate(5, 40, seed=0)}
    assert min(seen) < 4 and max(seen) > 4


def test_levels_that_reasoning_gym_rejects_are_skipped():
    # caesar_cipher's curriculum goes up to rotation 50, its config allows 25 at most.
    task = get_task("reasoning_gym", dataset="caesar_cipher")
    assert task.num_levels == 2
    assert all(task.level_config(k)["max_rotation"] <= 25 for k in task.levels)
    # knight_swap needs at least 6 nodes: "inclusive" keeps 4 at every level.
    with pytest.raises(ValueError, match="min_nodes"):
        get_task("reasoning_gym", dataset="knight_swap", range_mode="inclusive")


def test_dataset_without_curriculum_has_one_level():
    task = get_task("reasoning_gym", dataset="gsm_symbolic")
    assert task.num_levels == 1
    row = task.generate(1, 1, seed=5)[0]
    assert task.evaluate(row, task.reference(row)).reward == 1.0


def test_config_overrides_apply_at_every_level():
    task = get_task("reasoning_gym", dataset="chain_sum", config={"min_digits": 3, "max_digits": 3})
    for level in (1, 6):
        assert all(_meta(r)["metadata"]["num_digits"] == 3 for r in task.generate(level, 3))


def test_bad_names_and_config_raise_value_error():
    with pytest.raises(
        ValueError, match=r"unknown reasoning-gym dataset 'chain_summ'.*'chain_sum'"
    ):
        get_task("reasoning_gym", dataset="chain_summ")
    with pytest.raises(ValueError, match="dataset"):
        get_task("reasoning_gym")
    with pytest.raises(ValueError, match=r"eval"):
        get_task("reasoning_gym", dataset="countdown")
    with pytest.raises(ValueError, match=r"any non-empty answer"):
        get_task("reasoning_gym", dataset="game_of_life_halting")
    with pytest.raises(ValueError, match=r"valid keys: .*'max_digits'.*'min_terms'"):
        get_task("reasoning_gym", dataset="chain_sum", config={"digits": 3})
    with pytest.raises(ValueError, match="seed"):
        get_task("reasoning_gym", dataset="chain_sum", config={"seed": 3})
    with pytest.raises(ValueError, match="range_mode"):
        get_task("reasoning_gym", dataset="chain_sum", range_mode="all")
    with pytest.raises(ValueError, match="no level"):
        get_task("reasoning_gym", dataset="chain_sum", config={"min_terms": 0})


@pytest.mark.parametrize(("name", "level"), [("rearc", 1), ("arc_1d", 4)])
def test_entries_rebuilt_or_regenerated_rescore_like_the_original(name, level):
    task = get_task("reasoning_gym", dataset=name)
    for row in task.generate(level, 2, seed=9):
        assert task.evaluate(row, task.reference(row)).reward == 1.0
    # rearc grids are tuples that JSON turns into lists: those rows regenerate the entry.
    assert _meta(row)["regenerate"] == (name == "rearc")


@pytest.mark.parametrize("level", [2, 4])
def test_sokoban_reference_solves_and_bad_plans_fail(level):
    task = get_task("reasoning_gym", dataset="sokoban")
    row = task.generate(level, 1, seed=0)[0]
    assert task.evaluate(row, task.reference(row)).reward == 1.0
    result = task.evaluate(row, "<answer>UUUU</answer>")
    assert result.reward < 1.0 and "not correct" in result.feedback["correctness"]


def test_wrong_answer_feedback_and_reveal(chain_sum):
    row = chain_sum.generate(2, 1, seed=3)[0]
    wrong = str(int(row["answer"]) + 1)
    hidden = chain_sum.evaluate(row, f"<answer>{wrong}</answer>")
    assert hidden.feedback["correctness"] == f"The answer '{wrong}' is not correct."
    revealing = get_task("reasoning_gym", dataset="chain_sum", reveal_answer=True)
    shown = revealing.evaluate(row, f"<answer>{wrong}</answer>")
    assert f"The correct answer is '{row['answer']}'" in shown.feedback["correctness"]
    half = chain_sum.evaluate(row, f"The sum is <answer>{row['answer']}</answer>, done.")
    assert half.reward == 0.5 and set(half.feedback) == {"format", "correctness"}
    think = chain_sum.evaluate(row, f"<think>add them</think> <answer>{row['answer']}</answer>")
    assert think.reward == 1.0


@pytest.mark.parametrize(
    "name", ["chain_sum", "coin_flip", "leg_counting", "propositional_logic", "rearc"]
)
@pytest.mark.parametrize("completion", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises_and_scores_low(name, completion):
    task = _cached_task(name)
    row = task.generate(1, 1, seed=1)[0]
    result = task.evaluate(row, completion)
    assert result.reward < 1.0 and result.feedback_text()
    assert set(result.breakdown) == set(task.signals)
    assert {n for n, v in result.breakdown.items() if v < 1.0} <= set(result.feedback)


def test_overlong_answer_is_an_error_not_a_scorer_call(chain_sum):
    row = chain_sum.generate(1, 1)[0]
    result = chain_sum.evaluate(row, "<answer>" + "1 " * 20_000 + "</answer>")
    assert result.error is not None and "too long" in result.error


def test_huge_exponent_is_an_error_not_a_hang():
    # coin_flip's scorer calls Fraction(answer): "1e99999999" would build a 10**99999999.
    task = _cached_task("coin_flip")
    row = task.generate(1, 1)[0]
    assert "exponent" in task.evaluate(row, "<answer>1e99999999</answer>").error
    assert task.evaluate(row, "<answer>5e-1</answer>").error is None


def test_a_raising_scorer_becomes_an_error():
    # prime_factorization's scorer raises ValueError on an answer that is not a product.
    task = get_task("reasoning_gym", dataset="prime_factorization")
    row = task.generate(1, 1, seed=0)[0]
    result = task.evaluate(row, "<answer>abc</answer>")
    assert result.error is not None and "could not be checked" in result.error


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_random_completions_never_raise(text):
    task = _cached_task("chain_sum")
    row = task.generate(1, 1)[0]
    result = task.evaluate(row, text)
    assert 0.0 <= result.reward <= 1.0


def test_refused_scorers_and_audit_of_the_rest():
    """No permitted dataset's score_answer calls eval/exec/sympy parsing on the answer."""
    datasets = rg_factory.DATASETS
    assert set(REFUSED_DATASETS) <= set(datasets)
    pattern = re.compile(r"\beval\(|\bexec\(|parse_expr|sympify")
    unsafe = {
        name
        for name, (cls, _) in datasets.items()
        if pattern.search(inspect.getsource(cls.score_answer))
    }
    # number_sorting evals its own oracle answer (entry["answer"]), never the model's.
    unsafe -= {"number_sorting"}
    assert unsafe <= set(REFUSED_DATASETS), sorted(unsafe - set(REFUSED_DATASETS))


def test_module_does_not_import_reasoning_gym_until_used():
    code = (
        "import sys, curriculum.tasks.reasoning_gym_adapter; "
        "assert 'reasoning_gym' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


_TASKS: dict = {}


def _cached_task(name):
    if name not in _TASKS:
        _TASKS[name] = get_task("reasoning_gym", dataset=name)
    return _TASKS[name]
