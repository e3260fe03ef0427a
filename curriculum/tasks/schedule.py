"""Schedule: resolve overlapping items in a day's agenda by moving (or cancelling) them.

The prompt lists items (meetings `m…`, appointments `a…`, flights `f…`) with ids, start
and end times and a `fixed` flag; some pairs overlap. The reply is a JSON object inside an
answer tag (optionally after one `<think>...</think>` block); a bare JSON object without
the tag counts as unparseable:

    <answer>{"actions": [{"action": "move", "id": "m2", "start": "14:00"},
                         {"action": "cancel", "id": "a1"}],
             "rationale": "Move m2 after the flight f1; cancel a1."}</answer>

A move keeps the item's duration. Fixed items may be neither moved nor cancelled, and
every item must stay inside the day. Actions apply in order; an invalid one is skipped.
The generator builds a conflict-free day first and then displaces some movable items, so
moving them back always solves it (the reference) and no cancellation is ever needed:
a conflict-free plan that cancels anything earns only `cancel_credit` correctness.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import NamedTuple

from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig

# The answer-tag splitter is shared with countdown (linear time on megabyte completions).
from curriculum.tasks.countdown import split_answer


@dataclass(frozen=True)
class ScheduleLevel:
    """How many items, displaced items and fixed items a level has, and the day's span."""

    items: int
    displaced: int  # movable items pushed into another item's slot
    fixed: int  # items that cannot move (flights always count among them)
    day: tuple[str, str]
    show_conflicts: bool  # whether the prompt lists the conflicting pairs


LEVELS: dict[int, ScheduleLevel] = {
    1: ScheduleLevel(3, 1, 0, ("09:00", "17:00"), True),
    2: ScheduleLevel(4, 1, 1, ("09:00", "17:00"), True),
    3: ScheduleLevel(5, 2, 1, ("08:00", "18:00"), True),
    4: ScheduleLevel(6, 2, 2, ("08:00", "18:00"), False),
    5: ScheduleLevel(7, 3, 2, ("08:00", "19:00"), False),
    6: ScheduleLevel(8, 4, 3, ("08:00", "20:00"), False),
}

# kind -> (id prefix, durations in minutes, titles)
KINDS: dict[str, tuple[str, tuple[int, ...], tuple[str, ...]]] = {
    "meeting": ("m", (30, 60, 90), ("Team sync", "Design review", "1:1", "Budget call")),
    "appointment": ("a", (30, 60), ("Dentist", "Haircut", "Bank", "Doctor")),
    "flight": ("f", (90, 120), ("Flight to Berlin", "Flight to Lyon", "Flight to Oslo")),
}
SLOT = 30  # minutes; every generated time is on this grid

SYSTEM_PROMPT = (
    'Fix the agenda so that no two items overlap. Items with "fixed": true cannot be '
    "moved or cancelled. A move keeps the item's duration, and every item must stay "
    'inside the day. Reply only with <answer>{"actions": [...], "rationale": "..."}'
    '</answer>, where each action is {"action": "move", "id": ID, "start": "HH:MM"} '
    'or {"action": "cancel", "id": ID} and the rationale is one short sentence naming '
    "the items you act on. Every agenda can be fixed by moves alone; a plan that cancels "
    "items counts as only a partial solution."
)


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
        if not isinstance(action, dict) or action.get("action") not in _ACTION_KEYS:
            return f'Action {number} must be an object whose "action" is "move" or "cancel".'
        kind = action["action"]
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
# Task


@dataclass
class ScheduleConfig(TaskConfig):
    cancel_credit: float = 0.5
    """Correctness of a conflict-free plan that cancels items (a move-only plan always exists)."""
    max_rationale_chars: int = 600
    """A longer rationale earns only part of the reasoning credit."""

    def validate(self) -> None:
        if not isinstance(self.reveal_answer, bool):
            raise ValueError(f"reveal_answer must be True or False, got {self.reveal_answer!r}")
        credit = self.cancel_credit
        if isinstance(credit, bool) or not isinstance(credit, int | float) or not 0 <= credit <= 1:
            raise ValueError(f"cancel_credit must be a number in [0, 1], got {credit!r}")
        limit = self.max_rationale_chars
        if not isinstance(limit, int) or isinstance(limit, bool) or not 50 <= limit <= 5000:
            raise ValueError(f"max_rationale_chars must be an int in 50..5000, got {limit!r}")


class ScheduleTask(Task):
    """Resolve agenda conflicts; the reply is `<answer>{"actions": [...], ...}</answer>`."""

    name = "schedule"
    config_class = ScheduleConfig
    signals = ("format", "plausibility", "milestones", "correctness", "reasoning")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    # Generation -------------------------------------------------------------------

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        spec = LEVELS[level]
        agenda, solution = _draw_agenda(spec, rng)
        pairs = conflicts(agenda)
        listing = "\n".join(json.dumps(item) for item in _listing(agenda))
        shown = "; ".join(f"{a} overlaps {b}" for a, b in pairs) if spec.show_conflicts else None
        user = (
            f"Day: {to_clock(agenda.day_start)}-{to_clock(agenda.day_end)}\nItems:\n{listing}\n"
            + (f"Conflicts: {shown}." if shown else "Some items overlap; find and fix them.")
        )
        moves = [{"action": "move", "id": i, "start": to_clock(s)} for i, s in solution]
        said = ", ".join(f"{i} to {to_clock(s)}" for i, s in solution)
        answer = json.dumps({"actions": moves, "rationale": f"Move {said} so nothing overlaps."})
        meta = {
            "items": _listing(agenda),
            "day": [to_clock(agenda.day_start), to_clock(agenda.day_end)],
            "conflicts": [list(p) for p in pairs],
        }
        return self.make_row(level, SYSTEM_PROMPT, user, answer, **meta)

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    # Verification -----------------------------------------------------------------

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        agenda = _agenda_from_meta(self.meta(row))
        zeros = dict.fromkeys(self.signals, 0.0)
        content, strict = split_answer(completion) if isinstance(completion, str) else (None, False)
        if content is None:
            message = (
                'No <answer>...</answer> tag found; reply <answer>{"actions": [...]}</answer>.'
            )
            return Evaluation(0.0, zeros, dict.fromkeys(self.signals, message), error=message)
        plan = parse_plan(content)
        if isinstance(plan, str):
            return Evaluation(0.0, zeros, {
                "format": plan,
                "plausibility": "The plan could not be read, so none of its actions were applied.",
                "milestones": "No conflict was resolved because the plan could not be read.",
                "correctness": "The agenda still has its conflicts; send a valid JSON plan.",
                "reasoning": 'Give a short "rationale" naming the items you act on.',
            })  # fmt: skip
        return self._score_plan(row, agenda, plan, strict)

    def _score_plan(self, row: Row, agenda: Agenda, plan: Plan, strict: bool) -> Evaluation:
        outcome = apply_plan(agenda, plan)
        before = set(conflicts(agenda))
        after = set(conflicts(outcome.agenda))
        remaining, created = sorted(before & after), sorted(after - before)
        feedback: dict[str, str] = {}
        if not strict:
            feedback["format"] = (
                'Reply with only <answer>{"actions": [...], "rationale": "..."}</answer> '
                "(a <think>...</think> block before it is allowed) and no other text."
            )
        n_actions = len(plan.actions)
        plausibility = 1.0 - len(outcome.problems) / n_actions if n_actions else 1.0
        if outcome.problems:
            more = len(outcome.problems) - 1
            feedback["plausibility"] = outcome.problems[0] + (
                f" ({more} more invalid action{'s' * (more > 1)}.)" if more else ""
            )
        # Credit for each original conflict resolved, divided down by each new one created.
        resolved = (len(before) - len(remaining)) / len(before) if before else 1.0
        milestones = resolved / (1 + len(created))
        pair = remaining[0] if remaining else created[0] if created else None
        if pair is not None:
            a, b = (describe(outcome.agenda, i) for i in pair)
            feedback["milestones"] = (
                f"{a} still overlaps {b}."
                if remaining
                else f"{a} now overlaps {b}, a new conflict."
            )
        correctness = 0.0
        if after:
            count = f"{len(after)} conflicts remain" if len(after) > 1 else "1 conflict remains"
            feedback["correctness"] = f"{count}, so the day is not fixed yet."
        elif outcome.problems:
            feedback["correctness"] = "The plan has invalid actions, so it does not count."
        elif not strict:
            feedback["correctness"] = "The plan works, but the reply is not in the required form."
        elif outcome.cancelled and self.config.cancel_credit < 1:
            correctness = float(self.config.cancel_credit)
            feedback["correctness"] = (
                f"Cancelling {', '.join(sorted(outcome.cancelled))} was not needed: "
                "every conflict here can be resolved by moving items."
            )
        else:
            correctness = 1.0
        if correctness < 1.0 and self.config.reveal_answer:
            feedback["correctness"] += f" A working plan: {row['answer']}"
        reasoning, why = self._reasoning(plan, outcome.acted)
        if why:
            feedback["reasoning"] = why
        breakdown = {
            "format": 1.0 if strict else 0.5,
            "plausibility": plausibility,
            "milestones": milestones,
            "correctness": correctness,
            "reasoning": reasoning,
        }
        return Evaluation(correctness, breakdown, feedback)

    def _reasoning(self, plan: Plan, acted: list[str]) -> tuple[float, str | None]:
        """Half for a short rationale, half for naming every item the plan acts on."""
        text = (plan.rationale or "").strip()
        if not text:
            return 0.0, 'Add a short "rationale" that names the items you act on.'
        limit = self.config.max_rationale_chars
        present = 0.5 if len(text) <= limit else 0.25
        named = [i for i in acted if re.search(rf"\b{re.escape(i)}\b", text[: 4 * limit])]
        missing = [i for i in acted if i not in named]
        score = present + (0.5 * len(named) / len(acted) if acted else 0.5)
        if missing:
            return (
                score,
                f"The rationale does not mention {', '.join(missing)}, which the plan acts on.",
            )
        if present < 0.5:
            return score, f"The rationale is {len(text)} characters; keep it under {limit}."
        return score, None


def _draw_agenda(spec: ScheduleLevel, rng: random.Random) -> tuple[Agenda, list[tuple[str, int]]]:
    """A conflict-free day, then displaced; returns the agenda and the moves that undo it."""
    day_start, day_end = minutes(spec.day[0]), minutes(spec.day[1])
    n_flights = rng.randint(0, min(1, spec.fixed))
    kinds = ["flight"] * n_flights + [
        rng.choice(("meeting", "appointment")) for _ in range(spec.items - n_flights)
    ]
    durations = [rng.choice(KINDS[k][1]) for k in kinds]
    # Keep a quarter of the day free so that displaced items have somewhere to go back.
    while sum(durations) > 0.75 * (day_end - day_start):
        longest = durations.index(max(durations))
        durations[longest] -= SLOT
    order = list(range(spec.items))
    rng.shuffle(order)
    gaps = [0] * (spec.items + 1)
    for _ in range((day_end - day_start - sum(durations)) // SLOT):
        gaps[rng.randrange(len(gaps))] += SLOT
    starts, clock = [0] * spec.items, day_start
    for position, index in enumerate(order):
        clock += gaps[position]
        starts[index] = clock
        clock += durations[index]

    others = [k for k in range(spec.items) if kinds[k] != "flight"]
    fixed = {k for k in range(spec.items) if kinds[k] == "flight"}
    fixed |= set(rng.sample(others, spec.fixed - n_flights))
    displaced = rng.sample([k for k in range(spec.items) if k not in fixed], spec.displaced)
    targets = [k for k in range(spec.items) if k not in displaced]

    shown = list(starts)
    for k in displaced:
        t = rng.choice(targets)
        # Any start that makes k overlap t and keeps k inside the day. Never empty: both
        # durations are at least one SLOT and t lies inside the day.
        low = max(day_start, starts[t] - durations[k] + SLOT)
        high = min(day_end - durations[k], starts[t] + durations[t] - SLOT)
        shown[k] = rng.choice(range(low, high + 1, SLOT))
    # Ids numbered per kind in the order shown, so m1 comes before m2 and the numbering
    # does not give away which items were displaced.
    counters: dict[str, int] = {}
    ids = [""] * spec.items
    for index in sorted(range(spec.items), key=lambda k: shown[k]):
        prefix = KINDS[kinds[index]][0]
        counters[prefix] = counters.get(prefix, 0) + 1
        ids[index] = f"{prefix}{counters[prefix]}"
    items = {
        ids[k]: Item(rng.choice(KINDS[kinds[k]][2]), shown[k], shown[k] + durations[k], k in fixed)
        for k in range(spec.items)
    }
    agenda = Agenda(day_start, day_end, items)
    solution = sorted((ids[k], starts[k]) for k in displaced)
    return agenda, solution


def _listing(agenda: Agenda) -> list[dict]:
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


def _agenda_from_meta(meta: dict) -> Agenda:
    items = {
        it["id"]: Item(it["title"], minutes(it["start"]), minutes(it["end"]), bool(it["fixed"]))
        for it in meta["items"]
    }
    return Agenda(minutes(meta["day"][0]), minutes(meta["day"][1]), items)
