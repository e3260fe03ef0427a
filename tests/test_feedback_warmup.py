"""bench/feedback_warmup.py, the bench's warm-up rows: ERL's own prompts, real feedback,
correct fixes."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from feedback_warmup import feedback_rows, reflection_target, rule_rows  # noqa: E402

from curriculum.tasks import get_task  # noqa: E402
from pipeline.erl.prompts import DEFAULT_REFLECTION_PROMPT, DEFAULT_RETRY_PROMPT  # noqa: E402
from rewards import Scorer, build_feedback_func, build_reward_funcs  # noqa: E402


def _rows(style: str, n: int = 40, memory_scope: str = "similar"):
    task = get_task("arithmetic", reveal_answer=style == "reveal")
    scorer = Scorer(task)
    funcs, weights = build_reward_funcs(task, {"correctness": 1.0}, scorer=scorer)
    signals = (
        {"correctness": 1.0, "milestones": 1.0} if style == "distance" else {"correctness": 1.0}
    )
    feedback = build_feedback_func(task, signals, scorer=scorer)
    source = task.generate(2, n, seed=3)
    out = feedback_rows(
        task,
        source,
        feedback,
        funcs,
        weights,
        reflection_template=DEFAULT_REFLECTION_PROMPT,
        retry_template=DEFAULT_RETRY_PROMPT,
        style=style,
        seed=0,
        memory_scope=memory_scope,
    )
    return task, source, out


def _lessons(reflection_row) -> list[str]:
    """The memory lines of a reflection prompt (DEFAULT_REFLECTION_PROMPT's Memory block)."""
    text = reflection_row["prompt"][0]["content"]
    return [line[2:] for line in text.splitlines() if line.startswith("- ")]


@pytest.mark.parametrize("style", ["distance", "reveal"])
def test_memory_shows_what_the_runs_memory_scope_retrieves(style):
    """`same_prompt`: nothing, or a fix of this prompt (reaching its answer); `similar`:
    fixes written for other prompts."""
    _, source, same = _rows(style, n=60, memory_scope="same_prompt")
    _, _, similar = _rows(style, n=60, memory_scope="similar")
    shown = repeated = 0
    for row, reflection in zip(source, same[0::2]):
        lessons = _lessons(reflection)
        assert len(lessons) <= 1
        for lesson in lessons:
            shown += 1
            assert re.search(rf"(=|is) {row['answer']}\.$", lesson), lesson
            repeated += lesson == reflection["completion"][0]["content"]
    assert 15 <= shown <= 45  # about half the prompts were fixed before
    if style == "distance":  # the fix of an earlier (other) wrong attempt, mostly
        assert repeated < shown / 2
    others = [
        lesson
        for row, reflection in zip(source, similar[0::2])
        for lesson in _lessons(reflection)
        if not re.search(rf"(=|is) {row['answer']}\.$", lesson)
    ]
    assert others  # other problems' answers
    with pytest.raises(ValueError, match="memory_scope must be one of"):
        _rows(style, n=2, memory_scope="nearest")


@pytest.mark.parametrize("style", ["distance", "reveal"])
def test_global_memory_shows_one_other_prompts_fix_or_none(style):
    """`global` is the rulebook: the latest successful reflection, another prompt's fix
    (not silently what `same_prompt` would show), or nothing before the first success."""
    _, source, rows = _rows(style, n=80, memory_scope="global")
    fixes = [reflection["completion"][0]["content"] for reflection in rows[0::2]]
    shown = 0
    for i, reflection in enumerate(rows[0::2]):
        lessons = _lessons(reflection)
        assert len(lessons) <= 1
        for lesson in lessons:
            shown += 1
            assert lesson != fixes[i] and lesson in fixes[:i] + fixes[i + 1 :]  # another's
    assert 45 <= shown <= 75  # three rows in four


def _rule_rows(memory_scope: str, n: int = 60):
    from curriculum.tasks.hidden_rule import HiddenRuleTask

    task = HiddenRuleTask()
    scorer = Scorer(task)
    funcs, weights = build_reward_funcs(task, {"correctness": 1.0}, scorer=scorer)
    feedback = build_feedback_func(task, {"correctness": 1.0}, scorer=scorer)
    source, rules = [], []
    for i in range(n):  # rows of many rules: symbols and constants vary
        decoy = HiddenRuleTask(symbol="@$%"[i % 3], rule_seed=i, split="all")
        source += decoy.generate(1, 1, seed=i)
        rules.append(decoy.rule_text(1))
    out = rule_rows(
        task,
        source,
        rules,
        feedback,
        funcs,
        weights,
        reflection_template=DEFAULT_REFLECTION_PROMPT,
        retry_template=DEFAULT_RETRY_PROMPT,
        seed=0,
        memory_scope=memory_scope,
    )
    return task, source, rules, out


@pytest.mark.parametrize("memory_scope", ["global", "same_prompt", "similar"])
def test_rule_rows_read_the_rule_from_the_feedback_on_a_plus_reading(memory_scope):
    task, source, rules, out = _rule_rows(memory_scope)
    assert len(out) == 2 * len(source) and len(set(rules)) > 3
    shown = 0
    for row, rule, reflection, retry in zip(source, rules, out[0::2], out[1::2]):
        meta, prompt = task.meta(row), reflection["prompt"][0]["content"]
        k = int(row["answer"]) - meta["a"] - meta["b"]
        assert f"<answer>{meta['a'] + meta['b']}</answer>" in prompt  # read as +
        assert f"it is {k} too low." in prompt and row["answer"] not in prompt.split("\n")[-1]
        assert reflection["completion"][0]["content"] == rule == rule[:6] + f"a+b+{k}"
        lessons = _lessons(reflection)
        assert set(lessons) <= {rule} and (memory_scope == "similar" or len(lessons) <= 1)
        shown += bool(lessons)
        assert rule in retry["prompt"][-1]["content"]
        assert task.evaluate(row, retry["completion"][0]["content"]).solved
    assert 15 <= shown <= 45
    with pytest.raises(ValueError, match="rules"):
        rule_rows(task, source, rules[:-1], None, [], [], reflection_template="",
                  retry_template="", seed=0)  # fmt: skip


def test_distance_rows_carry_the_offset_and_the_right_fix():
    task, source, out = _rows("distance")
    assert len(out) == 2 * len(source)
    for row, reflection, retry in zip(source, out[0::2], out[1::2]):
        prompt = reflection["prompt"][0]["content"]
        attempt = int(re.search(r"<answer>(-?\d+)</answer>", prompt).group(1))
        answer = int(row["answer"])
        assert attempt != answer
        # The real feedback function's sentence, with the information needed to fix it.
        assert f"off by {abs(answer - attempt)}" in prompt
        assert ("too low" in prompt) == (attempt < answer)
        assert "Reward: 0.00" in prompt  # binary reward of a wrong answer
        fix = reflection["completion"][0]["content"]
        a, sign, d, result = re.fullmatch(r"(-?\d+) ([+-]) (\d+) = (-?\d+)\.", fix).groups()
        assert int(a) == attempt and int(result) == answer
        assert attempt + (int(d) if sign == "+" else -int(d)) == answer
        # The retry keeps the system turn and answers the original task correctly.
        assert retry["prompt"][0] == row["prompt"][0]
        assert fix in retry["prompt"][-1]["content"]
        assert task.evaluate(row, retry["completion"][0]["content"]).solved


def test_reveal_rows_restate_the_revealed_answer():
    _, source, out = _rows("reveal", n=10)
    for row, reflection in zip(source, out[0::2]):
        assert f"The correct answer is {row['answer']}." in reflection["prompt"][0]["content"]
        assert reflection["completion"][0]["content"] == f"The answer is {row['answer']}."


def test_prompts_follow_the_templates_and_keep_the_system_turn():
    """pipeline.erl.prompts: what ERLTrainer and the warm-up both show the model."""
    from pipeline.erl.prompts import (
        NO_MEMORY,
        memory_text,
        prompt_text,
        reflection_prompt,
        retry_prompt,
    )

    row = get_task("arithmetic").generate(2, 1, seed=1)[0]
    system, user = row["prompt"]
    assert prompt_text(row["prompt"]) == system["content"] + "\n" + user["content"]
    assert memory_text([]) == NO_MEMORY and memory_text(["a", "b"]) == "- a\n- b"
    reflection = reflection_prompt(
        row["prompt"],
        DEFAULT_REFLECTION_PROMPT,
        attempt="<answer>3</answer>",
        feedback="F",
        reward=0.0,
        memory=memory_text(["2 + 3 = 5."]),
    )
    assert [m["role"] for m in reflection] == ["user"]
    assert reflection[0]["content"] == DEFAULT_REFLECTION_PROMPT.format(
        prompt=prompt_text(row["prompt"]),
        attempt="<answer>3</answer>",
        feedback="F",
        reward=0.0,
        memory="- 2 + 3 = 5.",
    )
    retry = retry_prompt(row["prompt"], DEFAULT_RETRY_PROMPT, "R", "F")
    assert retry[0] == system
    assert retry[1] == {
        **user,
        "content": DEFAULT_RETRY_PROMPT.format(
            prompt=user["content"], reflection="R", feedback="F"
        ),
    }
    # Plain-text datasets get plain-text prompts.
    assert (
        reflection_prompt("Q", "{prompt}|{attempt}", attempt="A", feedback="", reward=0, memory="")
        == "Q|A"
    )
    assert retry_prompt("Q", DEFAULT_RETRY_PROMPT, "R", "F") == DEFAULT_RETRY_PROMPT.format(
        prompt="Q", reflection="R", feedback="F"
    )


def test_trainer_memory_text_is_the_warmups():
    """The `{memory}` the ERL step writes for a prompt with a stored fix, and without one."""
    from pipeline.erl.memory import ReflectionMemory
    from pipeline.erl.prompts import memory_text, prompt_text
    from pipeline.erl.step import ERLStep

    row = get_task("arithmetic").generate(2, 1, seed=1)[0]
    args = SimpleNamespace(enable_memory=True, memory_top_k=3, memory_scope="same_prompt")
    memory = ReflectionMemory(5)
    memory.add(prompt_text(row["prompt"]), "2 + 3 = 5.", step=0)
    step = ERLStep(args, memory)
    assert step.memory_for(prompt_text(row["prompt"])) == memory_text(["2 + 3 = 5."])
    assert ERLStep(args, ReflectionMemory(1)).memory_for("x") == memory_text([])


def test_reflection_target_and_bad_style():
    assert reflection_target(5, 8, "distance") == "5 + 3 = 8."
    assert reflection_target(-2, -9, "distance") == "-2 - 7 = -9."
    assert reflection_target(5, 8, "reveal") == "The answer is 8."
    with pytest.raises(ValueError, match="style must be one of"):
        _rows("hint")


def test_sft_warmup_trains_on_the_given_rows(tiny_model_dir, erl_args, tmp_path):
    """`sft_warmup(dataset=...)` trains on those rows (not on reference solutions)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.run.warmup import sft_warmup

    task, _, out = _rows("distance", n=16)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    history = sft_warmup(
        model,
        tokenizer,
        task,
        1,
        steps=2,
        examples=0,  # would be an empty reference set: the given rows are used instead
        batch_size=8,
        learning_rate=1e-3,
        args=erl_args(),
        output_dir=str(tmp_path / "sft"),
        dataset=Dataset.from_list(out),
    )
    assert any("loss" in h for h in history)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
