"""Reward-model inputs without a model: pairs files, ratings, run logs, judges, recipe entries."""

from __future__ import annotations

import doctest
import json

import pytest

import rewards.pairwise
from pipeline.reward_model.cli import main
from pipeline.reward_model.pairs import pairs_from_run, read_pairs, split_by_prompt
from pipeline.reward_model.signals import check_preference_function_specs, check_reward_model_specs
from rewards.pairwise import load_preference_function, win_rates

PROMPT = [{"role": "user", "content": "2+3"}]


def write_lines(path, lines):
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def test_pairs_and_ratings_become_pairs(tmp_path):
    path = write_lines(
        tmp_path / "pairs.jsonl",
        [
            {"prompt": PROMPT, "chosen": "<answer>5</answer>", "rejected": "<answer>6</answer>"},
            "",
            {"prompt": "q", "completion": "good", "score": 3},
            {"prompt": "q", "completion": "bad", "score": 1},
            {"prompt": "q", "completion": "middling", "score": 2},
            {"prompt": "r", "completion": "alone", "score": 5},
        ],
    )
    pairs = read_pairs(path)
    assert [(p.chosen, p.rejected) for p in pairs] == [
        ("<answer>5</answer>", "<answer>6</answer>"),
        ("good", "bad"),
        ("good", "middling"),
        ("middling", "bad"),
    ]
    assert [p.margin for p in pairs[1:]] == [2.0, 1.0, 1.0]  # rating differences


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "q", "chosen": "a", "rejected": ', "line 3: not valid JSON"),
        ('{"prompt": "q", "chosen": "a"}', "line 3: missing ['rejected']"),
        (
            '{"prompt": "q", "completion": "a", "score": "high"}',
            "line 3: 'score' must be a finite number",
        ),
        ('{"prompt": 7, "chosen": "a", "rejected": "b"}', "line 3: 'prompt' must be a string"),
        ('["q", "a", "b"]', "line 3: expected a JSON object"),
        ('{"question": "q"}', "line 3: expected a pair {prompt, chosen, rejected} or a rating"),
    ],
)
def test_a_malformed_pairs_file_names_the_line(tmp_path, bad_line, message):
    good = json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"})
    path = write_lines(tmp_path / "pairs.jsonl", [good, good, bad_line, good])
    with pytest.raises(ValueError) as err:
        read_pairs(path)
    assert f"{path}, {message}" in str(err.value)


def test_the_command_line_reports_the_bad_line_and_trains_nothing(tmp_path, capsys):
    path = write_lines(
        tmp_path / "pairs.jsonl", ['{"prompt": "q", "chosen": "a", "rejected": "b"}', "{oops"]
    )
    code = main(["--pairs", str(path), "--base", "unused", "--output", str(tmp_path / "rm")])
    assert code == 2
    assert f"error: {path}, line 2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


def test_pairs_from_a_run_use_rewards_or_a_persons_ratings(tmp_path):
    other = [{"role": "user", "content": "4+4"}]
    write_lines(
        tmp_path / "generations.jsonl",
        [
            {"step": 0, "prompt": PROMPT, "completion": "<answer>5</answer>", "reward": 1.0},
            {"step": 0, "prompt": PROMPT, "completion": "<answer>9</answer>", "reward": 0.2},
            {"step": 0, "prompt": PROMPT, "completion": "<answer>5</answer> ", "reward": 0.9},
            # A person rated two records of this prompt: their ratings win over the rewards.
            {"step": 20, "prompt": other, "completion": "eight", "reward": -0.5, "rating": 5},
            {
                "step": 20,
                "prompt": other,
                "completion": "<answer>9</answer>",
                "reward": 0.9,
                "rating": 1,
            },
            {"step": 20, "prompt": other, "completion": "<answer>7</answer>", "reward": 0.9},
        ],
    )
    pairs = {(p.chosen, p.rejected) for p in pairs_from_run(tmp_path)}
    assert pairs == {
        ("<answer>5</answer>", "<answer>9</answer>"),
        ("<answer>5</answer>", "<answer>5</answer> "),
        ("<answer>5</answer> ", "<answer>9</answer>"),
        ("eight", "<answer>9</answer>"),
    }


def test_pairs_from_a_folder_without_generations_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has no generations.jsonl"):
        pairs_from_run(tmp_path)


def test_held_out_prompts_are_never_trained_on(tmp_path):
    lines = [{"prompt": f"q{i % 10}", "chosen": f"a{i}", "rejected": f"b{i}"} for i in range(50)]
    train, held = split_by_prompt(read_pairs(write_lines(tmp_path / "p.jsonl", lines)), 0.2, seed=0)
    assert len({p.prompt for p in held}) == 2 and len(train) + len(held) == 50
    assert not {p.prompt for p in train} & {p.prompt for p in held}


def test_win_rates_within_each_prompt_group():
    assert doctest.testmod(rewards.pairwise).failed == 0
    # A judge that prefers the shorter reply: in each group the shortest wins every comparison.
    shorter = lambda prompt, a, b: 1.0 if len(a) < len(b) else 0.0 if len(a) > len(b) else 0.5  # noqa: E731
    rates = win_rates(["p"] * 4 + ["q"] * 2, ["aaaa", "a", "aa", "aa", "x", "yy"], shorter)
    assert rates == [0.0, 1.0, 0.5, 0.5, 1.0, 0.0]


def test_a_judge_returning_no_preference_is_named():
    with pytest.raises(ValueError, match="judge 'human' returned 'a'"):
        win_rates(["p", "p"], ["a", "b"], lambda prompt, a, b: "a", judge="human")


def test_preference_functions_are_imported_never_evaluated(tmp_path, monkeypatch):
    (tmp_path / "my_raters.py").write_text(
        "def prefer(prompt, a, b):\n    return len(a) < len(b)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    prefer = load_preference_function("my_raters:prefer")
    assert prefer("p", "a", "bb") is True
    with pytest.raises(ValueError, match="'module:function'"):
        load_preference_function("__import__('os').system('true')")
    with pytest.raises(ValueError, match="no callable 'missing'"):
        load_preference_function("my_raters:missing")
    with pytest.raises(ValueError, match="cannot import"):
        load_preference_function("no_such_module_here:prefer")


def test_recipe_entries_are_checked_and_completed():
    specs = check_reward_model_specs(
        {"helpful": {"path": "runs/rm", "weight": 0.3}, "short": "runs/rm2"}
    )
    assert specs["helpful"] == {
        "path": "runs/rm",
        "weight": 0.3,
        "objectives": None,
        "pairwise": False,
        "batch_size": 32,
        "max_length": 1024,
    }
    assert specs["short"]["weight"] == 1.0
    assert check_preference_function_specs({"human": {"function": "m:f", "weight": 2}}) == {
        "human": {"function": "m:f", "weight": 2.0}
    }
    for bad, message in [
        ({"x": {"weight": 1}}, "reward_models.x needs 'path'"),
        ({"x": {"path": "p", "wieght": 1}}, r"reward_models.x: unknown key\(s\) \['wieght'\]"),
        ({"x": {"path": "p", "weight": float("nan")}}, "reward_models.x.weight must be a finite"),
        ({"x": {"path": "p", "objectives": {"a": -1}}}, "reward_models.x.objectives.a must be"),
        ({"x": {"path": "p", "pairwise": "yes"}}, "reward_models.x.pairwise must be true or false"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_reward_model_specs(bad)
    with pytest.raises(
        ValueError, match="preference_functions.h.function must be 'module:function'"
    ):
        check_preference_function_specs({"h": {"function": "prefer"}})


def test_the_run_config_checks_the_new_options():
    from pipeline.run.config import RunConfig

    run = RunConfig(reward_models='{"rm": {"path": "runs/rm", "weight": 0.5}}')
    run.validate()
    assert run.reward_models["rm"]["weight"] == 0.5 and run.preference_functions == {}
    with pytest.raises(ValueError, match="reward_models.rm: unknown key"):
        RunConfig(reward_models={"rm": {"path": "p", "scale": 2}}).validate()
