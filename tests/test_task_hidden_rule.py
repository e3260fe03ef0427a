"""hidden_rule: one unstated rule for every prompt; held-out prompts disjoint from training."""

from __future__ import annotations

import json

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.hidden_rule import HELD_OUT_SEED_BASE, LEVELS, HiddenRuleTask


def test_the_held_out_seed_base_is_the_evaluations():
    from pipeline.evaluate.first_attempts import EVAL_SEED_BASE, held_out_seed

    assert HELD_OUT_SEED_BASE == EVAL_SEED_BASE
    assert all(held_out_seed(level) >= HELD_OUT_SEED_BASE for level in LEVELS)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_training_and_held_out_prompts_are_disjoint(level):
    from pipeline.evaluate.first_attempts import held_out_seed

    task = HiddenRuleTask()
    train, held = set(task.pairs(level, "train")), set(task.pairs(level, "held_out"))
    assert train and held and not train & held
    assert train | held == set(task.pairs(level, "all"))
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25
    # What pipeline.run draws: stage data below the evaluation seeds, evaluations above.
    stage = task.generate(level, 400, seed=HELD_OUT_SEED_BASE - 400)
    evaluation = task.generate(level, 200, seed=held_out_seed(level))
    prompts = {json.dumps(r["prompt"]) for r in stage}
    assert all(task.meta(r)["split"] == "train" for r in stage)
    assert all(task.meta(r)["split"] == "held_out" for r in evaluation)
    assert not prompts & {json.dumps(r["prompt"]) for r in evaluation}
    # Every operand appears on both sides: the split holds out combinations, not digits.
    for side in (0, 1):
        assert {p[side] for p in train} == {p[side] for p in held}


def test_the_rule_is_shared_by_every_prompt_and_picked_by_the_rule_seed():
    task = get_task("hidden_rule", rule_seed=5)
    assert task.rule_text(1) == "a#b = a+b+3"
    assert all(int(r["answer"]) == task.meta(r)["a"] + task.meta(r)["b"] + 3
               for r in task.generate(1, 50, seed=0))  # fmt: skip
    four = get_task("hidden_rule", rule_seed=0, symbol="@")
    assert four.rule_text(4) == "a@b = a*2+b*2" and four.apply(4, 3, 5) == 16
    assert {get_task("hidden_rule", rule_seed=s).rule_text(1) for s in range(10)} != {
        task.rule_text(1)
    }


def test_levels_raise_the_rules_complexity():
    task = HiddenRuleTask()
    rows = {level: task.generate(level, 30, seed=1) for level in task.levels}
    assert all(r["prompt"][1]["content"].count("#") == 1 for rs in rows.values() for r in rs)
    assert "*" not in LEVELS[1][0] and "*" in LEVELS[2][0]
    assert len(LEVELS[4][2]) == 2  # two constants
    assert all(len(str(task.meta(r)["a"])) == 2 for r in rows[5])


def test_feedback_names_direction_and_size_but_never_the_answer_or_the_rule():
    task = get_task("hidden_rule", rule_seed=5)
    row = task.split_rows(1, "train")[0]
    answer, rule = row["answer"], task.rule_text(1)
    for reply, direction in (
        ("<answer>1</answer>", "too low"),
        ("<answer>12</answer>", "too high"),
    ):
        evaluation = task.evaluate(row, reply)
        text = evaluation.feedback_text()
        assert direction in text and answer not in text.replace(reply[8:-9], "")
        assert rule not in text and "+" not in text
    low = task.evaluate(row, f"<answer>{int(answer) - 3}</answer>")
    assert low.feedback["correctness"].endswith("it is 3 too low.")
    assert task.evaluate(row, task.reference(row)).solved
    revealed = get_task("hidden_rule", rule_seed=5, reveal_answer=True)
    assert (
        f"The correct answer is {answer}."
        in revealed.evaluate(row, "<answer>1</answer>").feedback_text()
    )


def test_split_rows_cover_a_split_once_and_fixed_splits_ignore_the_seed():
    task = HiddenRuleTask()
    held = task.split_rows(1, "held_out")
    assert len(held) == 20 == len({r["prompt"][1]["content"] for r in held})
    fixed = get_task("hidden_rule", split="held_out")
    assert all(fixed.meta(r)["split"] == "held_out" for r in fixed.generate(1, 20, seed=0))


def test_max_operand_widens_every_level_and_defaults_to_the_levels_own():
    default, wide = HiddenRuleTask(), get_task("hidden_rule", max_operand=24, rule_seed=5)
    assert len(default.pairs(1, "all")) == 100 and len(default.pairs(1, "held_out")) == 20
    assert default.pairs(5, "all")[0] == (10, 10) and default.pairs(5, "all")[-1] == (99, 99)
    for level in (1, 2):
        train, held = set(wide.pairs(level, "train")), set(wide.pairs(level, "held_out"))
        assert len(held) == 125 and len(train) == 500 and not train & held
        assert {a for pair in train | held for a in pair} == set(range(25))
        for side in (0, 1):  # the split still holds out combinations, not operands
            assert {p[side] for p in train} == {p[side] for p in held}
    rows = wide.generate(1, 200, seed=0)
    assert max(max(wide.meta(r)["a"], wide.meta(r)["b"]) for r in rows) > 9
    assert all(int(r["answer"]) == wide.meta(r)["a"] + wide.meta(r)["b"] + 3 for r in rows)
    # Level 5 starts at 10: a max_operand at or below it leaves no pairs, and says so.
    assert wide.pairs(5, "all")[0] == (10, 10) and wide.pairs(5, "all")[-1] == (24, 24)
    with pytest.raises(ValueError, match="max_operand 9 leaves level 5 no operands"):
        get_task("hidden_rule", max_operand=9).pairs(5, "all")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"split": "test"}, "split"),
        ({"symbol": ""}, "symbol"),
        ({"symbol": "a"}, "symbol"),
        ({"symbol": "+"}, "symbol"),
        ({"held_out_mod": 1}, "held_out_mod"),
        ({"rule_seed": "x"}, "rule_seed"),
        ({"max_operand": -1}, "max_operand"),
        ({"max_operand": "24"}, "max_operand"),
        ({"max_operand": True}, "max_operand"),
    ],
)
def test_bad_config_names_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        get_task("hidden_rule", **config)


def test_constants_fix_the_rule_beyond_the_levels_own_range():
    """`constants` states a rule the rule seeds never draw (the bench's warm-up decoys);
    a bad name or value is refused by name."""
    task = get_task("hidden_rule", constants={"k": 17}, max_operand=24)
    assert task.rule_text(1) == "a#b = a+b+17" and task.apply(1, 3, 4) == 24
    assert task.rule_text(2) == "a#b = a*17+b"
    row = task.generate(1, 1, seed=3)[0]
    meta = task.meta(row)
    assert int(row["answer"]) == meta["a"] + meta["b"] + 17
    for bad, words in (({"q": 2}, "'q' is not a rule constant"), ({"k": 0}, "k must be")):
        with pytest.raises(ValueError, match=words):
            get_task("hidden_rule", constants=bad)
