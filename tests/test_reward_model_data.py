"""Reward-model inputs without a model: pairs files, ratings, run logs, judges, recipe entries."""

from __future__ import annotations

import doctest
import json

import pytest

import rewards.pairwise
from pipeline.reward_model.cli import main
from pipeline.reward_model.pairs import (
    pairs_from_records,
    pairs_from_run,
    read_dataset,
    read_pairs,
    split_by_prompt,
)
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
    code = main(["--pairs", str(path), "--base", "unused", "--output_dir", str(tmp_path / "rm")])
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


def test_an_implicit_text_prompt_is_held_out_by_its_question(tmp_path):
    """`Q\n<answer>15</answer>` against `Q\n<answer>16</answer>` shares `Q\n<answer>1`,
    against `Q\n<answer>3</answer>` only `Q\n<answer>`: one question, two extracted prompts.
    Both pairs of a question land on one side of the split."""
    lines = []
    for q in range(20):
        question = f"What is {q}+5?\n"
        right = f"<answer>{q + 5}</answer>"
        for wrong in (q + 6, 3):  # the same first digit as the right sum or not (mostly)
            lines.append(
                {"chosen": question + right, "rejected": f"{question}<answer>{wrong}</answer>"}
            )
    pairs = read_pairs(write_lines(tmp_path / "p.jsonl", lines))
    assert len({p.prompt for p in pairs}) > 20  # extracted prompts: more than the questions
    train, held = split_by_prompt(pairs, 0.2, seed=0)
    assert len({p.question for p in held}) == 4 and len(train) + len(held) == 40
    assert not {p.question for p in train} & {p.question for p in held}
    assert all(p.prompt.startswith(p.question) for p in pairs)


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
    # Callable, but not a judge: refused by its arguments, before it is ever called.
    with pytest.raises(
        ValueError, match=r"'os:system' takes other arguments than \(prompt, a, b\) \(\(command\)\)"
    ):
        load_preference_function("os:system")
    (tmp_path / "two_args.py").write_text("def prefer(a, b):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"than \(prompt, a, b\) \(\(a, b\)\)"):
        load_preference_function("two_args:prefer")


def test_recipe_entries_are_checked_and_completed(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("def f(prompt, a, b):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
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


# ---- TRL's preference formats -----------------------------------------------------------

USER = [{"role": "user", "content": "2+3"}]


def said(text, role="assistant"):
    return [{"role": role, "content": text}]


# name -> (record, the pair read from it: prompt, chosen, rejected)
FORMATS = {
    "standard": ({"prompt": "2+3 =", "chosen": " 5", "rejected": " 6"}, ("2+3 =", " 5", " 6")),
    # TRL's extract_prompt: the longest common prefix, less a space before the difference.
    "standard, implicit prompt": (
        {"chosen": "2+3 = 5", "rejected": "2+3 = 6"},
        ("2+3 =", " 5", " 6"),
    ),
    "conversational": (
        {"prompt": USER, "chosen": said("5"), "rejected": said("6")},
        (USER, said("5"), said("6")),
    ),
    "conversational, implicit prompt": (
        {"chosen": USER + said("5"), "rejected": USER + said("6")},
        (USER, said("5"), said("6")),
    ),
    # Some TRL datasets keep a text prompt beside conversational pairs: the shared part wins.
    "conversational, implicit, with a text prompt": (
        {"prompt": "2+3", "chosen": USER + said("5"), "rejected": USER + said("6")},
        (USER, said("5"), said("6")),
    ),
    "messages prompt, text replies": (
        {"prompt": USER, "chosen": "5", "rejected": "6"},
        (USER, "5", "6"),
    ),
}


@pytest.mark.parametrize("name", FORMATS)
def test_every_trl_preference_format_is_read(tmp_path, name):
    record, expected = FORMATS[name]
    lines = [record, {**record, "margin": 0.5}]
    plain, weighted = read_pairs(write_lines(tmp_path / "pairs.jsonl", lines))
    assert (plain.prompt, plain.chosen, plain.rejected) == expected
    assert (plain.margin, weighted.margin) == (0.0, 0.5)


def test_the_implicit_prompt_is_the_one_trl_extracts():
    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl
    from trl import maybe_extract_prompt

    from pipeline.reward_model.formats import read_pair

    more = [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Q: 12+3\nA: 15", "rejected": "Q: 12+3\nA: 16"},
        {
            "chosen": USER + said("5") + USER + said("7"),
            "rejected": USER + said("5") + USER + said("8"),
        },
    ]
    for record in [r for r, _ in FORMATS.values() if "prompt" not in r] + more:
        pair, trl = read_pair("x", record), maybe_extract_prompt(record)
        assert (pair.prompt, pair.chosen, pair.rejected) == (
            trl["prompt"],
            trl["chosen"],
            trl["rejected"],
        )


def test_ratings_take_message_replies():
    records = [
        ("a", {"prompt": USER, "completion": said("5"), "score": 1}),
        ("b", {"prompt": USER, "completion": "6", "score": 0}),
    ]
    [pair] = pairs_from_records(records, "x")
    assert (pair.chosen, pair.rejected, pair.margin) == (said("5"), "6", 1.0)


# One malformed record of each format, and the error that names what is wrong with it.
MALFORMED = [
    ({"prompt": "q", "chosen": 5, "rejected": "b"}, "'chosen' must be a string or a list of {role, content} messages, got int"),
    ({"prompt": "q", "chosen": "a"}, "missing ['rejected']"),
    ({"chosen": "a", "rejected": "b", "margin": "big"}, "'margin' must be a finite number, got 'big'"),
    ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": float("nan")}, "'margin' must be a finite number, got nan"),
    ({"chosen": "yes", "rejected": "no"}, "no 'prompt', and 'chosen' and 'rejected' share no leading text"),
    ({"chosen": "q a", "rejected": "q a"}, "'chosen' and 'rejected' are the same"),
    ({"chosen": "q a", "rejected": "q ab"}, "all of 'chosen' is the start of the other reply: nothing of it is left"),
    ({"prompt": USER, "chosen": [{"role": "assistant"}], "rejected": said("6")}, "'chosen' must be a string or a list of {role, content} messages; its message 0 is {'role': 'assistant'}"),
    ({"prompt": USER, "chosen": said("5"), "rejected": "6"}, "'chosen' is a list of messages but 'rejected' is text: a pair's two replies take the same form"),
    ({"prompt": USER, "chosen": said("5"), "rejected": []}, "'rejected' holds no message"),
    ({"prompt": USER, "chosen": said("5"), "rejected": said("6", "user")}, "'rejected' message 0 has role 'user': a reply holds assistant messages only"),
    ({"chosen": USER + said("5"), "rejected": said("2+4", "user") + said("6")}, "no 'prompt', and 'chosen' and 'rejected' share no leading message"),
    ({"chosen": USER + said("5"), "rejected": USER}, "all of 'rejected' is the start of the other reply"),
    ({"chosen": USER + said("5"), "rejected": USER + said("2+4", "user")}, "'rejected' message 1 has role 'user' (after the 1 messages both replies share)"),
    ({"prompt": "2+3", "chosen": said("5"), "rejected": said("6")}, "'prompt' is text beside messages (TRL then reads the prompt from the replies), and 'chosen' and 'rejected' share no leading message"),
    ({"prompt": USER, "completion": said("5", "user"), "score": 1}, "'completion' message 0 has role 'user'"),
]  # fmt: skip


@pytest.mark.parametrize("record, message", MALFORMED)
def test_a_malformed_record_of_each_format_is_named(tmp_path, record, message):
    good = json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"})
    path = write_lines(tmp_path / "pairs.jsonl", [good, good, json.dumps(record)])
    with pytest.raises(ValueError) as err:
        read_pairs(path)
    assert str(err.value).startswith(f"{path}, line 3: ") and message in str(err.value)


# ---- --dataset_name: the same records from a `datasets` dataset ------------------------


def test_a_dataset_reads_like_its_jsonl(tmp_path):
    from datasets import Dataset, DatasetDict

    records = [
        {"prompt": USER, "chosen": said(f"{i}"), "rejected": said("no"), "margin": float(i)}
        for i in range(5)
    ]
    expected = read_pairs(write_lines(tmp_path / "pairs.jsonl", records))
    dataset = Dataset.from_list(records)
    dataset.save_to_disk(tmp_path / "saved")
    DatasetDict({"train": dataset.select(range(2)), "extra": dataset}).save_to_disk(
        tmp_path / "dict"
    )
    dataset.to_parquet(tmp_path / "pairs.parquet")
    for name in ("saved", "pairs.parquet", "pairs.jsonl"):
        assert read_dataset(str(tmp_path / name)) == expected
    assert read_dataset(str(tmp_path / "dict")) == expected[:2]
    assert read_dataset(str(tmp_path / "dict"), split="extra") == expected
    with pytest.raises(
        ValueError, match=r"cannot load it: no split 'test'; its splits: \['extra', 'train'\]"
    ):
        read_dataset(str(tmp_path / "dict"), split="test")


def test_a_bad_row_of_a_dataset_is_named_by_its_index(tmp_path):
    from datasets import Dataset

    rows = [{"chosen": f"2+3 = {i}", "rejected": "2+3 = 9", "margin": 1.0} for i in range(4)]
    rows[2]["chosen"] = "no idea"
    rows[3]["margin"] = None  # a gap in a column: the key is absent, as in a JSONL record
    Dataset.from_list(rows).to_parquet(tmp_path / "pairs.parquet")
    name = str(tmp_path / "pairs.parquet")
    with pytest.raises(ValueError) as err:
        read_dataset(name)
    assert str(err.value).startswith(
        f"{name}, row 2: no 'prompt', and 'chosen' and 'rejected' share no leading text"
    )
    rows[2]["chosen"], rows[1]["rejected"] = "2+3 = 5", None
    Dataset.from_list(rows).save_to_disk(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"saved, row 1: missing \['rejected'\]"):
        read_dataset(str(tmp_path / "saved"))


def test_a_hub_dataset_that_cannot_be_reached_fails_clearly(tmp_path, monkeypatch, capsys):
    import datasets.config
    import huggingface_hub.constants

    # As on a machine without a network, without the retries' half a minute of waiting.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    argv = ["--dataset_name", "trl-lib/ultrafeedback_binarized", "--base", "unused"]
    assert main([*argv, "--output_dir", str(tmp_path / "rm")]) == 2
    err = capsys.readouterr().err
    assert "error: --dataset_name trl-lib/ultrafeedback_binarized: cannot load it: " in err
    assert "Couldn't reach 'trl-lib/ultrafeedback_binarized' on the Hub" in err
    assert "a folder saved with save_to_disk, a .parquet/.json/.jsonl/.csv file" in err
    assert not (tmp_path / "rm").exists()
