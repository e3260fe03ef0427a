"""The `dataset` task family: levels from a difficulty column, matching, sampling, loading."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from curriculum.tasks import get_task
from curriculum.tasks.answer_tags import extract_answer
from curriculum.tasks.dataset_task import answers_match, parse_number

datasets = pytest.importorskip("datasets")

RECORDS = [
    {"question": f"What is {i} + {i}?", "answer": str(2 * i), "difficulty": d}
    for i, d in enumerate([3, 1, 2, 10, 1, 2, 3, 10, 1, 1])
]


@pytest.fixture
def saved(tmp_path):
    """A `save_to_disk` folder of RECORDS."""
    path = tmp_path / "saved"
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(path))
    return str(path)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return str(path)


def test_levels_follow_sorted_numeric_difficulty(saved):
    task = get_task("dataset", path=saved)
    assert task.num_levels == 4  # 1, 2, 3, 10 (numeric order: 10 is last, not second)
    for level, value in zip(task.levels, [1, 2, 3, 10], strict=True):
        rows = task.generate(level, 6, seed=0)
        expected = {r["question"] for r in RECORDS if r["difficulty"] == value}
        assert {row["prompt"][-1]["content"] for row in rows} <= expected
        assert all(json.loads(row["meta"])["difficulty"] == value for row in rows)
        assert all(row["level"] == level and row["task"] == "dataset" for row in rows)


def test_string_difficulties_sort_lexicographically_or_by_order(tmp_path):
    records = [
        {"question": f"q{i}", "answer": "a", "difficulty": d}
        for i, d in enumerate(["medium", "easy", "hard", "easy"])
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(records))  # one JSON array, not jsonl
    plain = get_task("dataset", path=str(path))
    assert [json.loads(plain.generate(k, 1)[0]["meta"])["difficulty"] for k in plain.levels] == [
        "easy",
        "hard",
        "medium",
    ]
    ordered = get_task("dataset", path=str(path), difficulty_order=["easy", "medium", "hard"])
    assert [
        json.loads(ordered.generate(k, 1)[0]["meta"])["difficulty"] for k in ordered.levels
    ] == ["easy", "medium", "hard"]
    with pytest.raises(ValueError, match="hard"):
        get_task("dataset", path=str(path), difficulty_order=["easy", "medium"]).generate(1, 1)


def test_jsonl_matches_saved_folder(saved, jsonl):
    a, b = get_task("dataset", path=saved), get_task("dataset", path=jsonl)
    assert a.num_levels == b.num_levels
    for level in a.levels:
        assert a.generate(level, 5, seed=3) == b.generate(level, 5, seed=3)


def test_csv_and_parquet_files(tmp_path):
    table = datasets.Dataset.from_list(RECORDS)
    table.to_csv(str(tmp_path / "rows.csv"), index=False)
    table.to_parquet(str(tmp_path / "rows.parquet"))
    for name in ("rows.csv", "rows.parquet"):
        task = get_task("dataset", path=str(tmp_path / name))
        assert task.num_levels == 4
        row = task.generate(4, 1)[0]
        assert task.evaluate(row, task.reference(row)).reward == 1.0


def test_no_difficulty_column_is_one_level(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"q": f"q{i}", "a": str(i)}) + "\n" for i in range(5)))
    task = get_task(
        "dataset", path=str(path), prompt_column="q", answer_column="a", difficulty_column=None
    )
    assert task.num_levels == 1
    # Five rows: one held out, four to train on, each drawn once.
    assert len({r["prompt"][-1]["content"] for r in task.generate(1, 4, seed=1)}) == 4


@pytest.mark.parametrize("key", ["prompt_column", "answer_column", "difficulty_column"])
def test_missing_column_names_it_and_lists_columns(saved, key):
    task = get_task("dataset", path=saved, **{key: "nope"})
    with pytest.raises(ValueError, match=r"nope.*\['answer', 'difficulty', 'question'\]"):
        task.generate(1, 1)


def test_bad_config_values_raise(saved, tmp_path):
    with pytest.raises(ValueError, match="match.*exact"):
        get_task("dataset", path=saved, match="fuzzy")
    with pytest.raises(ValueError, match="path"):
        get_task("dataset", path="")
    with pytest.raises(ValueError, match="does not exist"):
        get_task("dataset", path=str(tmp_path / "absent.jsonl")).generate(1, 1)
    (tmp_path / "rows.txt").write_text("hello")
    with pytest.raises(ValueError, match="supported"):
        get_task("dataset", path=str(tmp_path / "rows.txt")).generate(1, 1)
    with pytest.raises(ValueError, match="difficulty_column"):
        get_task("dataset", path=saved, difficulty_column=3)


def test_split_of_a_saved_dataset_dict(tmp_path):
    path = str(tmp_path / "dict")
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(RECORDS),
            "test": datasets.Dataset.from_list(RECORDS[:2]),
        }
    ).save_to_disk(path)
    assert get_task("dataset", path=path, split="test").num_levels == 2
    with pytest.raises(ValueError, match=r"\['test', 'train'\]"):
        get_task("dataset", path=path, split="validation").generate(1, 1)


def test_generate_is_deterministic_and_without_replacement(saved):
    task = get_task("dataset", path=saved)
    assert task.generate(1, 3, seed=7) == task.generate(1, 3, seed=7)
    draws = [
        tuple(r["prompt"][-1]["content"] for r in task.generate(1, 3, seed=s)) for s in range(8)
    ]
    assert all(len(set(d)) == 3 for d in draws)  # three training rows (of four): no repeats
    assert len(set(draws)) > 1  # the seed changes the order
    # 8 draws from 3 rows: every row 2 or 3 times.
    counts = Counter(r["prompt"][-1]["content"] for r in task.generate(1, 8, seed=0))
    assert sorted(counts.values()) == [2, 3, 3] and len(counts) == 3


def prompts_of(rows) -> set[str]:
    return {r["prompt"][-1]["content"] for r in rows}


def test_evaluation_rows_are_never_training_rows(tmp_path):
    """Each level is split once: training draws (seeds below 10**6) and evaluation draws
    (from 10**6 on) never share a row, however many are drawn, as the issue's run did
    (4096 training prompts, 64 evaluation prompts)."""
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    path = tmp_path / "rows.jsonl"
    records = [{"question": f"q{i}", "answer": str(i), "difficulty": i % 3} for i in range(300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    task = get_task("dataset", path=str(path))
    for level in task.levels:
        train = prompts_of(task.generate(level, 4096, seed=10_000 + 1_000 * level))
        held_out = prompts_of(task.generate(level, 64, seed=HELD_OUT_SEED_BASE + level))
        assert len(train) == 90 and len(held_out) == 10 and not train & held_out
        # The same split on a new instance: a resume and pipeline.evaluate see it too.
        again = get_task("dataset", path=str(path))
        assert prompts_of(again.generate(level, 64, seed=HELD_OUT_SEED_BASE)) == held_out
    quarter = get_task("dataset", path=str(path), held_out_fraction=0.25)
    assert len(prompts_of(quarter.generate(1, 500, seed=HELD_OUT_SEED_BASE))) == 25


def test_a_column_marks_the_held_out_rows(tmp_path):
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    path = tmp_path / "rows.jsonl"
    records = [{"question": f"q{i}", "answer": "a", "test": i < 2} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    task = get_task("dataset", path=str(path), difficulty_column=None, held_out_column="test")
    assert prompts_of(task.generate(1, 50, seed=HELD_OUT_SEED_BASE)) == {"q0", "q1"}
    assert prompts_of(task.generate(1, 50, seed=0)) == {"q2", "q3", "q4", "q5"}
    with pytest.raises(ValueError, match="held_out_column 'question' must hold true/false"):
        get_task(
            "dataset", path=str(path), difficulty_column=None, held_out_column="question"
        ).generate(1, 1)
    none_held = get_task("dataset", path=str(path), difficulty_column=None, held_out_column="x")
    with pytest.raises(ValueError, match="held_out_column='x': no such column"):
        none_held.generate(1, 1)
    for bad in (0, 1, 1.5, "0.1"):
        with pytest.raises(ValueError, match="held_out_fraction must"):
            get_task("dataset", path=str(path), held_out_fraction=bad)


def test_a_level_of_one_row_trains_but_is_not_evaluated(tmp_path):
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    path = tmp_path / "rows.jsonl"
    records = [{"question": "q0", "answer": "a", "difficulty": 1}]
    path.write_text(json.dumps(records[0]) + "\n")
    task = get_task("dataset", path=str(path))
    assert prompts_of(task.generate(1, 2, seed=0)) == {"q0"}
    with pytest.raises(ValueError, match="level 1 has no held-out rows to evaluate on"):
        task.generate(1, 1, seed=HELD_OUT_SEED_BASE)


def test_reference_and_numeric_matching(saved):
    numeric = get_task("dataset", path=saved)
    exact = get_task("dataset", path=saved, match="exact")
    row = numeric.generate(4, 1, seed=0)[0]  # difficulty 10: answer "6" or "14"
    value = int(row["answer"])
    assert numeric.evaluate(row, numeric.reference(row)).solved
    assert numeric.evaluate(row, f"<think>easy</think>\n<answer> {value}.0 </answer>").reward == 1.0
    assert numeric.evaluate(row, f"<answer>{value * 2}/2</answer>").reward == 1.0
    assert exact.evaluate(row, f"<answer>{value}.0</answer>").reward == 0.0
    assert exact.evaluate(row, f"<answer> {value} </answer>").reward == 1.0
    wrong = numeric.evaluate(row, f"<answer>{value + 1}</answer>")
    assert wrong.reward == 0.0 and "not correct" in wrong.feedback["correctness"]
    assert str(value) not in wrong.feedback["correctness"].replace(str(value + 1), "")


def test_text_answers_ignore_case_and_spaces(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "Capital of France?", "answer": "Paris  City"}))
    task = get_task("dataset", path=str(path), difficulty_column=None)
    row = task.generate(1, 1)[0]
    assert task.evaluate(row, "<answer>paris city</answer>").reward == 1.0
    assert task.evaluate(row, "<answer>Lyon</answer>").reward == 0.0


def test_malformed_reply_with_right_answer_gets_half(saved):
    task = get_task("dataset", path=saved, reveal_answer=True)
    row = task.generate(1, 1)[0]
    half = task.evaluate(row, f"Sure! <answer>{row['answer']}</answer> Hope that helps.")
    assert half.reward == 0.5 and half.breakdown["format"] == 0.5
    assert set(half.feedback) == {"format", "correctness"}
    wrong = task.evaluate(row, "<answer>-1</answer>")
    assert f"The correct answer is '{row['answer']}'" in wrong.feedback["correctness"]


def test_conversational_prompts_keep_messages_and_gain_system_prompt(tmp_path):
    records = [
        {"question": [{"role": "user", "content": "Say hi"}], "answer": "hi", "difficulty": 1},
        {
            "question": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Say yo"},
            ],
            "answer": "yo",
            "difficulty": 2,
        },
    ]
    path = str(tmp_path / "chat")
    datasets.Dataset.from_list(records).save_to_disk(path)
    task = get_task("dataset", path=path, system_prompt="Answer in tags.")
    assert task.generate(1, 1)[0]["prompt"] == [
        {"role": "system", "content": "Answer in tags."},
        {"role": "user", "content": "Say hi"},
    ]
    assert task.generate(2, 1)[0]["prompt"] == records[1]["question"]


GARBAGE = [
    "",
    "   ",
    "no tags at all",
    "<answer>",
    "</answer><answer>",
    "<answer>" * 50_000,
    "x" * 1_000_000,
    "<answer>" + "1" * 1_000_000 + "</answer>",
    "<answer>1e999999999</answer>",
    "<answer>__import__('os').system('true')</answer>",
    "<answer>\x00\ud800</answer>",
    "<answer>1/0</answer>",
    "<think><answer>2</answer></think>",
]


@pytest.mark.parametrize("completion", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_scores_low_with_feedback(saved, completion):
    task = get_task("dataset", path=saved)
    row = task.generate(2, 1)[0]
    result = task.evaluate(row, completion)
    assert result.reward < 1.0 and result.feedback_text()
    assert set(result.breakdown) == set(task.signals)
    assert all(0.0 <= v <= 1.0 for v in result.breakdown.values())
    failed = {name for name, value in result.breakdown.items() if value < 1.0}
    assert failed <= set(result.feedback)


@given(st.text())
def test_extract_answer_never_raises(text):
    found = extract_answer(text)
    if found is not None:
        assert found.text == found.text.strip()
        assert found.text in text


@given(st.text(alphabet="<>/answerthik 1\n", max_size=80), st.text(max_size=30))
def test_extract_answer_finds_the_last_wrapped_answer(prefix, inner):
    inner = inner.replace("<", "").strip()
    found = extract_answer(f"{prefix}<answer>{inner}</answer>")
    assert found is not None and found.text == inner


@given(st.text(max_size=60), st.text(max_size=60))
def test_matching_never_raises_and_is_reflexive(a, b):
    for mode in ("exact", "numeric"):
        answers_match(a, b, mode)
        assert answers_match(a, a, mode)


def test_parse_number_forms():
    assert parse_number("1,234.50") == parse_number("1234.5")
    assert parse_number("-3/4") == parse_number("-0.75")
    assert parse_number(".5") == parse_number("1/2")
    for bad in ("1e5", "nan", "inf", "1/0", "12,34", "", "9" * 200, "0x10"):
        assert parse_number(bad) is None
