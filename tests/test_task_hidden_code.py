"""hidden_code: a code of letters shared by every prompt, feedback that names each wrong
letter's digit, held-out prompts that are combinations never trained on."""

from __future__ import annotations

import json
import re

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.base import HELD_OUT_SEED_BASE
from curriculum.tasks.hidden_code import ALPHABET, LEVELS, HiddenCodeTask
from curriculum.tasks.registry import check_task_rows


def test_rows_are_deterministic_and_valid_at_every_level():
    task = get_task("hidden_code", rule_seed=3)
    check_task_rows(task)
    for level in task.levels:
        first = task.generate(level, 20, seed=7)
        assert first == get_task("hidden_code", rule_seed=3).generate(level, 20, seed=7)
        assert first != task.generate(level, 20, seed=8)
        letters, width = LEVELS[level]
        for row in first:
            symbols = row["prompt"][-1]["content"].split(" ")
            assert len(symbols) == width and set(symbols) <= set(task.code(level))
            assert task.meta(row)["symbols"] == symbols
            assert row["answer"] == "".join(task.code(level)[s] for s in symbols)
            assert task.evaluate(row, task.reference(row)).solved
            assert task.reference(row) == f"<answer>{pairs(symbols, row['answer'])}</answer>"


@pytest.mark.parametrize("level", [1, 2, 3])
def test_held_out_combinations_are_disjoint_from_training_and_reuse_every_letter(level):
    from pipeline.evaluate.first_attempts import held_out_seed

    task = HiddenCodeTask()
    train, held = set(task.combinations(level, "train")), set(task.combinations(level, "held_out"))
    assert train and held and not train & held
    assert train | held == set(task.combinations(level, "all"))
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25
    # Every letter, at every place, is trained in some combination and held out in others.
    for place in range(LEVELS[level][1]):
        assert {c[place] for c in train} == {c[place] for c in held} == set(task.code(level))
    # What pipeline.run draws: stage rows below the evaluation seeds, evaluations above.
    stage = task.generate(level, 300, seed=HELD_OUT_SEED_BASE - 300)
    evaluation = task.generate(level, 100, seed=held_out_seed(level))
    assert {tuple(task.meta(r)["symbols"]) for r in stage} <= train
    assert {tuple(task.meta(r)["symbols"]) for r in evaluation} <= held
    assert all(task.meta(r)["split"] == "held_out" for r in evaluation)
    whole = task.split_rows(level, "held_out")
    assert [tuple(task.meta(r)["symbols"]) for r in whole] == task.combinations(level, "held_out")


def test_the_large_levels_draw_without_listing_and_keep_the_split():
    task = HiddenCodeTask()
    with pytest.raises(ValueError, match="1,000,000 combinations"):
        task.combinations(5, "train")
    rows = task.generate(5, 50, seed=HELD_OUT_SEED_BASE)
    weights = (3, 7, 11, 13, 17, 19)
    order = list(task.code(5))
    for row in rows:
        places = [order.index(s) for s in task.meta(row)["symbols"]]
        assert sum(w * p for w, p in zip(weights, places)) % 5 == 0


def test_the_code_is_fixed_per_rule_seed_and_grows_with_the_level():
    task = get_task("hidden_code", rule_seed=1)
    codes = [task.code(level) for level in task.levels]
    assert [len(c) for c in codes] == [LEVELS[level][0] for level in task.levels]
    for lower, higher in zip(codes, codes[1:]):  # a higher level extends the lower one
        assert list(higher.items())[: len(lower)] == list(lower.items())
    assert sorted(codes[-1]) == sorted(ALPHABET) and sorted(codes[-1].values()) == list(
        "0123456789"
    )
    assert task.rule_text(1) == " ".join(f"{k}={v}" for k, v in codes[0].items())
    assert len({get_task("hidden_code", rule_seed=s).rule_text(1) for s in range(10)}) == 10


def pairs(symbols, digits) -> str:
    return " ".join(f"{s}={d}" for s, d in zip(symbols, digits))


def test_feedback_names_each_wrong_letter_once_and_no_letter_the_prompt_lacks():
    task = get_task("hidden_code", rule_seed=2)
    code = task.code(2)
    row = next(r for r in task.generate(2, 200, seed=0) if len(set(task.meta(r)["symbols"])) == 2)
    symbols, answer = task.meta(row)["symbols"], row["answer"]
    assert task.reference(row) == f"<answer>{pairs(symbols, answer)}</answer>"
    wrong = "".join(str((int(d) + 1) % 10) for d in answer)
    evaluation = task.evaluate(row, f"<answer>{pairs(symbols, wrong)}</answer>")
    text = evaluation.feedback["correctness"]
    assert text.startswith(f"The answer {pairs(symbols, wrong)} is wrong: ")
    lesson = text.rpartition(": ")[2]
    named = re.findall(r"([A-Z])=(\d)", lesson)
    assert sorted(named) == sorted({(s, code[s]) for s in symbols})  # each once, its digit
    assert not set(re.findall(r"[A-Z]", text)) - set(symbols) - set("T")  # "The ..."
    assert evaluation.breakdown == {"format": 1.0, "correctness": 0.0, "milestones": 0.0}
    # One letter right: partial credit counts it; a letter used once is no longer named.
    partly = task.evaluate(row, f"<answer>{pairs(symbols, answer[0] + wrong[1:])}</answer>")
    assert partly.breakdown["milestones"] == pytest.approx(1 / 3)
    if symbols[0] not in symbols[1:]:
        assert f"{symbols[0]}=" not in partly.feedback["correctness"].rpartition(": ")[2]
    assert "The correct answer" not in text
    revealed = get_task("hidden_code", rule_seed=2, reveal_answer=True)
    told = revealed.evaluate(row, "<answer>0 0 0</answer>").feedback_text()
    assert f"The correct answer is {pairs(symbols, answer)}." in told


@pytest.mark.parametrize(
    "reply, correctness, milestones, in_feedback",
    [
        ("ANSWER", 0.0, 0.0, "No <answer>"),  # no tag: the fallback
        ("<answer>x y z</answer>", 0.0, 0.0, "is not A=d B=d pairs: "),
        ("<answer></answer>", 0.0, 0.0, "The answer is empty: "),
        ("<answer>1 2 3</answer>", 0.0, 0.0, "is not A=d B=d pairs"),  # digits alone
        ("<answer>" + "Q=9 " * 5000 + "</answer>", 0.0, None, "..."),
        ("<answer>REF Q=0</answer>", 0.0, 0.75, "too many"),  # padding earns no full credit
        ("Sure! <answer>REF</answer>", 0.0, 1.0, "tag alone"),
    ],
)
def test_hostile_and_malformed_replies_are_scored_without_raising(
    reply, correctness, milestones, in_feedback
):
    task = HiddenCodeTask()
    row = task.generate(1, 1, seed=11)[0]
    reply = reply.replace("REF", task.reference(row)[len("<answer>") : -len("</answer>")])
    evaluation = task.evaluate(row, reply)
    assert evaluation.breakdown["correctness"] == correctness
    if milestones is None:  # 5,000 pairs: at most 3 right
        assert evaluation.breakdown["milestones"] <= 3 / 5000
    else:
        assert evaluation.breakdown["milestones"] == pytest.approx(milestones)
    assert in_feedback in evaluation.feedback_text()
    assert all(len(text) <= 300 for text in evaluation.feedback.values())
    json.dumps(evaluation.breakdown)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"split": "test"}, "split must be one of"),
        ({"rule_seed": "1"}, "rule_seed must be an integer"),
        ({"held_out_mod": 1}, "held_out_mod must be an integer in 2..7"),
        ({"letters": 3}, "unknown config key"),
    ],
)
def test_bad_config_is_refused_naming_the_value(config, message):
    with pytest.raises(ValueError, match=message):
        get_task("hidden_code", **config)


def test_levels_are_checked():
    with pytest.raises(ValueError, match="valid levels: 1..5"):
        HiddenCodeTask().generate(6, 1)
