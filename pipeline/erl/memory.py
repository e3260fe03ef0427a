"""The cross-episode reflection memory: lessons whose retry succeeded, kept while retries
that read them keep succeeding.

What enters: a reflection whose retry reached the threshold (the ERL step decides that,
`pipeline.erl.step`), unless it is no lesson at all (`lesson_problem`: empty, an answer in
the answer format, a copy of the prompt, a term repeated; `lessons_only`). A reflection
that restates a stored lesson confirms it instead of entering twice.

What is shown (`shown`): the memory owns its scope and top-k (built from an `ERLConfig` by
`from_config`); the ERL step asks it and passes no copy of its own.

What stays (`confirmations`): every entry counts the retries that read it (its reflection
prompt showed it, or the retry read it directly) and how many of them succeeded, the retry
that admitted it counted as its first. Its standing is the Beta posterior mean of that
record, (successes + 1) / (reads + 2). A full memory evicts its weakest entry, the oldest
among equals. The global rulebook is a bandit over lessons: each reflection prompt is shown
the entry with the highest draw from Beta(successes + 1, failures + 1), so an entry keeps
its place while retries that read it succeed and loses it when they fail, and a new entry
is tried before it is trusted. Without confirmations the memory is the FIFO of the ERL
paper and of this project before: the rulebook is the newest entry.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from curriculum.atomic import atomic_write_json

MEMORY_FILE = "erl_memory.json"
# A memory's scope (ERLConfig.memory_scope): this prompt's own reflections, the most similar
# prompts', or the ERL paper's rulebook (the strongest lessons, for every prompt).
MEMORY_SCOPES = ("similar", "same_prompt", "global")
# Why `add` refuses a reflection (`lesson_problem`), and what else it can answer.
REJECTIONS = ("empty", "answer_format", "prompt_copy", "repetitive")
STORED, CONFIRMED, OFF = "stored", "confirmed", "off"

_WORD = re.compile(r"\w+")
_ANSWER_SPAN = re.compile(r"<answer>.*?(</answer>|$)", re.DOTALL | re.IGNORECASE)
_TAG = re.compile(r"</?\w+>")
# A reflection of at least this many whitespace-separated chunks is "repetitive" when one
# chunk shape (its punctuation blanked: 'a#b' and 'a~b' are both 'a_b') is this share of
# them: 'a#b = = = = = =', 'a~b a$b a#b a%b'.
_REPEAT_MIN_CHUNKS = 4
_REPEAT_SHARE = 0.6


def _normalised(text: str) -> str:
    return " ".join(text.lower().split())


def lesson_problem(reflection: str, prompt: str) -> str | None:
    """Why `reflection` (for a prompt whose text is `prompt`) is no lesson, or None.

    >>> [lesson_problem(r, "The operation # is hidden.\\n3#4") for r in
    ...  ["", "<answer>7</answer>", "3#4", "a#b = = = = = =", "a~b a$b a#b a%b", "a#b = a+b+2"]]
    ['empty', 'answer_format', 'prompt_copy', 'repetitive', 'repetitive', None]
    """
    text = reflection.strip()
    if not _WORD.search(_TAG.sub(" ", _ANSWER_SPAN.sub(" ", text))):
        # Nothing but an answer, or the bare tags: not what to do differently.
        return "answer_format" if _TAG.search(text) else "empty"
    if _normalised(text) in _normalised(prompt):
        return "prompt_copy"
    chunks = text.split()
    if len(chunks) >= _REPEAT_MIN_CHUNKS:
        shapes = Counter(re.sub(r"[^\w]", "_", chunk.lower()) for chunk in chunks)
        if shapes.most_common(1)[0][1] >= _REPEAT_SHARE * len(chunks):
            return "repetitive"
    return None


@dataclass
class MemoryEntry:
    """One stored lesson, the prompt (as text) it was written for, and its record."""

    prompt: str
    reflection: str
    step: int
    order: int  # insertion counter: larger is more recent; an entry's id
    reads: int = 1  # retries that read it, the admitting one included
    successes: int = 1  # of those, the ones that reached the threshold

    @property
    def standing(self) -> float:
        """(successes + 1) / (reads + 2): the posterior mean of a reading retry's success."""
        return (self.successes + 1) / (self.reads + 2)

    def draw(self, rng: random.Random) -> float:
        """A draw of a reading retry's success rate from its Beta posterior."""
        return rng.betavariate(self.successes + 1, self.reads - self.successes + 1)


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def _check_scope(scope: str) -> str:
    if scope not in MEMORY_SCOPES:
        raise ValueError(f"scope must be one of {list(MEMORY_SCOPES)}, got {scope!r}")
    return scope


PAPER_POLICY = {"lessons_only": False, "confirmations": False}
"""The ERL paper's memory policy (the defaults before issue 32): every reflection whose retry
succeeded enters, and the newest entry leads."""


class ReflectionMemory:
    """Up to `max_size` lessons; what a reflection prompt is shown (`shown`) by `scope` and
    `top_k`; the weakest goes when full. Its defaults are `ERLConfig`'s.

    `scope` (ERLConfig.memory_scope) is also what a restated lesson must share to confirm an
    entry: its prompt, but for the global rulebook, where the same rule from any prompt is
    one entry. `lessons_only` refuses what `lesson_problem` names; `confirmations` ranks and
    evicts entries by their record (above). Both are on by default since the learning bench
    measured them (its `erl_lessons` arm against `erl`, docs/results.md): no worse per step,
    and no degenerate entry where the plain memory kept dozens. Turn them off for the ERL
    paper's memory, which keeps every reflection whose retry succeeded.

    >>> memory = ReflectionMemory(max_size=2, scope="similar", top_k=1)
    >>> memory.add("3+4", "Add the digits.", step=1)
    'stored'
    >>> [entry.reflection for entry in memory.shown("3+5")]
    ['Add the digits.']
    """

    def __init__(
        self,
        max_size: int,
        *,
        scope: str = "same_prompt",
        top_k: int = 3,
        lessons_only: bool = True,
        confirmations: bool = True,
    ) -> None:
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        _check_scope(scope)
        self.max_size = max_size
        self.scope = scope
        self.top_k = top_k
        self.lessons_only = lessons_only
        self.confirmations = confirmations
        self._entries: list[MemoryEntry] = []
        self._added = 0
        self.outcomes: Counter[str] = Counter()  # add()'s answers since the last pop_outcomes

    @property
    def policy(self) -> dict[str, bool]:
        """What it admits and how it ranks: its options beyond the config's (PAPER_POLICY's
        keys), as `from_config(config, **policy)` takes them."""
        return {"lessons_only": self.lessons_only, "confirmations": self.confirmations}

    @classmethod
    def from_config(cls, config, **options) -> ReflectionMemory:
        """The memory an `ERLConfig` asks for (size 0 when its memory is off); `options`:
        what the config does not hold (`lessons_only`, `confirmations`)."""
        return cls(
            config.memory_size if config.enable_memory else 0,
            scope=config.memory_scope,
            top_k=config.memory_top_k,
            **options,
        )

    def disagreement(self, config) -> str | None:
        """Which of `config`'s memory options (size, scope, top-k) this memory does not
        share, as `name (config's value, memory's value)`; None when it shares them all."""
        wanted = ReflectionMemory.from_config(config)
        for name, ours, theirs in (
            ("memory_size", self.max_size, wanted.max_size),
            ("memory_scope", self.scope, wanted.scope),
            ("memory_top_k", self.top_k, wanted.top_k),
        ):
            if ours != theirs:
                return f"{name} ({theirs!r} in the config, {ours!r} in the memory)"
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    # Writing ------------------------------------------------------------------------

    def add(self, prompt: str, reflection: str, step: int) -> str:
        """Offer a reflection whose retry succeeded; returns what became of it: "stored",
        "confirmed" (it restates a stored lesson, which gains a success instead), the reason
        it was refused (REJECTIONS), or "off" for a memory of size 0."""
        if self.max_size == 0:
            return OFF
        outcome = lesson_problem(reflection, prompt) if self.lessons_only else None
        if outcome is None:
            same = self._same_lesson(prompt, reflection)
            if same is not None:
                same.reads += 1
                same.successes += 1
                outcome = CONFIRMED
            else:
                if len(self._entries) >= self.max_size:
                    self._entries.remove(min(self._entries, key=self._rank))
                self._entries.append(MemoryEntry(prompt, reflection, step, self._added))
                self._added += 1
                outcome = STORED
        self.outcomes[outcome] += 1
        return outcome

    def _same_lesson(self, prompt: str, reflection: str) -> MemoryEntry | None:
        """A stored entry with this lesson's text, written for this prompt (any prompt, for
        the global rulebook)."""
        text, anywhere = _normalised(reflection), self.scope == "global"
        return next(
            (
                e
                for e in self._entries
                if (anywhere or e.prompt == prompt) and _normalised(e.reflection) == text
            ),
            None,
        )

    def record(self, orders: list[int], success: bool) -> None:
        """A retry that read the entries `orders` (their ids; gone ones are skipped) ended
        with or without success: their records count it."""
        for entry in self._entries:
            if entry.order in orders:
                entry.reads += 1
                entry.successes += int(success)

    def pop_outcomes(self) -> dict[str, int]:
        """add()'s answers by kind since the last call (for the logs), then reset."""
        counts, self.outcomes = dict(self.outcomes), Counter()
        return counts

    # Reading ------------------------------------------------------------------------

    def _rank(self, entry: MemoryEntry) -> tuple[float, int]:
        """Stronger first when sorted in reverse: standing (with confirmations), then recency."""
        return (entry.standing if self.confirmations else 0.0, entry.order)

    def shown(self, prompt: str, rng: random.Random | None = None) -> list[MemoryEntry]:
        """The entries a reflection prompt for `prompt` is shown: the `top_k` its scope picks,
        most relevant first.

        "similar": by Jaccard word overlap of the prompts, then standing and recency.
        "same_prompt": only entries written for this exact prompt, strongest (then newest)
        first: a lesson for another problem can mislead (docs/log.md). "global": the ERL
        paper's rulebook, one entry whatever the prompt (`top_k` only says whether to show
        it): with confirmations and an `rng`, the entry with the highest Beta draw; else the
        strongest, the newest among equals.
        """
        if self.top_k <= 0 or not self._entries:
            return []
        if self.scope == "global":
            if self.confirmations and rng is not None:
                return [max(self._entries, key=lambda e: (e.draw(rng), e.order))]
            return [max(self._entries, key=self._rank)]
        if self.scope == "same_prompt":
            own = [entry for entry in self._entries if entry.prompt == prompt]
            return sorted(own, key=self._rank, reverse=True)[: self.top_k]
        query = _words(prompt)

        def relevance(entry: MemoryEntry) -> tuple[float, float, int]:
            words = _words(entry.prompt)
            union = len(query | words)
            return (len(query & words) / union if union else 0.0, *self._rank(entry))

        return sorted(self._entries, key=relevance, reverse=True)[: self.top_k]

    def rulebook(self) -> list[MemoryEntry]:
        """Every entry, strongest first: what the global rulebook stands on."""
        return sorted(self._entries, key=self._rank, reverse=True)

    def retrieve(self, prompt: str, rng: random.Random | None = None) -> list[str]:
        """The lessons of `shown(prompt, rng)`.

        >>> memory = ReflectionMemory(max_size=3, scope="global", confirmations=True)
        >>> memory.add("3#4", "a#b = a+b+2", step=1)
        'stored'
        >>> memory.add("5#1", "a#b = a+b+3", step=2)
        'stored'
        >>> memory.retrieve("8#8")  # nothing read back yet: the newest
        ['a#b = a+b+3']
        >>> memory.record([1], success=False)  # a retry that read it failed
        >>> memory.retrieve("8#8")
        ['a#b = a+b+2']
        """
        return [entry.reflection for entry in self.shown(prompt, rng)]

    # Persistence -------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "max_size": self.max_size,
            "added": self._added,
            "entries": [asdict(e) for e in self._entries],
        }

    def load_state_dict(self, state: dict) -> None:
        # Files written before entries kept a record load as entries read once.
        entries = [MemoryEntry(**e) for e in state["entries"]]
        self._entries = entries[max(0, len(entries) - self.max_size) :] if self.max_size else []
        self._added = int(state["added"])

    def save(self, folder: str | Path) -> Path:
        """Write the memory to `folder/erl_memory.json` atomically; returns the path."""
        path = Path(folder) / MEMORY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, self.state_dict())
        return path

    def load(self, folder: str | Path) -> bool:
        """Restore from `folder/erl_memory.json`; False when the folder holds no memory."""
        path = Path(folder) / MEMORY_FILE
        if not path.exists():
            return False
        self.load_state_dict(json.loads(path.read_text()))
        return True
