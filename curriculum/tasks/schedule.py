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
The agenda and plan model (parsing and applying plans) lives in `schedule_agenda.py`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from curriculum.tasks.answer_tags import (
    extract_answer,
    failed_evaluation,
    no_tag,
    only_tag_feedback,
)
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig
from curriculum.tasks.schedule_agenda import (
    Agenda,
    Item,
    Plan,
    agenda_from_meta,
    apply_plan,
    conflicts,
    describe,
    listed_items,
    minutes,
    parse_plan,
    to_clock,
)


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
        listing = "\n".join(json.dumps(item) for item in listed_items(agenda))
        shown = "; ".join(f"{a} overlaps {b}" for a, b in pairs) if spec.show_conflicts else None
        user = (
            f"Day: {to_clock(agenda.day_start)}-{to_clock(agenda.day_end)}\nItems:\n{listing}\n"
            + (f"Conflicts: {shown}." if shown else "Some items overlap; find and fix them.")
        )
        moves = [{"action": "move", "id": i, "start": to_clock(s)} for i, s in solution]
        said = ", ".join(f"{i} to {to_clock(s)}" for i, s in solution)
        answer = json.dumps({"actions": moves, "rationale": f"Move {said} so nothing overlaps."})
        meta = {
            "items": listed_items(agenda),
            "day": [to_clock(agenda.day_start), to_clock(agenda.day_end)],
            "conflicts": [list(p) for p in pairs],
        }
        return self.make_row(level, SYSTEM_PROMPT, user, answer, **meta)

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    # Verification -----------------------------------------------------------------

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        agenda = agenda_from_meta(self.meta(row))
        answer = extract_answer(completion)
        if answer is None:
            return failed_evaluation(self.signals, no_tag('{"actions": [...]}'))
        plan = parse_plan(answer.text)
        if isinstance(plan, str):
            return Evaluation(0.0, dict.fromkeys(self.signals, 0.0), {
                "format": plan,
                "plausibility": "The plan could not be read, so none of its actions were applied.",
                "milestones": "No conflict was resolved because the plan could not be read.",
                "correctness": "The agenda still has its conflicts; send a valid JSON plan.",
                "reasoning": 'Give a short "rationale" naming the items you act on.',
            })  # fmt: skip
        return self._score_plan(row, agenda, plan, answer.strict)

    def _score_plan(self, row: Row, agenda: Agenda, plan: Plan, strict: bool) -> Evaluation:
        outcome = apply_plan(agenda, plan)
        before = set(conflicts(agenda))
        after = set(conflicts(outcome.agenda))
        remaining, created = sorted(before & after), sorted(after - before)
        feedback: dict[str, str] = {}
        if not strict:
            feedback["format"] = only_tag_feedback('{"actions": [...], "rationale": "..."}')
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
