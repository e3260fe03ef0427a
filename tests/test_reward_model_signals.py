"""Learned signals on a real sequence-classification model built from the tiny model."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.reward_model.signals import (
    INFO_FILE,
    RewardModel,
    add_learned_signals,
    check_preference_function_specs,
    check_reward_model_specs,
)

PROMPT = [{"role": "user", "content": "3+4"}]
REPLIES = ["<answer>7</answer>", "<answer>8</answer>", "<answer>12</answer>", "seven"]


@pytest.fixture(scope="module")
def two_head_model(tiny_model_dir, tmp_path_factory):
    """A two-objective reward model (heads 'tone' and 'brevity') on the tiny model's trunk."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tmp_path_factory.mktemp("rm") / "two-heads"
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=2, id2label={0: "tone", 1: "brevity"}
    )
    with torch.no_grad():  # a head big enough that the replies' scores clearly differ
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    (folder / INFO_FILE).write_text(
        json.dumps({"calibration": {"mean": [0.5, -0.5], "std": [2.0, 1.0]}})
    )
    return str(folder)


def signals(path, program_feedback=False, **spec):
    specs = check_reward_model_specs({"style": {"path": path, "weight": 0.3, **spec}})

    def program(prompts, completions, **kwargs):
        return ["PROGRAM FEEDBACK"] * len(completions)

    return add_learned_signals(
        specs, {}, [], [], program, device="cpu", program_feedback=program_feedback
    )


def test_scores_are_batched_calibrated_and_weighted_per_head(two_head_model):
    model = RewardModel(two_head_model, batch_size=3)
    raw = model.raw_scores([PROMPT] * 4, REPLIES)
    one_by_one = [model.raw_scores([PROMPT], [reply])[0] for reply in REPLIES]
    assert sum(raw, []) == pytest.approx(
        sum(one_by_one, []), abs=1e-4
    )  # padding in a batch changes nothing
    assert model.heads == ["tone", "brevity"]
    # The saved calibration: sigma(2 (raw - mean) / std), per head.
    expected = [1 / (1 + math.exp(-2 * (raw[0][0] - 0.5) / 2.0))]
    expected.append(1 / (1 + math.exp(-2 * (raw[0][1] + 0.5) / 1.0)))
    assert model.normalise(raw[0]) == pytest.approx(expected)

    (tone,), weights, _ = signals(two_head_model, objectives={"tone": 1})
    (brevity,), _, _ = signals(two_head_model, objectives={"brevity": 2})
    (mixed,), _, _ = signals(two_head_model, objectives={"tone": 3, "1": 1})
    assert tone.__name__ == "style_reward_model" and weights == [0.3]
    heads = [model.normalise(r) for r in raw]
    assert tone(prompts=[PROMPT] * 4, completions=REPLIES) == pytest.approx([h[0] for h in heads])
    assert brevity(prompts=[PROMPT] * 4, completions=REPLIES) == pytest.approx(
        [h[1] for h in heads]
    )
    assert mixed(prompts=[PROMPT] * 4, completions=REPLIES) == pytest.approx(
        [0.75 * h[0] + 0.25 * h[1] for h in heads]
    )
    with pytest.raises(ValueError, match="no head 'humour'"):
        signals(two_head_model, objectives={"humour": 1})


def test_feedback_says_what_the_model_thought(two_head_model):
    (func,), _, feedback = signals(two_head_model)
    values = func(prompts=[PROMPT] * 4, completions=REPLIES)
    best = max(values)
    heads = [
        RewardModel(two_head_model).normalise(r)
        for r in RewardModel(two_head_model).raw_scores([PROMPT] * 4, REPLIES)
    ]
    # ERL asks for feedback on the gated rows only: a subset, after the reward call.
    worst = values.index(min(values))
    top = values.index(best)
    texts = feedback(prompts=[PROMPT] * 2, completions=[REPLIES[worst], REPLIES[top]])
    assert f"scored this reply {values[worst]:.2f}" in texts[0]
    assert f"the best reply to this prompt scored {best:.2f}" in texts[0]
    weakest = "tone" if heads[worst][0] < heads[worst][1] else "brevity"
    assert f"weakest objective is {weakest!r}" in texts[0]
    assert "the best of the replies to this prompt" in texts[1]
    assert "PROGRAM FEEDBACK" not in texts[0]  # the programs only watch: their verdict stays out
    (_,), _, with_program = signals(two_head_model, program_feedback=True)
    assert with_program(prompts=[PROMPT], completions=[REPLIES[0]])[0].startswith(
        "PROGRAM FEEDBACK"
    )


def test_a_reward_model_judges_pairs_as_a_win_rate(two_head_model):
    (judge,), _, feedback = signals(two_head_model, pairwise=True, objectives={"tone": 1})
    other = [{"role": "user", "content": "1+1"}]
    rates = judge(prompts=[PROMPT] * 4 + [other] * 2, completions=REPLIES + REPLIES[:2])
    assert all(0 <= r <= 1 for r in rates)
    assert sum(rates[:4]) == pytest.approx(2.0) and sum(rates[4:]) == pytest.approx(1.0)
    # Bradley–Terry on the tone head: the win-rate order is the score order.
    raw = RewardModel(two_head_model).raw_scores([PROMPT] * 4, REPLIES)
    assert sorted(range(4), key=lambda i: rates[i]) == sorted(range(4), key=lambda i: raw[i][0])
    text = feedback(prompts=[PROMPT], completions=[REPLIES[0]])[0]
    assert "of its 3 comparisons" in text and f"win rate {rates[0]:.2f}" in text


def test_a_human_feedback_function_judges_through_the_recipe(tmp_path, monkeypatch):
    (tmp_path / "raters.py").write_text(
        "def prefer_short(prompt, a, b):\n    return 0.5 if len(a) == len(b) else float(len(a) < len(b))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = check_preference_function_specs(
        {"human": {"function": "raters:prefer_short", "weight": 0.5}}
    )
    funcs, weights, feedback = add_learned_signals(
        {}, specs, [], [], lambda **kw: [""] * len(kw["completions"]), device="cpu"
    )
    assert funcs[0].__name__ == "human_preference" and weights == [0.5]
    assert funcs[0](prompts=[PROMPT] * 3, completions=["aa", "a", "aaa"]) == [0.5, 1.0, 0.0]
    assert (
        "preferred this reply in 0 of its 2 comparisons"
        in feedback(prompts=[PROMPT], completions=["aaa"])[0]
    )


def test_a_lora_reward_model_trains_saves_and_scores(tiny_model_dir, tmp_path):
    from pipeline.models.backend import activate_backend

    activate_backend()
    from trl import RewardConfig

    from pipeline.reward_model.config import RewardModelArguments, project_defaults
    from pipeline.reward_model.pairs import Pair
    from pipeline.reward_model.train import train_reward_model

    pairs = [
        Pair([{"role": "user", "content": f"{a}+1"}], f"<answer>{a + 1}</answer>", "no")
        for a in range(10)
    ]
    summary = train_reward_model(
        pairs,
        RewardModelArguments(
            model_name_or_path=tiny_model_dir, use_lora=True, lora_r=4, heldout_fraction=0.2
        ),
        RewardConfig(
            **{
                **project_defaults(),
                "output_dir": str(tmp_path / "rm"),
                "per_device_train_batch_size": 4,
                "disable_tqdm": True,
            }
        ),
    )
    assert (tmp_path / "rm" / "adapter_config.json").exists() and summary["heldout_pairs"] == 2
    model = RewardModel(str(tmp_path / "rm"))
    assert type(model.model).__name__.startswith("Peft")
    [[score]] = model.raw_scores([pairs[0].prompt], [pairs[0].chosen])
    assert math.isfinite(score) and 0 < model.normalise([score])[0] < 1
