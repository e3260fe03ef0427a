"""The schedule family's model: an agenda of timed items, the JSON plan that edits it.

A plan is parsed from the answer text into actions (move an item to a new start, or
cancel it) and applied in order; an invalid action is skipped and described, never
raised. The task itself (levels, generator, scoring) lives in `schedule.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

MAX_ANSWER_CHARS = 8000  # longer JSON is rejected before json.loads sees it
MAX_ACTIONS = 32
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_ACTION_KEYS = {"move": {"action", "id", "start"}, "cancel": {"action", "id"}}


# ---------------------------------------------------------------------------------------
# Agenda and plan


class Item(NamedTuple):
    """One agenda entry; times are minutes after midnight."""

    title: str
    start: int
    end: int
    fixed: bool


@dataclass(frozen=True)
class Agenda:
    """A day's span and its items by id."""

    day_start: int
    day_end: int
    items: dict[str, Item]


@dataclass(frozen=True)
class Action:
    """One parsed action: move `item_id` to `start` ("HH:MM" as written), or cancel it."""

    kind: str
    item_id: str
    start: str | None = None


@dataclass(frozen=True)
class Plan:
    """A parsed reply: actions in order and the rationale (None when absent)."""

    actions: tuple[Action, ...]
    rationale: str | None


@dataclass(frozen=True)
class Outcome:
    """The agenda after a plan, and what went wrong on the way."""

    agenda: Agenda
    problems: list[str]  # one sentence per skipped action
    cancelled: set[str]
    acted: list[str]  # ids of real items that the plan's actions name, first mention first


def minutes(clock: str) -> int | None:
    """Minutes after midnight of an "HH:MM" string, or None when it is not a valid time."""
    match = _CLOCK.fullmatch(clock.strip())
    if match is None or int(match[1]) > 23 or int(match[2]) > 59:
        return None
    return int(match[1]) * 60 + int(match[2])


def to_clock(value: int) -> str:
    """ "HH:MM" for minutes after midnight."""
    return f"{value // 60:02d}:{value % 60:02d}"


def describe(agenda: Agenda, item_id: str) -> str:
    """ "m2 (10:00-11:00)"."""
    item = agenda.items[item_id]
    return f"{item_id} ({to_clock(item.start)}-{to_clock(item.end)})"


def conflicts(agenda: Agenda) -> list[tuple[str, str]]:
    """Overlapping pairs (ids ordered by start time); touching end to start is no overlap."""
    ordered = sorted(agenda.items, key=lambda i: (agenda.items[i].start, i))
    return [
        (a, b)
        for n, a in enumerate(ordered)
        for b in ordered[n + 1 :]
        if agenda.items[a].start < agenda.items[b].end
        and agenda.items[b].start < agenda.items[a].end
    ]


def parse_plan(text: str) -> Plan | str:
    """The plan in a JSON answer, or one sentence saying why it does not fit the schema.

    >>> parse_plan('{"actions": [{"action": "cancel", "id": "m1"}]}').actions[0].item_id
    'm1'
    """
    text = text.strip()
    if len(text) > MAX_ANSWER_CHARS:
        return f"The answer is {len(text)} characters long; the limit is {MAX_ANSWER_CHARS}."
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        # ValueError covers JSONDecodeError and integers too long to convert.
        return f"The answer is not valid JSON ({str(error)[:80]})."
    if not isinstance(data, dict):
        return 'The answer must be a JSON object {"actions": [...], "rationale": "..."}.'
    unknown = sorted(str(k)[:20] for k in data if k not in ("actions", "rationale"))
    if unknown:
        return f'Unknown key(s) {unknown}; the object takes only "actions" and "rationale".'
    actions, rationale = data.get("actions"), data.get("rationale")
    if not isinstance(actions, list):
        return 'The object needs an "actions" list.'
    if len(actions) > MAX_ACTIONS:
        return f"The plan has {len(actions)} actions; the limit is {MAX_ACTIONS}."
    if rationale is not None and not isinstance(rationale, str):
        return 'The "rationale" must be a string.'
    parsed = []
    for number, action in enumerate(actions, start=1):
        # Type first: an "action" that is a list or object is unhashable, so the lookup
        # in _ACTION_KEYS would raise.
        kind = action.get("action") if isinstance(action, dict) else None
        if not isinstance(kind, str) or kind not in _ACTION_KEYS:
            return f'Action {number} must be an object whose "action" is "move" or "cancel".'

        extra = sorted(str(k)[:20] for k in set(action) - _ACTION_KEYS[kind])
        if extra:
            keys = ", ".join(f'"{k}"' for k in sorted(_ACTION_KEYS[kind]))
            return f"Action {number} has unknown key(s) {extra}; a {kind} takes only {keys}."
        if not isinstance(action.get("id"), str):
            return f'Action {number} needs an "id" string.'
        if kind == "move" and not isinstance(action.get("start"), str):
            return f'Action {number} (move) needs a "start" string "HH:MM".'
        parsed.append(Action(kind, action["id"], action.get("start")))
    return Plan(tuple(parsed), rationale)


def apply_plan(agenda: Agenda, plan: Plan) -> Outcome:
    """Apply the plan's actions in order, skipping (and describing) each invalid one."""
    items = dict(agenda.items)
    problems: list[str] = []
    cancelled: set[str] = set()
    acted: list[str] = []
    for action in plan.actions:
        shown = action.item_id[:20]
        if action.item_id not in agenda.items:
            problems.append(f"There is no item with id {shown!r}.")
            continue
        if action.item_id not in acted:
            acted.append(action.item_id)
        item = agenda.items[action.item_id]
        verb = "moved" if action.kind == "move" else "cancelled"
        if item.fixed:
            problems.append(f"{shown} is fixed and cannot be {verb}.")
        elif action.item_id in cancelled:
            problems.append(f"{shown} was already cancelled and cannot be {verb} again.")
        elif action.kind == "cancel":
            cancelled.add(action.item_id)
            del items[action.item_id]
        else:
            problem, start = _check_move(agenda, action)
            if problem:
                problems.append(problem)
            else:
                items[action.item_id] = item._replace(
                    start=start, end=start + item.end - item.start
                )
    return Outcome(Agenda(agenda.day_start, agenda.day_end, items), problems, cancelled, acted)


def _check_move(agenda: Agenda, action: Action) -> tuple[str | None, int]:
    item, start = agenda.items[action.item_id], minutes(action.start or "")
    if start is None:
        return f"{(action.start or '')[:20]!r} for {action.item_id} is not a time; use HH:MM.", 0
    end = start + item.end - item.start
    if start < agenda.day_start:
        return (
            f"Moving {action.item_id} to {to_clock(start)} starts before the day starts at "
            f"{to_clock(agenda.day_start)}.",
            0,
        )
    if end > agenda.day_end:
        return (
            f"Moving {action.item_id} to {to_clock(start)} ends at {to_clock(end % 1440)}, after "
            f"the day ends at {to_clock(agenda.day_end)}.",
            0,
        )
    return None, start


# ---------------------------------------------------------------------------------------
# Rows


def listed_items(agenda: Agenda) -> list[dict]:
    """The items as the prompt and `meta` show them, in order of start time."""
    return [
        {
            "id": i,
            "title": it.title,
            "start": to_clock(it.start),
            "end": to_clock(it.end),
            "fixed": it.fixed,
        }
        for i, it in sorted(agenda.items.items(), key=lambda kv: (kv[1].start, kv[0]))
    ]


def agenda_from_meta(meta: dict) -> Agenda:
    """The agenda a row's `meta` describes (the inverse of `listed_items`)."""
    items = {
        it["id"]: Item(it["title"], minutes(it["start"]), minutes(it["end"]), bool(it["fixed"]))
        for it in meta["items"]
    }
    return Agenda(minutes(meta["day"][0]), minutes(meta["day"][1]), items)
