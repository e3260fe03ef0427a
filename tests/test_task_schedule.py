"""Schedule: agenda generator, JSON plan parser, simulator, signals and feedback."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks.schedule import LEVELS, SYSTEM_PROMPT, ScheduleTask
from curriculum.tasks.schedule_agenda import (
    MAX_ACTIONS,
    Agenda,
    Item,
    Plan,
    conflicts,
    minutes,
    parse_plan,
)

TASK = ScheduleTask()

# A hand-made day, 09:00-13:00, whose outcomes are easy to work out:
#   m1 09:00-10:00         a1 09:30-10:00 overlaps m1
#   f1 10:00-11:30 fixed   m2 11:00-12:00 overlaps f1
# One fix: a1 to 11:30 and m2 to 12:00.
HAND_ITEMS = [
    {"id": "m1", "title": "Team sync", "start": "09:00", "end": "10:00", "fixed": False},
    {"id": "a1", "title": "Bank", "start": "09:30", "end": "10:00", "fixed": False},
    {"id": "f1", "title": "Flight", "start": "10:00", "end": "11:30", "fixed": True},
    {"id": "m2", "title": "1:1", "start": "11:00", "end": "12:00", "fixed": False},
]
SOLUTION = [
    {"action": "move", "id": "a1", "start": "11:30"},
    {"action": "move", "id": "m2", "start": "12:00"},
]


def hand_row() -> dict:
    answer = json.dumps({"actions": SOLUTION, "rationale": "Move a1 to 11:30 and m2 to 12:00."})
    conflicts_ = [["m1", "a1"], ["f1", "m2"]]
    return TASK.make_row(
        1,
        SYSTEM_PROMPT,
        "hand-made",
        answer,
        items=HAND_ITEMS,
        day=["09:00", "13:00"],
        conflicts=conflicts_,
    )


def reply(actions: list, rationale: str | None = "Move a1 and m2.") -> str:
    body = (
        {"actions": actions} if rationale is None else {"actions": actions, "rationale": rationale}
    )
    return f"<answer>{json.dumps(body)}</answer>"


def score(actions: list, rationale: str | None = "Move a1 and m2.", task: ScheduleTask = TASK):
    return task.evaluate(hand_row(), reply(actions, rationale))


def move(item_id: str, start: str) -> dict:
    return {"action": "move", "id": item_id, "start": start}


def agenda_of(row: dict) -> Agenda:
    meta = json.loads(row["meta"])
    items = {
        i["id"]: Item(i["title"], minutes(i["start"]), minutes(i["end"]), i["fixed"])
        for i in meta["items"]
    }
    return Agenda(minutes(meta["day"][0]), minutes(meta["day"][1]), items)


# Generation ------------------------------------------------------------------------------


@pytest.mark.parametrize("level", list(LEVELS))
def test_reference_solves_every_level(level):
    spec = LEVELS[level]
    for row in TASK.generate(level, 40, seed=level * 100):
        meta = json.loads(row["meta"])
        agenda = agenda_of(row)
        assert len(agenda.items) == spec.items
        assert sum(item.fixed for item in agenda.items.values()) == spec.fixed
        assert all(
            agenda.day_start <= i.start < i.end <= agenda.day_end for i in agenda.items.values()
        )
        assert meta["conflicts"] and [tuple(p) for p in meta["conflicts"]] == conflicts(agenda)
        moved = [a["id"] for a in json.loads(row["answer"])["actions"]]
        assert len(moved) == spec.displaced and not any(agenda.items[i].fixed for i in moved)
        evaluation = TASK.evaluate(row, TASK.reference(row))
        assert evaluation.reward == 1.0
        assert evaluation.breakdown == dict.fromkeys(TASK.signals, 1.0)
        assert evaluation.feedback == {}
        assert evaluation.error is None


def test_difficulty_grows_with_level():
    def averages(level):
        rows = TASK.generate(level, 40, seed=2)
        metas = [json.loads(r["meta"]) for r in rows]
        return (
            sum(len(m["items"]) for m in metas) / len(rows),
            sum(len(m["conflicts"]) for m in metas) / len(rows),
            sum(sum(i["fixed"] for i in m["items"]) for m in metas) / len(rows),
        )

    stats = [averages(level) for level in TASK.levels]
    for easier, harder in itertools.pairwise(stats):
        assert all(h >= e for h, e in zip(harder, easier, strict=True))
    assert all(h > e for h, e in zip(stats[-1], stats[0], strict=True))


def test_prompt_shows_conflicts_only_at_easy_levels():
    easy, hard = TASK.generate(1, 1)[0], TASK.generate(TASK.num_levels, 1)[0]
    assert "Conflicts:" in easy["prompt"][1]["content"]
    assert "Conflicts:" not in hard["prompt"][1]["content"]


def test_bad_config_raises_naming_the_key():
    with pytest.raises(ValueError, match="cancel_credit"):
        ScheduleTask(cancel_credit=1.5)
    with pytest.raises(ValueError, match="max_rationale_chars"):
        ScheduleTask(max_rationale_chars=10)
    with pytest.raises(ValueError, match="unknown config key"):
        ScheduleTask(slots=3)


# Simulator, signals and feedback ---------------------------------------------------------


def test_touching_items_do_not_conflict():
    agenda = Agenda(0, 600, {"x": Item("x", 60, 120, False), "y": Item("y", 120, 180, False)})
    assert conflicts(agenda) == []
    agenda.items["y"] = Item("y", 119, 180, False)
    assert conflicts(agenda) == [("x", "y")]


def test_a_full_solution_scores_one():
    evaluation = score(SOLUTION)
    assert evaluation.reward == 1.0 and evaluation.feedback == {}


def test_moving_a_fixed_item_is_refused():
    evaluation = score([move("f1", "12:00"), *SOLUTION])
    assert evaluation.feedback["plausibility"] == "f1 is fixed and cannot be moved."
    assert evaluation.breakdown["plausibility"] == pytest.approx(2 / 3)
    assert evaluation.reward == 0.0 and "invalid actions" in evaluation.feedback["correctness"]


def test_cancelling_a_fixed_item_is_refused():
    evaluation = score([{"action": "cancel", "id": "f1"}])
    assert evaluation.feedback["plausibility"] == "f1 is fixed and cannot be cancelled."
    assert evaluation.breakdown["milestones"] == 0.0


def test_partial_fix_names_the_remaining_conflict():
    evaluation = score([move("m2", "12:00")], rationale="Move m2 after the flight.")
    assert evaluation.breakdown["milestones"] == 0.5
    assert evaluation.feedback["milestones"] == "m1 (09:00-10:00) still overlaps a1 (09:30-10:00)."
    assert evaluation.feedback["correctness"] == "1 conflict remains, so the day is not fixed yet."
    assert evaluation.reward == 0.0


def test_a_new_conflict_is_named_and_halves_the_credit():
    evaluation = score([move("a1", "12:00"), move("m2", "12:00")])
    assert evaluation.breakdown["milestones"] == 0.5  # both resolved, one created
    assert evaluation.feedback["milestones"] == (
        "a1 (12:00-12:30) now overlaps m2 (12:00-13:00), a new conflict."
    )


def test_needless_cancellation_earns_only_cancel_credit():
    plan = [{"action": "cancel", "id": "a1"}, move("m2", "12:00")]
    evaluation = score(plan)
    assert evaluation.reward == 0.5 and evaluation.breakdown["milestones"] == 1.0
    assert "Cancelling a1 was not needed" in evaluation.feedback["correctness"]
    assert score(plan, task=ScheduleTask(cancel_credit=0.0)).reward == 0.0


@pytest.mark.parametrize(
    "action, message",
    [
        (move("m2", "12:30"), "Moving m2 to 12:30 ends at 13:30, after the day ends at 13:00."),
        (move("a1", "08:30"), "Moving a1 to 08:30 starts before the day starts at 09:00."),
        (move("m2", "2pm"), "'2pm' for m2 is not a time; use HH:MM."),
        (move("m2", "24:00"), "'24:00' for m2 is not a time; use HH:MM."),
        (move("m9", "12:00"), "There is no item with id 'm9'."),
    ],
)
def test_invalid_actions_are_named(action, message):
    evaluation = score([action])
    assert evaluation.feedback["plausibility"] == message
    assert evaluation.breakdown["plausibility"] == 0.0


def test_acting_on_a_cancelled_item_is_invalid():
    evaluation = score([{"action": "cancel", "id": "a1"}, move("a1", "11:30")])
    assert "a1 was already cancelled" in evaluation.feedback["plausibility"]


def test_reasoning_wants_a_short_rationale_naming_the_items():
    assert score(SOLUTION, rationale=None).breakdown["reasoning"] == 0.0
    assert "rationale" in score(SOLUTION, rationale=None).feedback["reasoning"]
    partial = score(SOLUTION, rationale="Move m2 after the flight.")
    assert partial.breakdown["reasoning"] == 0.75
    assert (
        partial.feedback["reasoning"]
        == "The rationale does not mention a1, which the plan acts on."
    )
    long = score(SOLUTION, rationale="Move a1 and m2. " + "x" * 700)
    assert long.breakdown["reasoning"] == 0.75 and "keep it under 600" in long.feedback["reasoning"]
    assert score(SOLUTION, rationale="Move a10 and m20.").breakdown["reasoning"] == 0.5


def test_format_requires_the_answer_tag_alone():
    row, body = hand_row(), json.dumps({"actions": SOLUTION, "rationale": "a1 and m2 move."})
    assert (
        TASK.evaluate(row, f"<think>a1 clashes with m1</think>\n<answer>{body}</answer>").reward
        == 1.0
    )
    chatty = TASK.evaluate(row, f"Here is my plan: <answer>{body}</answer>")
    assert chatty.breakdown["format"] == 0.5 and chatty.reward == 0.0
    bare = TASK.evaluate(row, body)
    assert bare.error is not None and bare.reward == 0.0


@pytest.mark.parametrize(
    "content, words",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"plan": []}', "'plan'"),
        ('{"actions": {}}', '"actions" list'),
        ('{"actions": [], "rationale": 3}', "string"),
        ('{"actions": [{"action": "swap", "id": "m1"}]}', '"move" or "cancel"'),
        # Unhashable "action" values (issue 8: they raised TypeError).
        ('{"actions": [{"action": []}]}', '"move" or "cancel"'),
        ('{"actions": [{"action": {"move": 1}, "id": "m1"}]}', '"move" or "cancel"'),
        ('{"actions": [{"action": "move", "id": "m1"}]}', '"start"'),
        ('{"actions": [{"action": "move", "id": 1, "start": "10:00"}]}', '"id"'),
        (
            '{"actions": [{"action": "move", "id": "m1", "start": "10:00", "end": "11:00"}]}',
            "'end'",
        ),
        ('{"actions": [' + ", ".join(['{"action": "cancel", "id": "a1"}'] * 40) + "]}", "limit"),
    ],
)
def test_schema_errors_fail_format_with_a_reason(content, words):
    evaluation = TASK.evaluate(hand_row(), f"<answer>{content}</answer>")
    assert evaluation.breakdown == dict.fromkeys(TASK.signals, 0.0)
    assert words in evaluation.feedback["format"]
    assert evaluation.error is None and evaluation.feedback_text()


def test_reveal_answer_adds_a_plan_only_when_enabled():
    assert "A working plan" not in score([]).feedback["correctness"]
    assert '"a1"' in score([], task=ScheduleTask(reveal_answer=True)).feedback["correctness"]


HOSTILE = [
    "",
    "x" * 1_000_000,
    "<answer>" * 200_000,
    "<answer>" + "[" * 3000 + "]" * 3000 + "</answer>",
    "<answer>" + "[" * 500_000 + "</answer>",
    '<answer>{"actions": [1' + "0" * 5000 + "]}</answer>",
    "\udcff\x00\ufffd",
    "<answer>\udcff\x00\ufffd</answer>",
    '<answer>{"actions": [{"action": "move", "id": "\udcff", "start": "\x00"}]}</answer>',
    "<answer>NaN</answer>",
    "<answer></answer>",
    "</answer><answer>",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_score_low_with_feedback(completion):
    start = time.perf_counter()
    evaluation = TASK.evaluate(hand_row(), completion)
    assert time.perf_counter() - start < 1.0
    assert evaluation.reward < 1.0
    assert evaluation.feedback_text()
    assert set(evaluation.breakdown) == set(TASK.signals)


# Property tests --------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_IDS = st.sampled_from(["m1", "a1", "f1", "m2", "zz", ""])
_TIMES = st.sampled_from(["08:00", "09:00", "10:30", "11:30", "12:00", "12:30", "25:61", "noon"])
_ACTIONS = st.one_of(
    st.builds(lambda i, t: {"action": "move", "id": i, "start": t}, _IDS, _TIMES),
    st.builds(lambda i: {"action": "cancel", "id": i}, _IDS),
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_random_json_never_raises(data):
    text = json.dumps(data)
    assert isinstance(parse_plan(text), Plan | str)
    evaluation = TASK.evaluate(hand_row(), f"<answer>{text}</answer>")
    assert evaluation.feedback_text() and evaluation.reward < 1.0


@settings(max_examples=300, deadline=None)
@given(st.lists(_ACTIONS, max_size=MAX_ACTIONS), st.none() | st.text(max_size=40))
def test_random_plans_score_within_bounds(actions, rationale):
    evaluation = score(actions, rationale)
    assert set(evaluation.breakdown) == set(TASK.signals)
    assert all(0.0 <= v <= 1.0 for v in evaluation.breakdown.values())
    assert set(evaluation.feedback) <= {k for k, v in evaluation.breakdown.items() if v < 1.0}
    assert all(evaluation.feedback[k] for k, v in evaluation.breakdown.items() if v < 1.0)
    if evaluation.reward == 1.0:  # solved means: every action valid and no overlap left
        assert all(a["id"] in ("a1", "m2", "m1") for a in actions)
        assert not any(a["action"] == "cancel" for a in actions)
