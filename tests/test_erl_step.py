"""pipeline.erl.step: the ERL step alone, driven by deterministic functions, no trainer.

The backend below stands in for the trainer: its "generator" writes a reflection that
names the prompt and a retry that is right for some prompts, its reward is exact match
against the row's answer, and its tokenizer is one id per character. Two such steps run
in two threads joined by a barrier act as two processes.
"""

from __future__ import annotations

import ast
import math
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pipeline.erl.interface import Attempts, FirstAttempts, Generated, OneProcess
from pipeline.erl.memory import ReflectionMemory
from pipeline.erl.prompts import DEFAULT_REFLECTION_PROMPT, DEFAULT_RETRY_PROMPT
from pipeline.erl.step import NO_FEEDBACK, ERLStep, call_feedback, retry_advantages

STEP = Path(__file__).resolve().parents[1] / "pipeline" / "erl" / "step.py"


def settings(**overrides):
    """The ERLConfig options the step reads, at ERLConfig's defaults."""
    values = dict(
        reward_threshold=1.0,
        enable_reflection=True,
        enable_internalization=True,
        internalization_coef=0.7,
        scale_rewards="group",
        reflection_system_prompt=DEFAULT_REFLECTION_PROMPT,
        retry_system_prompt=DEFAULT_RETRY_PROMPT,
        reflection_max_completion_length=None,
        reflection_attempt_max_chars=4000,
        max_completion_length=8,
        reflections_per_group=0,
    )
    return SimpleNamespace(**{**values, **overrides})


def ids(text: str) -> list[int]:
    return [ord(c) % 97 + 1 for c in text]


def content(prompt) -> str:
    return prompt[-1]["content"] if isinstance(prompt, list) else prompt


class Backend:
    """A deterministic StepBackend: retries are right for the prompts in `solvable`."""

    episodic = False

    def __init__(self, solvable=(), processes=None, nll=0.25):
        self.solvable, self.nll = set(solvable), nll
        self.processes = processes or OneProcess()
        self.generated: list[tuple[list, int]] = []
        self.scored: list[dict] = []

    def generate(self, prompts, max_new_tokens):
        self.generated.append((list(prompts), max_new_tokens))
        texts = []
        for prompt in prompts:
            text = content(prompt)
            if text.startswith("You tried"):  # a reflection prompt
                texts.append(f" Check {text.split(chr(10))[1]} again. ")
            else:  # a retry prompt: "<question>\n\nAdvice ...: <reflection>"
                question = text.split("\n\n")[0]
                texts.append("right" if question in self.solvable else "wrong")
        return Generated(
            [ids(content(p)) for p in prompts], [ids(t) for t in texts], texts, [None] * len(texts)
        )

    def attempt(self, rows, prompts):
        generated = self.generate(prompts, 8)
        tasks = [row["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": text}] for text in generated.texts]
        return Attempts(generated, tasks, completions, [None] * len(rows))

    def score(self, rows, prompts, completions, completion_ids, environments=None):
        self.scored.append({"rows": rows, "completions": completions})
        return torch.tensor(
            [float(c[0]["content"] == row["answer"]) for row, c in zip(rows, completions)]
        )

    def feedback(self, rows, prompts, completions, completion_ids, environments=None):
        return [f"not {c[0]['content']}" for c in completions]

    def tokenize(self, prompts, rows):
        return [ids(content(p)) for p in prompts]

    def trainable(self, completion_ids):
        return [len(c) < 8 for c in completion_ids]

    def mean_token_nll(self, prompt_ids, completion_ids, tool_masks):
        return self.nll


def first_attempts(questions, r1):
    """One first attempt per question, answered 'guess' (the right answer is 'right')."""
    prompts = [[{"role": "user", "content": q}] for q in questions]
    completions = [[{"role": "assistant", "content": "guess"}] for _ in questions]
    rows = [{"prompt": p, "answer": "right", "level": 1} for p in prompts]
    return FirstAttempts(rows, prompts, completions, [ids("guess")] * len(questions), r1)


def test_a_step_gates_reflects_retries_credits_remembers_and_internalizes():
    questions = ["What is 1+1?", "What is 1+1?", "What is 2+2?", "What is 3+3?", "What is 4+4?"]
    r1 = torch.tensor([0.0, 0.0, 0.2, float("nan"), 1.0 - 1e-7])  # NaN and ~1.0: not gated
    backend = Backend(solvable={"What is 1+1?"})
    memory = ReflectionMemory(10)
    memory.add("What is 2+2?", "Add two twos.", step=0)
    memory.pop_outcomes()  # the metrics count what this step's reflections did
    result = ERLStep(settings(), memory)(backend, first_attempts(questions, r1), step=7)

    (reflections, length), (retries, _) = backend.generated
    assert len(reflections) == 3 and length == 8  # the gated rows 0, 1 and 2
    assert "not guess" in reflections[0][0]["content"]  # the feedback
    assert "- Add two twos." in reflections[2][0]["content"]  # its prompt's stored lesson
    assert "(none yet)" in reflections[0][0]["content"]
    assert (
        retries[0][0]["content"] == "What is 1+1?\n\nFeedback on your attempt: not guess\n\n"
        "Advice from a previous attempt: Check What is 1+1? again."
    )
    # r2 is scored against the original rows, marked as retries.
    (scored,) = backend.scored
    assert [row["answer"] for row in scored["rows"]] == ["right"] * 3
    assert all(row["attempt"] == 2 and row["level"] == 1 for row in scored["rows"])

    rows = result.rows
    # Reflections, retries (advantage from r2 within the prompt's group; alone: r2 - r1),
    # then one internalization row per successful retry.
    assert len(rows.advantages) == 8
    assert rows.advantages[:6] == pytest.approx([0.0, 0.0, -0.2] * 2)
    assert rows.advantages[6:] == [0.7, 0.7]
    assert rows.prompt_ids[6] == ids("What is 1+1?") and rows.completion_ids[6] == ids("right")
    assert rows.valid == [True] * 8 and rows.trainable == [False] * 3 + [True] * 5
    # Memory: the two successful reflections, at the step; the second restates the first,
    # so it confirms that entry instead of entering twice.
    assert [(e.prompt, e.reflection, e.step, e.successes) for e in memory][1:] == [
        ("What is 1+1?", "Check What is 1+1? again.", 7, 2)
    ]
    assert result.metrics == {
        "erl/r1_mean": pytest.approx(0.3),  # NaN left out
        "erl/gated_fraction": 0.6,
        "erl/r2_mean": pytest.approx(2 / 3),
        "erl/retry_success_rate": pytest.approx(2 / 3),
        "erl/internalization_rows": 2.0,
        "erl/internalization_loss": pytest.approx(0.25 * 0.7),
        "erl/memory_size": 2.0,
        "erl/reflections": 3.0,
        "erl/retries": 3.0,
        "erl/memory_stored": 1.0,
        "erl/memory_confirmed": 1.0,
        "erl/attempts_cut": 0.0,
    }


def test_one_reflection_per_group_stores_each_group_its_own_lesson():
    """reflections_per_group=1: the memory pairs a group's prompt with the lesson that group's
    retries succeeded with, not with a retry's index into another group's lesson (a
    regression: the per-retry lesson list once reached the memory)."""
    questions = ["What is 1+1?", "What is 1+1?", "What is 2+2?", "What is 2+2?"]
    backend = Backend(solvable={"What is 2+2?"})
    memory = ReflectionMemory(10)
    step = ERLStep(settings(reflections_per_group=1), memory)
    step(backend, first_attempts(questions, torch.zeros(4)), step=1)

    (reflections, _), (retries, _) = backend.generated
    assert len(reflections) == 2 and len(retries) == 4  # one lesson per group, read by both
    assert [(e.prompt, e.reflection) for e in memory] == [
        ("What is 2+2?", "Check What is 2+2? again.")
    ]


def test_a_thinking_models_reasoning_stays_out_of_the_lesson_and_the_memory():
    """A reflection that thinks first (`<think>...</think>` then the lesson, or a trace the
    template opened in the prompt and the model closed): the retry and the memory get the
    lesson alone; the reflection row still trains on every token it generated."""
    questions = ["What is 2+2?", "What is 2+2?", "What is 4+4?", "What is 4+4?"]
    backend = Backend(solvable={"What is 2+2?"})
    generate = backend.generate
    thoughts = iter(["<think>2 and 2, so it said</think> Add them.", "hmm, 4 and 4</think> Sum."])

    def thinking(prompts, max_new_tokens):
        if not content(prompts[0]).startswith("You tried"):
            return generate(prompts, max_new_tokens)
        backend.generated.append((list(prompts), max_new_tokens))
        texts = [next(thoughts) for _ in prompts]
        return Generated([ids(content(p)) for p in prompts], [ids(t) for t in texts], texts,
                         [None] * len(texts))  # fmt: skip

    backend.generate = thinking
    memory = ReflectionMemory(10)
    result = ERLStep(settings(reflections_per_group=1), memory)(
        backend, first_attempts(questions, torch.zeros(4)), step=1
    )
    (_, _), (retries, _) = backend.generated
    lessons = [content(p).split("Advice from a previous attempt: ")[1] for p in retries]
    assert lessons == ["Add them.", "Add them.", "Sum.", "Sum."]
    assert [e.reflection for e in memory] == ["Add them."]
    assert ids("<think>2 and 2, so it said</think> Add them.") in result.rows.completion_ids
    # The experience log keeps both: the reflection as generated, and the lesson alone.
    written = [(r["reflection"], r["lesson"]) for r in result.records if r["kind"] == "reflection"]
    assert written == [("<think>2 and 2, so it said</think> Add them.", "Add them."),
                       ("hmm, 4 and 4</think> Sum.", "Sum.")]  # fmt: skip
    assert [r["lesson"] for r in result.records if r["kind"] == "retry"] == lessons
    offered = [r["offered"] for r in result.records if r["kind"] == "reflection"]
    assert offered == [True, False]  # only 2+2 was solvable on the retry


def test_without_reflection_each_failed_attempt_retries_with_its_own_feedback():
    """enable_reflection=False (the raw-feedback baseline): no reflection is generated or
    trained, reflections_per_group is not read, every gated attempt's retry reads its own
    feedback, successful retries are internalized, and the memory is left alone."""
    questions = ["What is 1+1?", "What is 1+1?", "What is 2+2?", "What is 4+4?"]
    r1 = torch.tensor([0.0, 0.5, 0.2, 1.0])
    backend = Backend(solvable={"What is 1+1?"})
    first = first_attempts(questions, r1)
    first.completions[1] = [{"role": "assistant", "content": "guess again"}]
    memory = ReflectionMemory(10)
    step = ERLStep(settings(enable_reflection=False, reflections_per_group=1), memory)
    result = step(backend, first, step=3)

    ((retries, _),) = backend.generated  # one generate call: the retries
    # The default template names {feedback}: the feedback is shown there, once.
    assert [content(p) for p in retries] == [
        "What is 1+1?\n\nFeedback on your attempt: not guess\n\nAdvice from a previous attempt: ",
        "What is 1+1?\n\nFeedback on your attempt: not guess again\n\n"
        "Advice from a previous attempt: ",
        "What is 2+2?\n\nFeedback on your attempt: not guess\n\nAdvice from a previous attempt: ",
    ]
    rows = result.rows
    # Three retries (alone in their reflection's slot: r2 - r1 within the prompt's group),
    # then the two successful ones internalized; no reflection row.
    assert len(rows.advantages) == 5 and rows.advantages[3:] == [0.7, 0.7]
    assert rows.completion_ids[:3] == [ids("right"), ids("right"), ids("wrong")]
    assert len(memory) == 0
    assert result.metrics["erl/reflections"] == 0.0 and result.metrics["erl/retries"] == 3.0
    assert result.metrics["erl/internalization_rows"] == 2.0


def test_without_reflection_a_template_without_feedback_shows_it_as_the_reflection():
    """The raw-feedback baseline with a retry template that names only {reflection}: the
    attempt's own feedback stands there (the bench's raw_feedback_retry runs so)."""
    backend = Backend()
    first = first_attempts(["What is 1+1?", "What is 2+2?"], torch.tensor([0.0, 0.0]))
    first.completions[1] = [{"role": "assistant", "content": "guess again"}]
    config = settings(enable_reflection=False, retry_system_prompt="{prompt}|{reflection}")
    ERLStep(config, ReflectionMemory(10))(backend, first, step=1)
    ((retries, _),) = backend.generated
    assert [content(p) for p in retries] == [
        "What is 1+1?|not guess",
        "What is 2+2?|not guess again",
    ]


def test_a_retry_template_with_feedback_shows_each_retry_its_own_attempts_feedback():
    """{feedback} in the retry template: with one reflection per group, every failed attempt
    of the group retries with the group's lesson AND its own attempt's feedback, which the
    feedback function is asked for on every gated attempt (the reflection's among them)."""
    questions = ["What is 1+1?", "What is 1+1?", "What is 1+1?", "What is 2+2?"]
    backend = Backend(solvable={"What is 1+1?"})
    asked = []
    feedback = backend.feedback

    def counting_feedback(rows, prompts, completions, *args, **kwargs):
        asked.append(len(completions))
        return feedback(rows, prompts, completions, *args, **kwargs)

    backend.feedback = counting_feedback
    first = first_attempts(questions, torch.tensor([0.0, 0.5, 0.2, 1.0]))
    first.completions[1] = [{"role": "assistant", "content": "guess again"}]
    first.completions[2] = [{"role": "assistant", "content": "third"}]
    template = "{prompt}\n\nAdvice: {reflection} Own: {feedback}"
    step = ERLStep(
        settings(reflections_per_group=1, retry_system_prompt=template), ReflectionMemory(10)
    )
    step(backend, first, step=1)

    (reflections, _), (retries, _) = backend.generated
    assert len(reflections) == 1 and "Feedback: not guess\n" in content(reflections[0])
    lesson = "Check What is 1+1? again."
    assert [content(p) for p in retries] == [
        f"What is 1+1?\n\nAdvice: {lesson} Own: not guess",
        f"What is 1+1?\n\nAdvice: {lesson} Own: not guess again",
        f"What is 1+1?\n\nAdvice: {lesson} Own: not third",
    ]
    assert asked == [3]  # once, for every gated attempt


def test_no_gated_row_adds_nothing():
    backend = Backend()
    result = ERLStep(settings(), ReflectionMemory(5))(
        backend, first_attempts(["a", "b"], torch.ones(2)), step=1
    )
    assert result.rows is None and backend.generated == [] and backend.scored == []
    assert result.metrics["erl/gated_fraction"] == 0.0
    assert result.metrics["erl/internalization_rows"] == 0.0


def test_the_retry_advantages_hook_credits_reflections_and_retries():
    calls = []

    def credit(groups, r1, r2, valid, scale):
        calls.append((groups, r2.tolist(), valid, scale))
        return [float(i) + 2 for i in range(len(groups))]

    backend = Backend(solvable={"b"})
    step = ERLStep(settings(scale_rewards="none"), ReflectionMemory(5), credit)
    result = step(backend, first_attempts(["a", "b"], torch.zeros(2)), step=1)
    ((groups, r2, valid, scale),) = calls
    assert len(set(groups)) == 2 and r2 == [0.0, 1.0] and valid == [True, True] and not scale
    assert result.rows.advantages[:4] == [2.0, 3.0, 2.0, 3.0]  # the hook's values
    assert result.rows.valid == [True] * 5


def test_unscorable_retries_carry_no_signal():
    class Unscorable(Backend):
        def score(self, rows, prompts, completions, completion_ids, environments=None):
            return torch.full((len(rows),), float("nan"))

    result = ERLStep(settings(), ReflectionMemory(5))(
        Unscorable(), first_attempts(["a", "a"], torch.zeros(2)), step=1
    )
    assert result.rows.advantages == [0.0] * 4
    assert (
        result.metrics["erl/retry_success_rate"] == 0.0
        and "erl/internalization_loss" not in result.metrics
    )


class ThreadProcesses:
    """`Processes` of one of `count` threads, whose collectives meet at a barrier."""

    def __init__(self, index: int, count: int, shared: dict, barrier: threading.Barrier):
        self.index, self.count, self.shared, self.barrier = index, count, shared, barrier

    def _exchange(self, value):
        self.barrier.wait()
        self.shared[self.index] = value
        self.barrier.wait()
        values = [self.shared[i] for i in range(self.count)]
        self.barrier.wait()
        return values

    def gather(self, tensor):
        return torch.cat(self._exchange(tensor))

    def gather_object(self, items):
        return [item for part in self._exchange(list(items)) for item in part]

    def sum(self, tensor):
        return torch.stack(self._exchange(tensor)).sum(dim=0)


def in_two_processes(steps, backends, first, step: int) -> list:
    """Each of two threads, joined by ThreadProcesses, runs its ERL step on its backend and
    first attempts; their results in process order (a thread's error fails the test)."""
    shared, barrier = {}, threading.Barrier(2)
    results, errors = [None, None], []

    def run(i):
        backends[i].processes = ThreadProcesses(i, 2, shared, barrier)
        try:
            results[i] = steps[i](backends[i], first[i], step=step)
        except Exception as error:  # surfaced below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_two_processes_pad_to_the_global_count_credit_together_and_remember_alike():
    """Process 0 gated 2 rows, process 1 one, of the same prompt: process 1 pads with a masked
    copy, the prompt's three retries are normalised together, and both memories get the
    same reflections in the same order."""
    first = [
        first_attempts(["q", "q"], torch.zeros(2)),
        first_attempts(["q", "z"], torch.tensor([0.0, 1.0])),
    ]
    backends = [Backend(solvable={"q"} if i == 0 else ()) for i in range(2)]
    memories = [ReflectionMemory(10), ReflectionMemory(10)]
    steps = [ERLStep(settings(), memory) for memory in memories]
    a, b = in_two_processes(steps, backends, first, step=3)
    assert len(backends[1].generated[0][0]) == 2  # one gated row and its padding copy
    assert b.rows.valid[:2] == [True, False]
    # r2: process 0's two retries of "q" right, process 1's wrong: one group of three.
    mean, std = 2 / 3, torch.tensor([1.0, 1.0, 0.0]).std().item()
    right, wrong = (1 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4)
    assert a.rows.advantages[:2] == pytest.approx([right, right])
    assert b.rows.advantages[:2] == pytest.approx([wrong, 0.0])  # the copy carries nothing
    assert a.metrics == b.metrics and a.metrics["erl/gated_fraction"] == 0.75
    assert a.metrics["erl/retry_success_rate"] == pytest.approx(2 / 3)
    # Both processes' successful reflections restate one lesson: one entry, confirmed twice.
    assert [(e.reflection, e.successes) for e in memories[0]] == [("Check q again.", 2)]
    assert [(e.reflection, e.successes) for e in memories[1]] == [("Check q again.", 2)]


class Scripted(Backend):
    """A Backend whose retries are right or wrong in the order `outcomes` says (then wrong),
    whatever their prompt, and whose reflection names the reward its prompt shows, so that
    a retry's prompt tells which row's reflection it read."""

    def __init__(self, outcomes=(), processes=None):
        super().__init__(processes=processes)
        self.outcomes = list(outcomes)

    def generate(self, prompts, max_new_tokens):
        self.generated.append((list(prompts), max_new_tokens))
        texts = []
        for prompt in prompts:
            lines = content(prompt).split("\n")
            if lines[0].startswith("You tried"):
                reward = next(line for line in lines if line.startswith("Reward:"))
                texts.append(f"Fix {lines[1]} from {reward}.")
            else:
                texts.append("right" if self.outcomes and self.outcomes.pop(0) else "wrong")
        return Generated(
            [ids(content(p)) for p in prompts], [ids(t) for t in texts], texts, [None] * len(texts)
        )


def advice(prompt) -> str:
    """The reflection a retry prompt carries."""
    return content(prompt).split("Advice from a previous attempt: ")[1]


def recording(calls):
    """The stock `retry_advantages`, recording what it was asked."""

    def credit(groups, r1, r2, valid, scale):
        calls.append((list(groups), r1.tolist(), r2.tolist(), list(valid)))
        return retry_advantages(groups, r1, r2, valid, scale)

    return credit


def _group_of(question: str) -> str:
    """The group key the step gives `first_attempts`' prompt for `question`."""
    from curriculum.tasks.base import prompt_key

    return prompt_key([{"role": "user", "content": question}])


def test_one_reflection_per_group_serves_every_failed_attempt():
    """k = 1, a group of four first attempts, three of them failed: the first failed one
    reflects, all three retry with its reflection; the retries are normalised among
    themselves, the reflection gets mean r2 - mean r1, and it enters the memory once."""
    backend, calls = Scripted(outcomes=[0, 1, 0]), []
    memory = ReflectionMemory(10)
    memory.add("q", "Old lesson.", step=0)
    memory.pop_outcomes()
    step = ERLStep(settings(reflections_per_group=1), memory, recording(calls))
    first = first_attempts(["q"] * 4, torch.tensor([0.0, 0.5, 1.0, 0.2]))
    result = step(backend, first, step=4)

    (reflections, _), (retries, _) = backend.generated
    assert len(reflections) == 1 and "Reward: 0.00" in content(reflections[0])
    assert [advice(p) for p in retries] == ["Fix q from Reward: 0.00."] * 3
    (groups, _, r2, _), (reflection_groups, r1_mean, r2_mean, valid) = calls
    assert len(set(groups)) == 1 and r2 == [0.0, 1.0, 0.0]
    assert reflection_groups == [_group_of("q")] and valid == [True]
    assert r1_mean == pytest.approx([0.7 / 3]) and r2_mean == pytest.approx([1 / 3])
    rows = result.rows
    std = torch.tensor([0.0, 1.0, 0.0]).std().item()
    retry = [(r - 1 / 3) / (std + 1e-4) for r in (0.0, 1.0, 0.0)]
    assert rows.advantages == pytest.approx([1 / 3 - 0.7 / 3, *retry, 0.7])
    assert rows.valid == [True] * 5 and rows.completion_ids[4] == ids("right")
    # One record for the reflection that read the stored lesson (a retry of it succeeded),
    # one offer of the reflection.
    assert [(e.reflection, e.reads, e.successes) for e in memory] == [
        ("Old lesson.", 2, 2),
        ("Fix q from Reward: 0.00.", 1, 1),
    ]
    assert result.metrics["erl/reflections"] == 1.0 and result.metrics["erl/retries"] == 3.0
    assert result.metrics["erl/retry_success_rate"] == pytest.approx(1 / 3)
    assert result.metrics["erl/memory_stored"] == 1.0 and step.tally["reflections"] == 1


def test_the_ith_failed_attempt_retries_with_reflection_i_mod_k():
    """k = 2, three failed attempts: attempts 0 and 1 reflect; attempts 0 and 2 retry with
    reflection 0 and are credited together; attempt 1, reflection 1's only retry, is
    credited as its reflection."""
    backend, calls = Scripted(outcomes=[1, 0, 0]), []
    step = ERLStep(settings(reflections_per_group=2), ReflectionMemory(5), recording(calls))
    result = step(backend, first_attempts(["q"] * 3, torch.tensor([0.0, 0.1, 0.2])), step=1)

    (reflections, _), (retries, _) = backend.generated
    assert len(reflections) == 2
    assert [advice(p) for p in retries] == [
        "Fix q from Reward: 0.00.",
        "Fix q from Reward: 0.10.",
        "Fix q from Reward: 0.00.",
    ]
    (groups, _, _, _), (_, r1_mean, r2_mean, _) = calls
    assert groups[0] == groups[2] != groups[1]
    assert r1_mean == pytest.approx([0.1, 0.1]) and r2_mean == pytest.approx([0.5, 0.0])
    # Retries 0 and 2 normalised together, retry 1 as its reflection; the two reflections
    # of the group normalised against each other.
    std = torch.tensor([1.0, 0.0]).std().item()
    spread = torch.tensor([0.5, 0.0]).std().item()
    reflection_1 = -0.25 / (spread + 1e-4)
    assert result.rows.advantages[2:5] == pytest.approx(
        [0.5 / (std + 1e-4), reflection_1, -0.5 / (std + 1e-4)]
    )
    assert result.rows.advantages[:2] == pytest.approx([0.25 / (spread + 1e-4), reflection_1])


def test_a_lone_failed_attempt_sharing_credits_both_rows_with_its_improvement():
    step = ERLStep(settings(reflections_per_group=1), ReflectionMemory(5))
    first = first_attempts(["a", "b"], torch.tensor([0.25, 1.0]))
    result = step(Scripted(outcomes=[1]), first, step=1)
    assert result.rows.advantages == pytest.approx([0.75, 0.75, 0.7])
    assert result.metrics["erl/retries"] == 1.0


def test_a_shared_reflection_reaches_retries_on_another_process():
    """k = 1, prompt "q" failed twice on process 0 and once on process 1: process 0's first
    "q" reflects and all three retry with it. The rows, advantages and memory are those of
    one process holding every row, and both processes add as many reflections and retries
    (process 1 pads a reflection and a retry with inert rows)."""
    r1 = [0.0, 0.5, 0.2, 1.0]
    alone = Scripted(outcomes=[0, 1, 1])
    memory = ReflectionMemory(10)
    one = ERLStep(settings(reflections_per_group=1), memory)(
        alone, first_attempts(["q", "q", "q", "z"], torch.tensor(r1)), step=2
    )
    first = [
        first_attempts(["q", "q"], torch.tensor(r1[:2])),
        first_attempts(["q", "z"], torch.tensor(r1[2:])),
    ]
    backends = [Scripted(outcomes=[0, 1]), Scripted(outcomes=[1])]
    memories = [ReflectionMemory(10), ReflectionMemory(10)]
    steps = [ERLStep(settings(reflections_per_group=1), m) for m in memories]
    both = in_two_processes(steps, backends, first, step=2)

    assert [advice(p) for p in backends[1].generated[1][0]][:1] == ["Fix q from Reward: 0.00."]
    assert [r.rows.valid[:3] for r in both] == [[True] * 3, [False, True, False]]
    assert len(both[0].rows.valid) == len(both[1].rows.valid) == 4  # 1 + 2 + 1 success each

    def kept(rows, start, stop):
        return [
            (rows.prompt_ids[j], rows.completion_ids[j], round(rows.advantages[j], 6))
            for j in range(start, stop)
            if rows.valid[j]
        ]

    for (start, stop), (alone_start, alone_stop) in (((0, 1), (0, 1)), ((1, 3), (1, 4))):
        spread = kept(both[0].rows, start, stop) + kept(both[1].rows, start, stop)
        assert spread == kept(one.rows, alone_start, alone_stop)
    assert both[0].rows.advantages[3:] + both[1].rows.advantages[3:] == one.rows.advantages[4:]
    assert both[0].metrics == both[1].metrics
    assert both[0].metrics["erl/retries"] == one.metrics["erl/retries"] == 3.0
    expected = [(e.reflection, e.reads, e.successes) for e in memory]
    assert [[(e.reflection, e.reads, e.successes) for e in m] for m in memories] == [expected] * 2
    assert expected == [("Fix q from Reward: 0.00.", 1, 1)]


def test_call_feedback_passes_the_columns_and_names_a_bad_function():
    seen = {}

    def hints(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
        seen.update(answer=answer, state=trainer_state, extra=sorted(kwargs))
        return [f"not {a}" for a in answer]

    rows = [{"prompt": "p", "answer": "4", "level": 1}]
    assert call_feedback(hints, rows, ["p"], ["5"], [[5]], trainer_state="s") == ["not 4"]
    assert seen == {"answer": ["4"], "state": "s", "extra": ["level"]}
    assert call_feedback(None, rows, ["p"], ["5"], [[5]]) == [NO_FEEDBACK]

    def short(completions, **kwargs):
        return []

    with pytest.raises(ValueError, match="feedback_func 'short' returned 0 feedback strings"):
        call_feedback(short, rows, ["p"], ["5"], [[5]])
    with pytest.raises(ValueError, match="must return strings, got int"):
        call_feedback(lambda **kwargs: [3], rows, ["p"], ["5"], [[5]])


def test_retry_advantages_alone_in_a_group_is_the_improvement():
    advantages = retry_advantages(
        ["a", "b"], torch.tensor([0.2, 0.0]), torch.tensor([0.5, math.nan]), [True, True], True
    )
    assert advantages == pytest.approx([0.3, 0.0])  # NaN r2 counts as 0


def test_the_step_module_imports_neither_trl_nor_transformers():
    """Neither in its own imports nor through what it imports."""
    tree = ast.parse(STEP.read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    assert not imported & {"trl", "transformers", "accelerate", "peft", "unsloth"}, imported
    code = (
        "import sys, pipeline.erl.step\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'trl', 'transformers'})\n"
        "assert not heavy, heavy"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=STEP.parents[2]
    )
    assert done.returncode == 0, done.stderr[-2000:]


class Episodes(Backend):
    """An episodic StepBackend: each attempt is an episode in a fresh environment reset with
    its row (its text joins the prompt), one tool result in the middle of its tokens."""

    episodic = True

    def __init__(self):
        super().__init__()
        self.resets: list[dict] = []

    def attempt(self, rows, prompts):
        environments = []
        for row in rows:
            self.resets.append(dict(row))
            environments.append({"start": row["start"]})
        observed = [p[:-1] + [{**p[-1], "content": p[-1]["content"] + " (at 3)"}] for p in prompts]
        generated = Generated(
            [ids(content(p)) for p in observed],
            [[1, 2, 3, 4]] * len(rows),
            ["call -> result right"] * len(rows),
            [None] * len(rows),
        )
        tasks = [r["prompt"][:-1] + [{**r["prompt"][-1], "content": "go (at 3)"}] for r in rows]
        episode = [
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {}}}]},
            {"role": "tool", "name": "look", "content": "a wall"},
            {"role": "assistant", "content": "right"},
        ]  # fmt: skip
        return Attempts(
            generated, tasks, [episode] * len(rows), [[1, 0, 0, 1]] * len(rows), environments
        )

    def score(self, rows, prompts, completions, completion_ids, environments=None):
        assert environments is not None and len(environments) == len(rows)
        self.scored.append({"rows": rows, "completions": completions})
        return torch.tensor(
            [float(c[-1]["content"] == r["answer"]) for r, c in zip(rows, completions)]
        )


def test_an_episodic_retry_is_a_fresh_episode_with_the_lesson_as_its_rulebook():
    """The retry starts from the row's own prompt with the reflection in its system message;
    rewards get the episode and its environment; retry and internalization rows keep the
    episode's tool mask, the internalized one under the task's prompt (reset text and all)."""
    backend = Episodes()
    prompt = [{"role": "system", "content": "Find the exit."}, {"role": "user", "content": "go"}]
    row = {"prompt": prompt, "answer": "right", "start": 3}
    episode = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "look", "arguments": {"far": True}}}]},
        {"role": "tool", "name": "look", "content": "a hole ahead"},
        {"role": "assistant", "content": "guess"},
    ]  # fmt: skip
    observed = [prompt[0], {"role": "user", "content": "go (at 3)"}]
    first = FirstAttempts(
        [row], [observed], [episode], [[1, 2, 3]], torch.tensor([0.0]), [{"trace": "fell"}]
    )
    result = ERLStep(settings(), ReflectionMemory(5))(backend, first, step=1)

    ((reflection,), _) = backend.generated[0]
    shown = reflection[0]["content"]
    assert 'Call look({"far": true})' in shown and "Result of look: a hole ahead" in shown
    assert backend.resets == [row]  # the retry's environment: reset with the first's row
    (scored,) = backend.scored
    assert scored["completions"][0][1]["content"] == "a wall"  # the retry's own episode
    rows = result.rows
    assert rows.tool_masks == [None, [1, 0, 0, 1], [1, 0, 0, 1]]  # reflection, retry, copy
    assert rows.prompt_ids[2] == ids("go (at 3)")  # the task's prompt, no lesson
    assert rows.completion_ids[2] == rows.completion_ids[1]


def test_the_retry_prompt_of_an_episode_puts_the_lesson_in_the_system_message():
    backend = Episodes()
    recorded = []
    backend.attempt = lambda rows, prompts: (
        recorded.append(prompts) or Episodes.attempt(backend, rows, prompts)
    )
    prompt = [{"role": "user", "content": "go"}]
    first = FirstAttempts(
        [{"prompt": prompt, "answer": "right", "start": 0}],
        [prompt],
        [[{"role": "assistant", "content": "guess"}]],
        [[1]],
        torch.tensor([0.0]),
    )
    ERLStep(settings(), ReflectionMemory(5))(backend, first, step=1)
    ((retry,),) = recorded
    assert retry[1] == prompt[0]  # the task as the first attempt had it
    assert retry[0]["role"] == "system"
    assert retry[0]["content"].startswith("Feedback on your attempt: not guess\n\nAdvice from")


def test_a_long_attempt_is_cut_in_the_middle_for_its_reflection_and_counted():
    backend = Backend()
    first = first_attempts(["What is 1+1?"], torch.tensor([0.0]))
    long = [[{"role": "assistant", "content": "start " + "x" * 500 + " the end"}]]
    first = FirstAttempts(first.rows, first.prompts, long, first.completion_ids, first.rewards)
    result = ERLStep(settings(reflection_attempt_max_chars=100), ReflectionMemory(5))(
        backend, first, step=1
    )
    shown = backend.generated[0][0][0][0]["content"]
    assert "start x" in shown and "x the end" in shown and "characters cut ...]" in shown
    assert result.metrics["erl/attempts_cut"] == 1.0


def test_feedback_without_a_function_reads_each_environments_feedback_property():
    class Env:
        def __init__(self, text):
            self.text = text

        @property
        def feedback(self):
            return self.text

    rows = [{"prompt": "p"}] * 3
    feedback = call_feedback(None, rows, ["p"] * 3, ["a"] * 3, [[1]] * 3, environments=[Env("fell in a hole"), object(), Env("ok")])  # fmt: skip
    assert feedback == ["fell in a hole", NO_FEEDBACK, "ok"]
    with pytest.raises(ValueError, match="Env.feedback must be a string"):
        call_feedback(None, rows[:1], ["p"], ["a"], [[1]], environments=[Env(3)])
