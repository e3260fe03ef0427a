"""Reward functions, the shared scorer, feedback and the generations log, on real tasks."""

from __future__ import annotations

import doctest
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks import Evaluation, get_task
from curriculum.tasks.arithmetic import ArithmeticTask
from rewards import (
    FAILURE_METRIC,
    Scorer,
    build_feedback_func,
    build_reward_funcs,
    completion_text,
    length_penalty,
)
from rewards.generations_log import MAX_TEXT_CHARS

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {"correctness": 1.0, "format": 0.2, "milestones": 0.5, "length": 0.1}


class CountingArithmetic(ArithmeticTask):
    """Arithmetic that counts its verifier calls."""

    calls = 0

    def evaluate(self, row, completion):
        CountingArithmetic.calls += 1
        return super().evaluate(row, completion)


class RaisingArithmetic(ArithmeticTask):
    """Arithmetic whose verifier has a bug: it raises on replies that mention 'boom'."""

    def evaluate(self, row, completion):
        if "boom" in completion:
            raise RuntimeError(f"verifier bug, expected {row['answer']}")
        return super().evaluate(row, completion)


class NaNArithmetic(ArithmeticTask):
    """Arithmetic whose verifier returns NaN for replies that mention 'nan'."""

    def evaluate(self, row, completion):
        if "nan" in completion:
            return Evaluation(math.nan, dict.fromkeys(self.signals, math.nan))
        return super().evaluate(row, completion)


@dataclass
class TrainerState:
    """The one field of transformers' TrainerState that rewards read (importing the real one
    pulls in torch, which these tests otherwise never need)."""

    global_step: int


def columns(rows: list[dict]) -> dict[str, list]:
    """The keyword arguments GRPOTrainer passes for these rows (every column but prompt)."""
    cols = {name: [row[name] for row in rows] for name in ("task", "level", "answer", "meta")}
    cols["prompts"] = [row["prompt"] for row in rows]
    return cols


def call_all(funcs, completions, rows, **extra) -> list[list[float]]:
    """Call every reward function the way GRPOTrainer does, one after the other."""
    ids = [[1, 2]] * len(completions)
    return [
        fn(completions=completions, completion_ids=ids, **columns(rows), **extra) for fn in funcs
    ]


@pytest.fixture
def task():
    return get_task("arithmetic")


# ----------------------------------------------------------------------------- building


def test_functions_follow_weight_order_and_are_named_after_signals(task):
    funcs, weights = build_reward_funcs(task, {"milestones": 0.5, "correctness": 1, "length": 0.1})
    assert [fn.__name__ for fn in funcs] == [
        "milestones_reward",
        "correctness_reward",
        "length_reward",
    ]
    assert weights == [0.5, 1.0, 0.1]
    assert all(fn.__doc__ and ">>>" in fn.__doc__ for fn in funcs)


@pytest.mark.parametrize(
    ("weights", "named"),
    [
        ({}, "non-empty"),
        ({"speed": 1.0}, "'speed'"),
        ({"reasoning": 1.0}, "'reasoning'"),  # a signal arithmetic does not report
        ({"correctness": math.nan}, "'correctness'"),
        ({"format": math.inf}, "'format'"),
        ({"format": "1"}, "'format'"),
    ],
)
def test_bad_weights_raise_naming_them_and_listing_valid_signals(task, weights, named):
    for build in (build_reward_funcs, build_feedback_func):
        with pytest.raises(ValueError, match=named) as info:
            build(task, weights)
        if "weight of" not in str(info.value):
            assert "['format', 'correctness', 'milestones', 'length']" in str(info.value)


@pytest.mark.parametrize(
    ("option", "value"), [("fallback", math.nan), ("length_budget", 0), ("log_every", 0)]
)
def test_bad_options_raise_naming_them(task, tmp_path, option, value):
    with pytest.raises(ValueError, match=option):
        build_reward_funcs(task, {"format": 1.0}, log_dir=str(tmp_path), **{option: value})


def test_rows_of_another_task_or_missing_columns_raise(task):
    (fn,), _ = build_reward_funcs(task, {"format": 1.0})
    rows = task.generate(1, 2)
    cols = columns(rows)
    cols["task"] = ["arithmetic", "countdown"]
    with pytest.raises(ValueError, match="'countdown'"):
        fn(completions=["<answer>1</answer>"] * 2, **cols)
    cols = columns(rows)
    del cols["meta"]
    with pytest.raises(ValueError, match="'meta'"):
        fn(completions=["<answer>1</answer>"] * 2, **cols)


def test_a_scorer_for_another_task_instance_is_refused(task):
    with pytest.raises(ValueError, match="same task"):
        build_reward_funcs(task, {"format": 1.0}, scorer=Scorer(get_task("arithmetic")))


# ----------------------------------------------------------------------------- values


def test_reference_completion_gets_the_maximum_of_every_signal(task):
    funcs, _ = build_reward_funcs(task, WEIGHTS)
    for level in task.levels:
        rows = task.generate(level, 4, seed=level)
        values = call_all(funcs, [task.reference(r) for r in rows], rows)
        assert dict(zip(WEIGHTS, values, strict=True)) == {
            "correctness": [1.0] * 4,
            "format": [1.0] * 4,
            "milestones": [1.0] * 4,
            "length": [0.0] * 4,
        }


def test_wrong_and_sloppy_answers_score_in_between(task):
    funcs, _ = build_reward_funcs(task, WEIGHTS)
    rows = [task.generate(3, 1)[0]] * 2
    wrong = f"<answer>{int(rows[0]['answer']) + 1}</answer>"
    sloppy = f"The result: <answer>{rows[0]['answer']}</answer>"
    correctness, fmt, milestones, length = call_all(funcs, [wrong, sloppy], rows)
    assert correctness == [0.0, 0.0]
    assert fmt == [1.0, 0.5]
    assert 0 < milestones[0] < 1 and milestones[1] == 1.0
    assert length == [0.0, 0.0]


def test_a_repeated_verifier_warning_is_logged_once_and_counted(caplog):
    """A verifier that raises on every call warns once; the stage reports the repeats."""
    task = RaisingArithmetic()
    scorer = Scorer(task, cache_size=0)
    funcs, _ = build_reward_funcs(task, WEIGHTS, scorer=scorer)
    row = task.generate(2, 1, seed=3)
    with caplog.at_level("WARNING", logger="rewards.scoring"):
        for _ in range(17):
            call_all(funcs, ["<answer>boom</answer>"], row)
    warned = [r.getMessage() for r in caplog.records if "verifier raised" in r.getMessage()]
    assert len(warned) == 1 and "repeats are counted" in warned[0]
    (line,) = scorer.repeated_warnings()
    assert (
        line.startswith("task 'arithmetic' verifier raised RuntimeError")
        and "(16 more times)" in line
    )
    assert scorer.repeated_warnings() == []


def test_unparseable_completion_scores_the_fallback_in_every_signal(task):
    scorer = Scorer(task)
    funcs, _ = build_reward_funcs(task, WEIGHTS, fallback=-0.75, scorer=scorer)
    rows = task.generate(1, 2)
    values = call_all(funcs, ["I think it is seven", task.reference(rows[1])], rows)
    assert [v[0] for v in values] == [-0.75] * 4
    assert [v[1] for v in values] == [1.0, 1.0, 1.0, 0.0]
    assert (scorer.failures, scorer.completions, dict(scorer.failure_kinds)) == (
        1,
        2,
        {"parse_error": 1},
    )


def test_a_raising_verifier_scores_the_fallback_and_never_leaks(tmp_path):
    task = RaisingArithmetic()
    scorer = Scorer(task)
    funcs, _ = build_reward_funcs(task, WEIGHTS, scorer=scorer)
    feedback = build_feedback_func(task, WEIGHTS, scorer=scorer)
    rows = task.generate(2, 2)
    completions = ["<answer>boom</answer>", task.reference(rows[1])]
    values = call_all(funcs, completions, rows)
    assert [v[0] for v in values] == [-0.5] * 4
    assert [v[1] for v in values] == [1.0, 1.0, 1.0, 0.0]
    assert scorer.failure_kinds == {"verifier_raised": 1}
    text = feedback(completions=completions, **columns(rows))[0]
    assert text and "verifier bug" not in text and rows[0]["answer"] not in text


def test_nan_values_score_the_fallback():
    task = NaNArithmetic()
    scorer = Scorer(task)
    funcs, _ = build_reward_funcs(task, WEIGHTS, scorer=scorer)
    rows = task.generate(1, 2)
    values = call_all(funcs, ["<answer>nan</answer>", task.reference(rows[1])], rows)
    assert all(v[0] == -0.5 for v in values) and all(math.isfinite(x) for v in values for x in v)
    assert scorer.failure_kinds == {"bad_value": 1}


def test_the_failure_rate_reaches_log_metric_once_per_batch(task):
    funcs, _ = build_reward_funcs(task, WEIGHTS)
    rows = task.generate(1, 4)
    logged: list[tuple[str, float]] = []
    completions = ["junk", "", task.reference(rows[2]), "<answer>0</answer>"]
    call_all(funcs, completions, rows, log_metric=lambda name, value: logged.append((name, value)))
    assert logged == [(FAILURE_METRIC, 0.5)]
    call_all(
        funcs,
        [task.reference(r) for r in rows],
        rows,
        log_metric=lambda n, v: logged.append((n, v)),
    )
    assert logged == [(FAILURE_METRIC, 0.5), (FAILURE_METRIC, 0.0)]


@pytest.mark.parametrize("cache_size", [0, 4096])
def test_each_completion_is_evaluated_once_per_step_across_signals(cache_size):
    task = CountingArithmetic()
    scorer = Scorer(task, cache_size=cache_size)
    funcs, _ = build_reward_funcs(task, WEIGHTS, scorer=scorer)
    feedback = build_feedback_func(task, WEIGHTS, scorer=scorer)
    rows = task.generate(5, 6)
    assert len({r["answer"] for r in rows}) == 6  # else equal pairs would share an evaluation
    completions = [task.reference(r) for r in rows[:3]] + ["x", "<answer>-999</answer>", "<answer>"]
    CountingArithmetic.calls = 0
    call_all(funcs, completions, rows)
    feedback(completions=completions, **columns(rows))
    assert CountingArithmetic.calls == scorer.evaluations == 6
    assert (scorer.batches, scorer.failures) == (1, 2)
    # ERL asks feedback for the gated rows only: nothing is counted twice, and with a
    # cache nothing is verified twice either.
    feedback(completions=completions[3:], **columns(rows[3:]))
    assert (scorer.batches, scorer.failures) == (1, 2)
    assert CountingArithmetic.calls == (6 if cache_size else 9)
    # The next step brings the same completions again: a new batch, counted again.
    before = CountingArithmetic.calls
    call_all(funcs, completions, rows)
    assert (scorer.batches, scorer.failures) == (2, 4)
    assert CountingArithmetic.calls - before == (0 if cache_size else 6)


def test_conversational_and_plain_completions_score_the_same(task):
    funcs, _ = build_reward_funcs(task, WEIGHTS)
    rows = task.generate(4, 3)
    plain = [task.reference(rows[0]), "<answer>12</answer>", "nothing"]
    chat = [[{"role": "assistant", "content": text}] for text in plain]
    assert call_all(funcs, chat, rows) == call_all(funcs, plain, rows)
    parts = [{"role": "assistant", "content": [{"type": "text", "text": plain[0]}]}]
    assert completion_text(parts) == plain[0]


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(max_size=300) | st.builds(lambda s: f"<answer>{s}</answer>", st.text(max_size=40))
)
def test_any_text_scores_finite_values_and_gets_feedback(text):
    task = get_task("arithmetic")
    scorer = Scorer(task)
    funcs, _ = build_reward_funcs(task, WEIGHTS, length_budget=50, scorer=scorer)
    feedback = build_feedback_func(task, WEIGHTS, length_budget=50, scorer=scorer)
    rows = task.generate(5, 1)
    for value in (v for values in call_all(funcs, [text], rows) for v in values):
        assert math.isfinite(value) and -1.0 <= value <= 1.0
    assert feedback(completions=[text], **columns(rows))[0].strip()


def test_length_penalty_is_zero_within_budget_and_minus_one_at_twice_it():
    assert [length_penalty(n, 100) for n in (0, 100, 125, 200, 10_000)] == [
        0.0,
        0.0,
        -0.25,
        -1.0,
        -1.0,
    ]


@pytest.mark.parametrize(
    ("family", "signals"),
    [
        ("arithmetic", ("format", "correctness", "milestones", "length")),
        ("countdown", ("plausibility",)),
        ("schedule", ("reasoning",)),
    ],
)
def test_docstring_examples_run(family, signals):
    try:
        task = get_task(family)
    except ImportError as exc:
        if not (exc.name or "").startswith("curriculum.tasks."):
            raise
        pytest.skip(f"task module {exc.name} does not exist yet")
    funcs, _ = build_reward_funcs(task, dict.fromkeys(signals, 1.0))
    objects = [*funcs, length_penalty, build_feedback_func] if family == "arithmetic" else funcs
    globs = {
        "build_reward_funcs": build_reward_funcs,
        "build_feedback_func": build_feedback_func,
        "length_penalty": length_penalty,
    }
    for obj in objects:
        tests = doctest.DocTestFinder(recurse=False).find(obj, obj.__name__, globs=dict(globs))
        results = [doctest.DocTestRunner().run(test) for test in tests]
        assert sum(r.attempted for r in results) > 0 and not any(r.failed for r in results), obj


# ----------------------------------------------------------------------------- feedback


def test_feedback_names_the_fact_and_never_the_answer_unless_revealed():
    for reveal in (False, True):
        task = get_task("arithmetic", reveal_answer=reveal)
        feedback = build_feedback_func(task, WEIGHTS, length_budget=30)
        rows = task.generate(3, 3, seed=7)
        expected = int(rows[0]["answer"])
        completions = [
            f"<answer>{expected + 57}</answer>",
            "no tags here",
            task.reference(rows[2]) + " " * 40,
        ]
        wrong, unparsed, too_long = feedback(completions=completions, **columns(rows))
        assert f"{expected + 57}" in wrong and "too high" in wrong
        assert bool(re.search(rf"(?<!\d){expected}(?!\d)", wrong)) is reveal
        assert "<answer>" in unparsed and rows[1]["answer"] not in unparsed
        assert f"{len(completions[2])} characters" in too_long and "under 30" in too_long
        assert "correct" in too_long  # the answer itself was right


def test_feedback_reports_only_weighted_signals_but_never_calls_a_wrong_answer_correct(task):
    rows = task.generate(3, 2, seed=3)
    off = f"<answer>{int(rows[0]['answer']) + 3}</answer>"
    sloppy = f"so <answer>{rows[1]['answer']}</answer>"
    only_format = build_feedback_func(task, {"format": 1.0})
    wrong, sloppy_text = only_format(completions=[off, sloppy], **columns(rows))
    assert "correct." not in wrong and "wrong" in wrong  # falls back to the task's full feedback
    assert "exactly <answer>N</answer>" in sloppy_text and "off by" not in sloppy_text


# ----------------------------------------------------------------------------- generations log


def test_generations_are_logged_every_n_calls_with_all_fields(task, tmp_path):
    log_dir = tmp_path / "new" / "logs"
    funcs, _ = build_reward_funcs(task, WEIGHTS, log_dir=str(log_dir), log_every=3)
    rows = task.generate(1, 4)
    for step in range(7):
        completions = [f"<answer>{step}</answer>", "\udcff\x00 junk" * 1000, "a", "b"]
        call_all(funcs, completions, rows, trainer_state=TrainerState(global_step=step))
    lines = (log_dir / "generations.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 0, 3, 3, 6, 6]
    fields = {"step", "task", "level", "prompt", "completion", "reward", "breakdown", "feedback"}
    assert all(fields <= set(r) for r in records)
    first, garbage = records[-2:]
    assert first["completion"] == "<answer>6</answer>" and first["prompt"] == rows[0]["prompt"]
    assert first["breakdown"]["correctness"] == float(rows[0]["answer"] == "6")
    assert first["reward"] == pytest.approx(
        sum(WEIGHTS[s] * v for s, v in first["breakdown"].items())
    )
    assert garbage["reward"] == pytest.approx(-0.5 * sum(WEIGHTS.values()))
    assert (
        garbage["completion"].startswith("\udcff\x00 junk")
        and len(garbage["completion"]) < MAX_TEXT_CHARS + 50
    )
    assert garbage["feedback"] and garbage["failure"] == "parse_error"


def test_rewards_import_no_torch_or_trl():
    code = "import sys, rewards; print(sorted({'torch', 'trl'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]"
