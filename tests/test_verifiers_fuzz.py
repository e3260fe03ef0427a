"""Fuzzing every verifier: whatever a model writes, `evaluate()` returns a sane verdict.

Base's contract: `Task.evaluate` never raises on a completion. Hypothesis throws arbitrary
text, huge numbers, deep nesting and wrong-typed JSON, inside and outside answer tags, at
every family, and each drawn completion is scored at every level of the family. The
properties: no exception, a finite reward and signals in [0, 1], feedback that can be
written as UTF-8, and at most 2 s per completion (a generous bound on one example, not a
benchmark: a verifier that goes quadratic or builds gigantic integers blows through it).

The examples are derandomized and no example database is kept, so CI draws the same
completions on every run.
"""

from __future__ import annotations

import json
import math
import time
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from curriculum.tasks import SIGNALS, Evaluation, Task, get_task, list_tasks

# A bound on the CPU time one verdict may take, not a speed target: it catches a verifier
# that hangs or blows up on hostile input (a huge power, a runaway regex). CPU time, so that
# a loaded machine does not fail it (wall time under two test workers and other jobs did).
CPU_SECONDS_PER_COMPLETION = 2.0
MAX_FEEDBACK_CHARS = 300  # per sentence ("one short sentence", says base.Evaluation)

# Family id -> (registered name, config). reasoning_gym runs two datasets: chain_sum has
# a numeric answer, sokoban a move plan replayed by reasoning-gym's own simulator.
FAMILIES: dict[str, tuple[str, dict]] = {
    "arithmetic": ("arithmetic", {}),
    "countdown": ("countdown", {}),
    "countdown-long": ("countdown", {"max_expression_chars": 1000}),
    "frozenlake": ("frozenlake", {}),
    "sokoban": ("sokoban", {}),
    "schedule": ("schedule", {}),
    "reasoning_gym-chain_sum": ("reasoning_gym", {"dataset": "chain_sum"}),
    "reasoning_gym-sokoban": ("reasoning_gym", {"dataset": "sokoban"}),
    "dataset": ("dataset", {}),  # its path is filled in by `_task`
    "hidden_rule": ("hidden_rule", {}),
    "hidden_code": ("hidden_code", {}),
    "hidden_code_agent": ("hidden_code_agent", {}),
    "frozenlake_agent": ("frozenlake_agent", {}),
    "sokoban_agent": ("sokoban_agent", {}),
    "lookup": ("lookup", {}),
}
# Examples per family and input kind; every example is scored at every level of the family.
EXAMPLES = 40

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # the per-completion CPU bound below is checked on the verifier alone
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The completions that crashed verifiers before (issue 8), checked on every family.
KNOWN_CRASHES = [
    "<answer>" + "9" * 310 + "</answer>",  # arithmetic: float division overflow
    "<answer>" + "9" * 4301 + "</answer>",  # arithmetic: int() refuses > 4300 digits
    "<answer>-" + "0" * 5000 + "7</answer>",
    '<answer>{"actions": [{"action": []}]}</answer>',  # schedule: unhashable action
    '<answer>{"actions": [{"action": {"move": 1}, "id": "m1"}]}</answer>',
]

# ----------------------------------------------------------------------------- strategies

_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    _JSON_LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
_ANY_TYPE = st.one_of(
    _JSON_LEAVES,
    st.lists(_JSON_LEAVES, max_size=3),
    st.dictionaries(st.sampled_from(["action", "id", "move", ""]), _JSON_LEAVES, max_size=2),
    st.sampled_from(["move", "cancel", "m1", "a1", "09:00", "25:99"]),
)
# Objects shaped like a schedule plan whose fields hold values of any JSON type, so the
# fuzz gets past the first checks into the per-action ones.
_ACTIONS = st.fixed_dictionaries(
    {"action": _ANY_TYPE}, optional={"id": _ANY_TYPE, "start": _ANY_TYPE, "x": _ANY_TYPE}
)
PLAN_LIKE = st.fixed_dictionaries(
    {"actions": st.lists(_ACTIONS | JSON_VALUES, max_size=5) | JSON_VALUES},
    optional={"rationale": st.none() | st.text(max_size=40) | JSON_VALUES},
)
WRONG_TYPED_JSON = (JSON_VALUES | PLAN_LIKE).map(json.dumps)

HUGE_NUMBERS = st.one_of(
    st.tuples(
        st.sampled_from(["", "-", "+"]),
        st.integers(0, 3000),  # leading zeros
        st.sampled_from("1579"),
        st.integers(300, 9000),  # digits
    ).map(lambda t: t[0] + "0" * t[1] + t[2] * t[3]),
    st.integers(300, 5000).map(lambda n: "9" * n + " * " + "9" * n),
    st.integers(300, 5000).map(lambda n: "9" * n + ".5"),
    st.integers(1, 10**12).map(lambda n: f"1e{n}"),
    st.integers(300, 5000).map(lambda n: '{"actions": [], "rationale": ' + "9" * n + "}"),
    st.integers().map(str),
)

_NESTINGS = [
    ("(", ")"),
    ("[", "]"),
    ('{"actions": [', "]}"),
    ('{"a": ', "}"),
    ("-", ""),
    ("<answer>", "</answer>"),
    ("<think>", "</think>"),
]
DEEP_NESTING = st.builds(
    lambda pair, depth, balanced: pair[0] * depth + "1" + (pair[1] * depth if balanced else ""),
    st.sampled_from(_NESTINGS),
    st.integers(1, 20_000),
    st.booleans(),
)

# Text close to what each family reads, so that the fuzz gets past the first parse.
MOVE_PLANS = st.lists(
    st.sampled_from(["U", "D", "L", "R", "u", "r", "UU", "x", ",", "\n"]), max_size=300
).map(" ".join)
EXPRESSIONS = st.text(alphabet="0123456789+-*/() ", max_size=250)

# Input kind -> the answer bodies it draws. Each kind is its own test, so every kind
# gets its share of examples at every family.
BODIES = {
    "text": st.text(max_size=300) | MOVE_PLANS | EXPRESSIONS,
    "huge numbers": HUGE_NUMBERS,
    "deep nesting": DEEP_NESTING,
    "wrong-typed json": WRONG_TYPED_JSON,
}
SHAPES = ["bare", "tagged", "after think", "with noise", "unclosed", "twice"]


def _wrap(shape: str, body: str, noise: str) -> str:
    """`body` as a whole reply of the given shape, inside or outside answer tags."""
    return {
        "bare": body,
        "tagged": f"<answer>{body}</answer>",
        "after think": f"<think>{noise}</think><answer>{body}</answer>",
        "with noise": f"{noise}<answer>{body}</answer>{noise}",
        "unclosed": f"<answer>{body}",
        "twice": f"<answer>{noise}</answer><answer>{body}</answer>",
    }[shape]


def completions(kind: str) -> st.SearchStrategy[str]:
    """Whole replies built around bodies of `kind`."""
    return st.builds(_wrap, st.sampled_from(SHAPES), BODIES[kind], st.text(max_size=30))


# ----------------------------------------------------------------------------- families


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory) -> Path:
    """A small jsonl table for the `dataset` family: numeric and text answers, 3 levels."""
    path = tmp_path_factory.mktemp("fuzz") / "table.jsonl"
    records = [
        {"question": f"q{d}-{k}", "answer": answer, "difficulty": d}
        for d in (1, 2, 3)
        for k, answer in enumerate(["42", "-3.5", "1,234", "3/4", "Paris", "[1, 2]"])
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    return path


@cache
def _task(family: str, dataset_path: str) -> tuple[Task, tuple[dict, ...]]:
    """The family's task and one row per level (built once per module run)."""
    name, config = FAMILIES[family]
    if name == "reasoning_gym":
        pytest.importorskip("reasoning_gym")
    if name == "dataset":
        config = {"path": dataset_path}
    task = get_task(name, **config)
    # Seed 0: reasoning-gym's sokoban generator searches for a while on some seeds (up to
    # a minute here); on seed 0 its 14 levels take a few seconds.
    rows = tuple(task.generate(level, 1, seed=0)[0] for level in task.levels)
    return task, rows


def check(task: Task, evaluation: Evaluation, elapsed: float, what: str) -> None:
    """The properties every verdict keeps."""
    assert isinstance(evaluation, Evaluation), what
    assert math.isfinite(evaluation.reward) and 0.0 <= evaluation.reward <= 1.0, what
    assert set(task.signals) <= set(evaluation.breakdown) <= set(SIGNALS), what
    for signal, value in evaluation.breakdown.items():
        assert math.isfinite(value) and 0.0 <= value <= 1.0, f"{what}: {signal}={value}"
    # Feedback goes into reflection prompts and JSON logs: short, valid text whatever the
    # completion held.
    for text in [*evaluation.feedback.values(), evaluation.error or ""]:
        text.encode("utf-8")
        assert len(text) <= MAX_FEEDBACK_CHARS, f"{what}: feedback {text[:80]!r}..."
    assert elapsed < CPU_SECONDS_PER_COMPLETION, f"{what}: took {elapsed:.2f} s of CPU"


def test_every_registered_family_is_fuzzed():
    assert {name for name, _ in FAMILIES.values()} == set(list_tasks())


def score_at_every_level(family: str, completion: str, dataset_file: Path) -> None:
    """Score `completion` on one row of every level of `family` and check each verdict."""
    task, rows = _task(family, str(dataset_file))
    for row in rows:
        start = time.thread_time()
        evaluation = task.evaluate(row, completion)
        elapsed = time.thread_time() - start
        check(task, evaluation, elapsed, f"{family} level {row['level']}: {completion[:80]!r}")


@pytest.mark.parametrize("kind", list(BODIES))
@pytest.mark.parametrize("family", list(FAMILIES))
@FUZZ
@given(data=st.data())
def test_verifiers_never_raise_on_model_output(family, kind, data, dataset_file):
    completion = data.draw(completions(kind), label="completion")
    score_at_every_level(family, completion, dataset_file)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(
    "completion",
    [
        "",
        "<answer>" + "(" * 100_000 + "</answer>",
        "<answer>" + "[" * 5_000 + "]" * 5_000 + "</answer>",
        "<answer>" + "\udcff\x00" * 100 + "</answer>",
        *KNOWN_CRASHES,
    ],
    ids=[
        "empty",
        "open parens",
        "nested lists",
        "surrogates",
        *map(str, range(len(KNOWN_CRASHES))),
    ],
)
def test_extreme_completions_are_scored_not_raised(family, completion, dataset_file):
    score_at_every_level(family, completion, dataset_file)


def test_evaluation_scores_the_issue_8_crashes_without_a_verifier_failure():
    """`pipeline.evaluate`'s scoring path: once a verifier raised, now nothing fails."""
    from pipeline.evaluate.first_attempts import score_completions

    for name in ("arithmetic", "schedule"):
        task = get_task(name)
        rows = task.generate(1, len(KNOWN_CRASHES), seed=0)
        result = score_completions(task, rows, KNOWN_CRASHES)
        assert result.failure_rate == 0.0, (name, result.samples)
        assert result.success_rate == 0.0
