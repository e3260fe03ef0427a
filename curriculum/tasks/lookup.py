"""Multi-hop questions answered by looking facts up, in the spirit of HotpotQA, offline.

Each row has its own small knowledge base of invented people, companies, cities and
countries (names built from syllables, drawn with the row's rng and kept in its `meta`),
and a question that follows a chain of relations from one of them:

    Ilsa Varn: works for Tarco Works; born in Pelmora; mentor is Odo Brell.
    Tarco Works: a company based in Dunholm; founded by Mira Stok.
    Q (level 2): In which city is the employer of Ilsa Varn based?   A: Dunholm

- The level is the number of hops. The chain's entities all differ, and none of them is
  named in the entry of an entity two or more hops before it, so no lookup can be skipped:
  a level-k question takes exactly k lookups, the last one naming the answer. Every
  relation gives one value and names are unique (none is part of another), so the answer
  is unique. The other entities are distractors; there are more at higher levels.
- Tools: `lookup(name)` returns an entity's entry (the name matched case-insensitively,
  spaces trimmed); an unknown name is a valid call that found nothing. `search(query)`
  lists up to 3 entries whose text contains the query. Each call uses one of the level's
  `hops + 2` lookups; once they are spent, calls are refused. A name or query that is not
  a string, and an empty or over-long query, raise: TRL shows the error, the call counts
  as invalid and uses no lookup.
- The closing reply is `<answer>NAME</answer>`, compared case-insensitively with the
  answer's name, spaces trimmed; a reply with more than the tag is still right but its
  format counts half.
- Held-out questions: a question names its start entity, and a row drawn with a seed from
  HELD_OUT_SEED_BASE starts only from names the held-out hash picks (1 in
  `held_out_mod`), a training row only from the others, so no held-out question is ever a
  training one.

Signals: `correctness` 1 when the answer is right; `milestones` the share of the chain's
entities (the answer aside) that were looked up, 1 when the answer is right; `format` the
reply's tag (1 for the tag alone, 0.5 with other text, 0 for none), averaged with the
share of valid calls when any call was made. The feedback is the paper's kind of summary:
what the reply did, lookups that found nothing or were refused, the last action, and how
far along the chain the lookups got, never the answer (unless `reveal_answer`).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from typing import Any

from curriculum.tasks.agent import AgentTask, Played, ToolCall
from curriculum.tasks.answer_tags import extract_answer
from curriculum.tasks.base import Evaluation, Row, TaskConfig

# level -> (people, companies, cities, countries) in its knowledge base.
KB_SIZES: dict[int, tuple[int, int, int, int]] = {
    1: (4, 2, 3, 2),
    2: (6, 3, 4, 2),
    3: (8, 4, 5, 3),
    4: (10, 5, 6, 3),
}

SPARE_LOOKUPS = 2
"""Lookups beyond the hops a question needs: room for a search or a mistake."""

MAX_QUERY = 60
"""The longest search query; a longer one raises."""

MAX_SEARCH_RESULTS = 3

# kind -> its relations, in the order its entry states them; each names one entity.
RELATIONS: dict[str, tuple[str, ...]] = {
    "person": ("works_for", "born_in", "mentor"),
    "company": ("based_in", "founder"),
    "city": ("in_country", "mayor"),
    "country": ("capital",),
}

# relation -> the noun phrase of its value, nested inside a longer question.
NOUN_PHRASES: dict[str, str] = {
    "works_for": "the employer of {}",
    "born_in": "the birthplace of {}",
    "mentor": "the mentor of {}",
    "based_in": "the home city of {}",
    "founder": "the founder of {}",
    "in_country": "the country of {}",
    "mayor": "the mayor of {}",
    "capital": "the capital of {}",
}

# relation -> the question that asks for its value: the last hop of the chain.
QUESTIONS: dict[str, str] = {
    "works_for": "Which company does {} work for?",
    "born_in": "In which city was {} born?",
    "mentor": "Who is the mentor of {}?",
    "based_in": "In which city is {} based?",
    "founder": "Who founded {}?",
    "in_country": "In which country is {}?",
    "mayor": "Who is the mayor of {}?",
    "capital": "What is the capital of {}?",
}

# Syllables of the invented names.
_ONSETS = ("", "b", "br", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "", "", "", "n", "r", "l", "s", "m", "k")
_COMPANY_WORDS = ("Works", "Holdings", "Labs", "Foundry", "Mills", "Trading", "Systems")
_CITY_ENDINGS = ("mora", "holm", "ford", "dale", "ria", "vik", "stad")

# The fixed words of the entries and questions, which no name may be part of.
_FIXED_WORDS = "; ".join(
    [
        "works for; born in; mentor is; a company based in; founded by; a city in; mayor is",
        "a country; capital is; no entry named; no lookups left; reply with",
        *NOUN_PHRASES.values(),
        *QUESTIONS.values(),
    ]
).lower()

SYSTEM_PROMPT = (
    "Answer a question about a small world of invented people, companies, cities and "
    "countries. You know nothing about them: find the facts with the tools. lookup(name) "
    "returns the entry of the person, company, city or country with that name: one line of "
    "its facts. search(query) lists up to 3 entries whose text contains the query. Each "
    "call uses one of your lookups. Start from the name in the question, follow the facts "
    "one entry per turn, then reply with only <answer>NAME</answer>, the answer's full name."
)


@dataclass
class LookupConfig(TaskConfig):
    held_out_mod: int = 5
    """1 in `held_out_mod` names can start a held-out question (seed >= HELD_OUT_SEED_BASE);
    only the others start a training question."""

    def validate(self) -> None:
        mod = self.held_out_mod
        if isinstance(mod, bool) or not isinstance(mod, int) or mod < 2:
            raise ValueError(f"held_out_mod must be an integer >= 2, got {mod!r}")


def turn_limit(level: int) -> int:
    """The lookups (tool calls) a level-`level` question allows: its hops and the spare."""
    return level + SPARE_LOOKUPS


def entry_text(name: str, facts: dict[str, str]) -> str:
    """The entry `lookup` returns: the entity's facts in one line."""
    kind = facts["kind"]
    if kind == "person":
        return (
            f"{name}: works for {facts['works_for']}; born in {facts['born_in']}; "
            f"mentor is {facts['mentor']}."
        )
    if kind == "company":
        return f"{name}: a company based in {facts['based_in']}; founded by {facts['founder']}."
    if kind == "city":
        return f"{name}: a city in {facts['in_country']}; mayor is {facts['mayor']}."
    return f"{name}: a country; capital is {facts['capital']}."


def question_text(start: str, relations: list[str]) -> str:
    """The question that follows `relations` from `start`, innermost hop first."""
    subject = start
    for relation in relations[:-1]:
        subject = NOUN_PHRASES[relation].format(subject)
    return QUESTIONS[relations[-1]].format(subject)


def normalize(name: str) -> str:
    """A name as names are compared: lowercase, runs of spaces made one, trimmed."""
    return " ".join(name.split()).lower()


def quote(text: str, limit: int = 40) -> str:
    """Model text as feedback and tool replies show it: quoted, escaped to ASCII (odd text,
    lone surrogates and NULs never come back raw) and cut to about `limit` characters.

    >>> quote("Ilsa Varn"), quote("x" * 50, 4)
    ("'Ilsa Varn'", "'xxxx...'")
    """
    return f"'{escape(text, limit)}'"


def escape(text: str, limit: int) -> str:
    """`text` escaped to ASCII as `ascii` does, without the quotes, cut to `limit`
    characters (and '...' when cut)."""
    escaped = ascii(text[:limit])[1:-1]
    cut = len(text) > limit or len(escaped) > limit
    return escaped[:limit] + ("..." if cut else "")


def held_out_name(name: str, mod: int) -> bool:
    """Whether `name` starts held-out questions (a stable hash, the same in every process)."""
    return zlib.crc32(name.encode()) % mod == 0


class LookupEnv:
    """One question's lookups for TRL's `environment_factory`; the tools are `lookup` and
    `search`."""

    def __init__(self) -> None:
        self._reset_state({}, 0)

    def _reset_state(self, kb: dict[str, dict[str, str]], lookups: int) -> None:
        self.entries = {normalize(name): (name, entry_text(name, kb[name])) for name in sorted(kb)}
        """normalized name -> (name, entry text)."""
        self.lookups_left = lookups
        self.calls = 0
        """Calls that used a lookup (refused and invalid ones aside)."""
        self.found: list[str] = []
        """The names of the entries `lookup` returned, in order."""
        self.not_found = 0
        self.refused = 0
        self.last_action: str | None = None

    def reset(self, meta: str, level: int, **row: Any) -> None:
        self._reset_state(json.loads(meta)["kb"], turn_limit(level))

    def lookup(self, name: str) -> str:
        """Read the entry of one person, company, city or country.

        Args:
            name: The entity's full name, e.g. "Ilsa Varn".
        """
        if not isinstance(name, str):
            raise ValueError(f"name must be a string, got {type(name).__name__}")
        if not self._take_turn():
            return _NO_LOOKUPS_LEFT
        shown = quote(" ".join(name[:200].split()))
        self.last_action = f"lookup {shown}"
        hit = self.entries.get(normalize(name)) if len(name) <= 1000 else None
        if hit is None:
            self.not_found += 1
            return f"No entry named {shown}.{self._left()}"
        self.found.append(hit[0])
        return hit[1] + self._left()

    def search(self, query: str) -> str:
        """List up to 3 entries whose text contains the query, those it names first.

        Args:
            query: A name or a part of one, at most 60 characters.
        """
        if not isinstance(query, str):
            raise ValueError(f"query must be a string, got {type(query).__name__}")
        if len(query) > MAX_QUERY:
            raise ValueError(f"query must be at most {MAX_QUERY} characters, got {len(query)}")
        wanted = normalize(query)
        if not wanted:
            raise ValueError("query must not be empty")
        if not self._take_turn():
            return _NO_LOOKUPS_LEFT
        self.last_action = f"search {quote(wanted)}"
        # Entries named by the query first, then those that mention it.
        names = sorted(
            (wanted not in name.lower(), name)
            for name, text in self.entries.values()
            if wanted in text.lower()
        )
        if not names:
            return f"No entry contains {quote(wanted)}.{self._left()}"
        listed = "; ".join(name for _, name in names[:MAX_SEARCH_RESULTS])
        return f"Entries containing {quote(wanted)}: {listed}.{self._left()}"

    def _take_turn(self) -> bool:
        """Use one lookup; False (and the call counted refused) when none is left."""
        if self.lookups_left <= 0:
            self.refused += 1
            return False
        self.lookups_left -= 1
        self.calls += 1
        return True

    def _left(self) -> str:
        return f"\nLookups left: {self.lookups_left}."


_NO_LOOKUPS_LEFT = "No lookups left; reply with <answer>...</answer>."


class LookupTask(AgentTask):
    """Multi-hop questions over a row's own knowledge base, answered with `lookup` calls."""

    name = "lookup"
    config_class = LookupConfig
    signals = ("format", "correctness", "milestones")
    environment_class = LookupEnv

    @property
    def num_levels(self) -> int:
        return len(KB_SIZES)

    def turn_limit(self, level: int) -> int:
        return turn_limit(level)

    # Drawing rows -----------------------------------------------------------------------

    def generate(self, level: int, n: int, seed: int = 0) -> list[Row]:
        """`n` rows at `level`; row i uses Random(seed + i) and starts its question from a
        held-out name when seed + i >= HELD_OUT_SEED_BASE, else from a training one."""
        self.check_level(level)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [
            self._draw(level, random.Random(seed + i), self.held_out_seed(seed + i))
            for i in range(n)
        ]

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        return self._draw(level, rng, held_out=False)

    def _draw(self, level: int, rng: random.Random, held_out: bool) -> Row:
        while True:  # a knowledge base with no fitting chain is redrawn (rarely needed)
            kb = draw_kb(KB_SIZES[level], rng)
            starts = [
                name
                for name in sorted(kb)
                if held_out_name(name, self.config.held_out_mod) == held_out
            ]
            chains = [chain for start in starts for chain in _chains(kb, [start], [], level)]
            if chains:
                break
        # A relation sequence first, then a chain of it: people's many relations would
        # otherwise crowd out companies' and countries'.
        by_relations: dict[tuple[str, ...], list[list[str]]] = {}
        for entities, relations in chains:
            by_relations.setdefault(tuple(relations), []).append(entities)
        relations = list(rng.choice(sorted(by_relations)))
        entities = rng.choice(by_relations[tuple(relations)])
        user = (
            f"{question_text(entities[0], relations)} You may look up {turn_limit(level)} entries."
        )
        return self.make_row(
            level,
            SYSTEM_PROMPT,
            user,
            entities[-1],
            kb=kb,
            chain=entities,
            relations=relations,
            split="held_out" if held_out else "train",
        )

    # Playing and judging ----------------------------------------------------------------

    def solution(self, row: Row) -> tuple[list[ToolCall], str]:
        chain = self.meta(row)["chain"]
        return [
            ("lookup", {"name": name}) for name in chain[:-1]
        ], f"<answer>{row['answer']}</answer>"

    def judge(self, row: Row, environment: LookupEnv, played: Played) -> Evaluation:
        chain = self.meta(row)["chain"]
        steps = chain[:-1]  # the entries to look up; the last one names the answer
        tag = extract_answer(played.reply)
        correct = tag is not None and normalize(tag.text) == normalize(row["answer"])
        found = set(environment.found)
        looked_up = sum(name in found for name in steps)
        tag_score = 0.0 if tag is None else 1.0 if tag.bare else 0.5
        breakdown = {
            "format": (played.format_score() + tag_score) / 2 if played.calls else tag_score,
            "correctness": 1.0 if correct else 0.0,
            "milestones": 1.0 if correct else looked_up / len(steps),
        }
        feedback: dict[str, str] = {}
        problems = [_invalid_calls(played)]
        if tag is None:
            problems.append("No <answer>...</answer> tag in the final reply.")
        elif not tag.bare:
            problems.append(
                "Reply with only <answer>NAME</answer>, with no text before or after it."
            )
        problems = [problem for problem in problems if problem]
        if problems:
            feedback["format"] = " ".join(problems)
        if not correct:
            progress = _progress(steps, found)
            if looked_up < len(steps):
                feedback["milestones"] = progress
            summary = _summary(environment, tag, progress if looked_up == len(steps) else None)
            if self.config.reveal_answer:
                summary += f" The answer is {row['answer']!r}."
            feedback["correctness"] = summary
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _invalid_calls(played: Played) -> str | None:
    """One sentence about the invalid calls, None when there were none. Shorter than
    `Played.format_feedback`, so that the tag's sentence fits beside it."""
    invalid = played.invalid_calls
    if not invalid:
        return None
    first = invalid[0]
    return (
        f"{len(invalid)} of {len(played.calls)} tool calls were invalid; the first, "
        f"{quote(first.name, 30)}, got: {escape(first.reply, 100)}"
    )


def _summary(environment: LookupEnv, tag: Any, final: str | None) -> str:
    """The paper's end-of-episode line: the reply, the calls that found nothing or were
    refused, and the last action taken, or the `final` state when every entry on the way
    was looked up."""
    if tag is None:
        parts = ["No <answer>...</answer> tag in the final reply."]
    elif not tag.text:
        parts = ["The answer is empty."]
    else:
        parts = [f"The answer {quote(tag.text)} is wrong."]
    if not environment.calls and not environment.refused:
        parts.append("No lookup was made.")
    if environment.not_found:
        parts.append(f"{environment.not_found} lookup(s) found nothing.")
    if environment.refused:
        parts.append(f"{environment.refused} call(s) refused: no lookups left.")
    if final is not None:
        parts.append(final)
    elif environment.last_action is not None:
        parts.append(f"Last action taken: {environment.last_action}.")
    return " ".join(parts)


def _progress(steps: list[str], found: set[str]) -> str:
    """How far along the chain the lookups got, and where to go on (never the answer)."""
    looked_up = sum(name in found for name in steps)
    entries = f"{len(steps)} entries" if len(steps) > 1 else "1 entry"
    if looked_up == len(steps):
        return (
            f"All {entries} on the way were looked up; the answer is in the entry of {steps[-1]!r}."
        )
    missing = next(k for k, name in enumerate(steps) if name not in found)
    where = (
        f"start with the entry of {steps[0]!r}"
        if missing == 0
        else f"the next to look up follows from {steps[missing - 1]!r}"
    )
    return f"Looked up {looked_up} of the {entries} the question leads through; {where}."


# The knowledge base --------------------------------------------------------------------


def draw_kb(sizes: tuple[int, int, int, int], rng: random.Random) -> dict[str, dict[str, str]]:
    """A knowledge base of `sizes` (people, companies, cities, countries): name -> its kind
    and relations. Every relation names one entity; a country's capital lies in it."""
    names: list[str] = []
    people = [_fresh(names, rng, _person_name) for _ in range(sizes[0])]
    companies = [_fresh(names, rng, _company_name) for _ in range(sizes[1])]
    cities = [_fresh(names, rng, _city_name) for _ in range(sizes[2])]
    countries = [_fresh(names, rng, _country_name) for _ in range(sizes[3])]
    kb: dict[str, dict[str, str]] = {}
    # Every country gets a city; the rest go anywhere.
    order = rng.sample(cities, len(cities))
    country_of = {
        city: countries[k] if k < len(countries) else rng.choice(countries)
        for k, city in enumerate(order)
    }
    for country in countries:
        inside = [city for city in cities if country_of[city] == country]
        kb[country] = {"kind": "country", "capital": rng.choice(inside)}
    for city, mayor in zip(cities, rng.sample(people, len(cities))):
        kb[city] = {"kind": "city", "in_country": country_of[city], "mayor": mayor}
    for company, founder in zip(companies, rng.sample(people, len(companies))):
        kb[company] = {"kind": "company", "based_in": rng.choice(cities), "founder": founder}
    for person in people:
        kb[person] = {
            "kind": "person",
            "works_for": rng.choice(companies),
            "born_in": rng.choice(cities),
            "mentor": rng.choice([other for other in people if other != person]),
        }
    return kb


def _chains(
    kb: dict[str, dict[str, str]], entities: list[str], relations: list[str], hops: int
) -> list[tuple[list[str], list[str]]]:
    """Every chain of `hops` more relations that extends (entities, relations), in a fixed
    order: the entities all differ and none is named by an entity two or more hops back."""
    if len(relations) == hops:
        return [(entities, relations)]
    chains = []
    here = kb[entities[-1]]
    for relation in RELATIONS[here["kind"]]:
        target = here[relation]
        if target in entities or any(target in kb[e].values() for e in entities[:-1]):
            continue
        chains += _chains(kb, [*entities, target], [*relations, relation], hops)
    return chains


def _fresh(names: list[str], rng: random.Random, draw) -> str:
    """A new name from `draw`, added to `names`: no name is part of another (in any case)
    or of the fixed words of entries and questions, so a name in a text is that entity."""
    while True:
        name = draw(rng)
        low = name.lower()
        if low in _FIXED_WORDS or any(
            low in other.lower() or other.lower() in low for other in names
        ):
            continue
        names.append(name)
        return name


def _word(rng: random.Random, syllables: int) -> str:
    word = "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    )
    return word.capitalize()


def _person_name(rng: random.Random) -> str:
    first = _word(rng, 2)
    last = _word(rng, rng.choice((1, 2)))
    while len(last) < 3:
        last = _word(rng, 2)
    return f"{first} {last}"


def _company_name(rng: random.Random) -> str:
    return f"{_word(rng, 2)} {rng.choice(_COMPANY_WORDS)}"


def _city_name(rng: random.Random) -> str:
    return _word(rng, rng.choice((1, 2))) + rng.choice(_CITY_ENDINGS)


def _country_name(rng: random.Random) -> str:
    name = _word(rng, rng.choice((1, 2)))
    while len(name) < 4:
        name = _word(rng, 2)
    return name
