"""The reflection memory: what it refuses, what a confirmation does, what it evicts,
top-k relevance, the rulebook, persistence, survival across resume."""

from __future__ import annotations

import doctest
import json
import random

import pytest

import pipeline.erl.memory as memory_module
from pipeline.erl.memory import MEMORY_FILE, PAPER_POLICY, ReflectionMemory, lesson_problem

HIDDEN_RULE_PROMPT = "The operation # is hidden. Reply only with <answer>N</answer>.\n3#4"


def test_the_modules_examples_hold():
    assert doctest.testmod(memory_module).failed == 0


@pytest.mark.parametrize(
    "reflection, problem",
    [
        # The degenerate rulebook tails measured on the bench (issue 27), one per seed.
        ("", "empty"),
        ("  ", "empty"),
        ("= = =", "empty"),
        ("<answer>", "answer_format"),
        ("<answer>7</answer>", "answer_format"),
        ("<answer>7", "answer_format"),
        ("a#b = = = = = =", "repetitive"),
        ("a~b = = = = = =", "repetitive"),
        ("a%b = = = = = =", "repetitive"),
        ("a~b a$b a#b a%b", "repetitive"),
        ("a#b a$b a~b a~b", "repetitive"),
        ("the the the the", "repetitive"),
        ("3#4", "prompt_copy"),
        ("The operation # is hidden.", "prompt_copy"),
        # Lessons, right or wrong, stay.
        ("a#b = a+b+2", None),
        ("a#b = a+b", None),
        ("It is 2 too low: add 2 more.", None),
        ("The answer is 7, not 5.", None),
        ("Write the sum, then close the tag: <answer>N</answer>.", None),
    ],
)
def test_what_is_no_lesson(reflection, problem):
    assert lesson_problem(reflection, HIDDEN_RULE_PROMPT) == problem


def test_no_lesson_is_refused_and_counted_by_reason():
    memory = ReflectionMemory(max_size=10, lessons_only=True)
    outcomes = [
        memory.add(HIDDEN_RULE_PROMPT, text, step=1)
        for text in ("", "<answer>7</answer>", "a#b = = = = = =", "3#4", "a#b = a+b+2")
    ]
    assert outcomes == ["empty", "answer_format", "repetitive", "prompt_copy", "stored"]
    assert [e.reflection for e in memory] == ["a#b = a+b+2"]
    assert memory.pop_outcomes() == {
        "empty": 1, "answer_format": 1, "repetitive": 1, "prompt_copy": 1, "stored": 1
    }  # fmt: skip
    assert memory.pop_outcomes() == {}
    # lessons_only=False (the ERL paper's memory) stores whatever preceded a success; the
    # default refuses it.
    assert (
        ReflectionMemory(max_size=10).add(HIDDEN_RULE_PROMPT, "a#b = = = = = =", step=1) != "stored"
    )
    anything = ReflectionMemory(max_size=10, lessons_only=False)
    assert anything.add(HIDDEN_RULE_PROMPT, "a#b = = = = = =", step=1) == "stored"


def test_a_restated_lesson_confirms_its_entry_instead_of_entering_twice():
    memory = ReflectionMemory(max_size=10, scope="same_prompt")
    assert memory.add("3#4", "a#b = a+b+2", step=1) == "stored"
    assert memory.add("3#4", " A#B  =  a+b+2 ", step=2) == "confirmed"  # case and spaces
    assert memory.add("5#1", "a#b = a+b+2", step=2) == "stored"  # another prompt's own
    assert [(e.prompt, e.reads, e.successes) for e in memory] == [("3#4", 2, 2), ("5#1", 1, 1)]
    # In the global rulebook the same rule from any prompt is one entry.
    rulebook = ReflectionMemory(max_size=10, scope="global")
    rulebook.add("3#4", "a#b = a+b+2", step=1)
    assert rulebook.add("5#1", "a#b = a+b+2", step=2) == "confirmed"
    assert len(rulebook) == 1 and next(iter(rulebook)).successes == 2


def test_a_reading_retry_moves_its_entrys_standing():
    memory = ReflectionMemory(max_size=10, scope="global", confirmations=True)
    memory.add("3#4", "a#b = a+b+2", step=1)  # order 0
    memory.add("5#1", "a#b = a+b+3", step=1)  # order 1, the newest
    assert memory.retrieve("x") == ["a#b = a+b+3"]  # equal records: the newest
    memory.record([1], success=False)
    memory.record([0, 7], success=True)  # a gone entry's id is skipped
    first, second = sorted(memory, key=lambda e: e.order)
    assert (first.reads, first.successes, second.reads, second.successes) == (2, 2, 2, 1)
    assert first.standing == pytest.approx(3 / 4) and second.standing == pytest.approx(2 / 4)
    assert memory.retrieve("x") == ["a#b = a+b+2"]  # the confirmed rule, not the newest
    assert [e.order for e in memory.rulebook()] == [0, 1]
    # Without confirmations: the ERL paper's rulebook, the newest entry whatever its record.
    plain = ReflectionMemory(max_size=10, scope="global", confirmations=False)
    plain.load_state_dict(memory.state_dict())
    assert plain.retrieve("x") == ["a#b = a+b+3"]


def test_the_rulebook_tries_a_new_entry_and_keeps_the_one_that_works():
    """With an rng, each reflection prompt sees the entry of the highest Beta draw: a new
    entry is shown often at first; a lesson whose readers fail loses its place."""
    memory = ReflectionMemory(max_size=10, scope="global", confirmations=True)
    memory.add("3#4", "a#b = a+b+2", step=1)  # order 0: retries that read it succeed
    memory.add("5#1", "a#b = a+b+5", step=1)  # order 1: retries that read it fail
    rng = random.Random(0)
    shown = []
    for _ in range(200):
        entry = memory.shown("x", rng=rng)[0]
        shown.append(entry.order)
        memory.record([entry.order], success=entry.order == 0)
    assert 0 in shown[:20] and 1 in shown[:20]  # both tried early
    assert shown[-50:].count(0) >= 45  # the one that works holds the place
    assert memory.rulebook()[0].reflection == "a#b = a+b+2"


def test_a_full_memory_evicts_its_weakest_entry():
    memory = ReflectionMemory(max_size=2, scope="global", confirmations=True)
    memory.add("p", "lesson one", step=1)  # order 0
    memory.add("p", "lesson two", step=1)  # order 1
    memory.record([1], success=False)  # lesson two's reader failed: the weaker
    memory.add("p", "lesson three", step=2)
    assert [e.reflection for e in memory] == ["lesson one", "lesson three"]
    # Equal records: the oldest goes (FIFO), as it does without confirmations.
    plain = ReflectionMemory(max_size=2)
    for i in range(3):
        plain.add("p", f"lesson {i}", step=i)
    plain.record([1], success=False)
    plain.add("p", "lesson 3", step=3)
    assert [e.reflection for e in plain] == ["lesson 2", "lesson 3"]


def test_entries_saved_before_records_load_as_read_once(tmp_path):
    old = {
        "max_size": 5,
        "added": 1,
        "entries": [{"prompt": "p", "reflection": "r", "step": 0, "order": 0}],
    }
    (tmp_path / MEMORY_FILE).write_text(json.dumps(old))
    memory = ReflectionMemory(max_size=5)
    assert memory.load(tmp_path)
    entry = next(iter(memory))
    assert (entry.reads, entry.successes) == (1, 1)


def test_with_no_records_read_back_the_oldest_goes_first():
    memory = ReflectionMemory(max_size=3)
    for i in range(5):
        memory.add(f"prompt {i}", f"lesson {i}", step=i)
    assert [e.reflection for e in memory] == ["lesson 2", "lesson 3", "lesson 4"]
    assert len(memory) == 3


def test_retrieval_ranks_by_relevance_then_recency():
    memory = ReflectionMemory(max_size=10, scope="similar", top_k=2)
    memory.add("sokoban push the box left", "boxes in corners are lost", step=1)
    memory.add("add 3 and 4", "carry the one", step=2)
    memory.add("add 5 and 6", "write only the number", step=3)
    memory.add("frozen lake holes", "avoid holes", step=4)
    assert memory.retrieve("add 3 and 9") == ["carry the one", "write only the number"]
    # Equal relevance (no shared word): the most recent comes first.
    assert memory.retrieve("zzz") == ["avoid holes", "write only the number"]
    memory.top_k = 0
    assert memory.retrieve("add") == []


def test_same_prompt_scope_retrieves_only_that_prompts_lessons_newest_first():
    state = ReflectionMemory(max_size=10)  # same_prompt, the default
    state.add("What is 3 + 4?", "The answer is 7.", step=1)
    state.add("What is 3 + 5?", "The answer is 8.", step=2)  # similar words, another problem
    state.add("What is 3 + 4?", "Count on from 3.", step=3)

    def memory(**options):
        same = ReflectionMemory(max_size=10, **options)
        same.load_state_dict(state.state_dict())
        return same

    assert memory(top_k=5).retrieve("What is 3 + 4?") == ["Count on from 3.", "The answer is 7."]
    assert memory(top_k=1).retrieve("What is 3 + 4?") == ["Count on from 3."]
    # By similarity, the other problem's lesson is retrieved as well.
    assert "The answer is 8." in memory(scope="similar").retrieve("What is 3 + 4?")
    assert memory().retrieve("What is 9 + 9?") == []
    with pytest.raises(ValueError, match="scope"):
        ReflectionMemory(max_size=10, scope="nearest")
    with pytest.raises(ValueError, match="top_k"):
        ReflectionMemory(max_size=10, top_k=-1)


def test_global_scope_is_the_latest_successful_reflection_for_every_prompt():
    """The ERL paper's rulebook: one entry, the newest, whatever the prompt."""
    memory = ReflectionMemory(max_size=10, scope="global")
    assert memory.retrieve("3#4") == []
    memory.add("3#4", "a#b = a+b+2", step=1)
    memory.add("5#1", "a#b = a+b+3", step=1)
    for prompt in ("3#4", "5#1", "9#9", "anything"):
        assert memory.retrieve(prompt) == ["a#b = a+b+3"]
    restored = ReflectionMemory(max_size=10, scope="global", top_k=1)
    restored.load_state_dict(memory.state_dict())  # a resumed (or another) process: the same
    assert restored.retrieve("x") == ["a#b = a+b+3"]
    restored.top_k = 0
    assert restored.retrieve("3#4") == []


def test_trainer_memory_text_follows_memory_scope(tiny_model_dir, arithmetic_dataset, erl_args):
    from conftest import length_reward

    from pipeline import ERLTrainer

    texts = {}
    for scope in ("similar", "same_prompt", "global"):
        trainer = ERLTrainer(
            model=tiny_model_dir,
            args=erl_args(memory_scope=scope, memory_top_k=2),
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
        )
        trainer.memory.add("What is 3 + 4?", "Count on from 3.", step=1)
        trainer.memory.add("What is 3 + 5?", "The answer is 8.", step=2)
        texts[scope] = (
            trainer.erl_step.memory_for("What is 3 + 4?"),
            trainer.erl_step.memory_for("What is 6 + 1?"),
        )
    assert texts["similar"][0] == "- Count on from 3.\n- The answer is 8."
    assert texts["same_prompt"] == ("- Count on from 3.", "(none yet)")
    assert texts["global"] == ("- The answer is 8.", "- The answer is 8.")


def test_zero_size_memory_stores_nothing_and_negative_is_an_error():
    memory = ReflectionMemory(max_size=0)
    assert memory.add("p", "a lesson", step=0) == "off"
    assert len(memory) == 0 and memory.pop_outcomes() == {}
    with pytest.raises(ValueError, match="max_size"):
        ReflectionMemory(max_size=-1)


def test_save_and_load_round_trip(tmp_path):
    memory = ReflectionMemory(max_size=2)
    for i in range(3):
        memory.add(f"p{i}", f"r{i}", step=i)
    path = memory.save(tmp_path)
    assert path.name == MEMORY_FILE
    restored = ReflectionMemory(max_size=2)
    assert restored.load(tmp_path)
    assert restored.state_dict() == memory.state_dict()
    restored.add("p3", "r3", step=3)  # insertion order continues after a restore
    assert [e.reflection for e in restored] == ["r2", "r3"]
    assert not ReflectionMemory(2).load(tmp_path / "missing")


def paper_memory(args) -> ReflectionMemory:
    """The ERL paper's memory for `args`: every reflection whose retry succeeded, newest first
    (the default refuses non-lessons and ranks entries by their record)."""
    return ReflectionMemory.from_config(args, **PAPER_POLICY)


def test_memory_is_checkpointed_and_restored_on_resume(
    tiny_model_dir, arithmetic_dataset, erl_args, tmp_path
):
    from conftest import alternating_reward

    from pipeline import ERLTrainer

    reward, _ = alternating_reward()
    # Per-attempt reflection and the ERL paper's memory (every successful reflection kept):
    # what is checkpointed here is every entry, whatever it says.
    paper = dict(reflections_per_group=0)
    args = erl_args(reward_threshold=0.5, max_steps=2, save_strategy="steps", save_steps=1, **paper)
    trainer = ERLTrainer(
        model=tiny_model_dir, args=args, train_dataset=arithmetic_dataset, reward_funcs=reward,
        memory=paper_memory(args),
    )  # fmt: skip
    trainer.train()
    assert len(trainer.memory) == 16  # every retry of both steps succeeded
    first = json.loads((tmp_path / "out" / "checkpoint-1" / MEMORY_FILE).read_text())
    assert len(first["entries"]) == 8

    # Resume from step 1 and train step 2: the restored entries come first, then step 2's.
    reward, _ = alternating_reward()
    args = erl_args(reward_threshold=0.5, max_steps=2, **paper)
    resumed = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        memory=paper_memory(args),
    )
    assert len(resumed.memory) == 0
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    state = resumed.memory.state_dict()
    assert state["entries"][:8] == first["entries"]
    assert len(state["entries"]) == 16 and state["added"] == 16

    trainer.save_model(str(tmp_path / "final"))
    assert len(json.loads((tmp_path / "final" / MEMORY_FILE).read_text())["entries"]) == 16


def test_global_rulebook_is_checkpointed_and_restored_on_resume(
    tiny_model_dir, arithmetic_dataset, erl_args, tmp_path, monkeypatch
):
    """`memory_scope="global"` keeps no state of its own: the rulebook is the newest entry
    of the saved memory, so a resumed trainer shows every reflection the same rulebook."""
    from conftest import alternating_reward

    from pipeline import ERLTrainer
    from pipeline.erl import step as erl_step

    reward, _ = alternating_reward()
    options = dict(
        reward_threshold=0.5, memory_scope="global", memory_size=1, reflections_per_group=0
    )
    args = erl_args(max_steps=1, save_strategy="steps", save_steps=1, **options)
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        memory=paper_memory(args),
    )
    trainer.train()
    rulebook = trainer.erl_step.memory_for("any prompt")
    assert len(trainer.memory) == 1 and rulebook.startswith("- ")
    saved = json.loads((tmp_path / "out" / "checkpoint-1" / MEMORY_FILE).read_text())
    assert "- " + saved["entries"][-1]["reflection"] == rulebook

    reward, _ = alternating_reward()
    args = erl_args(max_steps=2, **options)
    resumed = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=reward,
        memory=paper_memory(args),
    )
    assert resumed.erl_step.memory_for("any prompt") == "(none yet)"
    shown = []  # what step 2's reflection prompts were given as {memory}
    own = erl_step.reflection_prompt
    monkeypatch.setattr(
        erl_step,
        "reflection_prompt",
        lambda *args, memory, **kwargs: shown.append(memory) or own(*args, memory=memory, **kwargs),
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    assert shown and set(shown) == {rulebook}  # every prompt of step 2: the restored rulebook
    assert resumed.memory.state_dict()["added"] == 16


def test_the_memory_is_built_from_the_config_and_a_disagreeing_one_is_refused(
    tiny_model_dir, arithmetic_dataset, erl_args
):
    """One route for the memory's options: the trainer's memory holds the config's scope,
    top-k and size (0 with the memory off), its defaults are the config's, and a `memory=`
    built otherwise is refused by name."""
    from conftest import length_reward

    from pipeline import ERLConfig, ERLTrainer

    defaults = ERLConfig(output_dir="unused", use_cpu=True, bf16=False)
    plain = ReflectionMemory(defaults.memory_size)
    assert (plain.scope, plain.top_k) == (defaults.memory_scope, defaults.memory_top_k)
    assert plain.disagreement(defaults) is None
    args = erl_args(memory_scope="global", memory_top_k=1, memory_size=7)
    built = ReflectionMemory.from_config(args, lessons_only=True)
    assert (built.max_size, built.scope, built.top_k, built.lessons_only) == (7, "global", 1, True)
    assert ReflectionMemory.from_config(erl_args(enable_memory=False)).max_size == 0
    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
        memory=built,
    )
    assert trainer.memory is built and trainer.erl_step.memory is built
    with pytest.raises(ValueError, match=r"memory_scope \('same_prompt' in the config, 'global'"):
        ERLTrainer(
            model=tiny_model_dir,
            args=erl_args(memory_top_k=1, memory_size=7),
            train_dataset=arithmetic_dataset,
            reward_funcs=length_reward,
            memory=built,
        )
