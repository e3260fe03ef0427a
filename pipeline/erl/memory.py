"""The cross-episode reflection memory: a FIFO of reflections whose retry succeeded."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from curriculum.atomic import atomic_write_json

MEMORY_FILE = "erl_memory.json"
# What `retrieve` (and ERLConfig.memory_scope) take: this prompt's own reflections, the most
# similar prompts', or the ERL paper's rulebook (the latest successful one, for every prompt).
MEMORY_SCOPES = ("similar", "same_prompt", "global")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class MemoryEntry:
    """One stored reflection and the prompt (as text) it was written for."""

    prompt: str
    reflection: str
    step: int
    order: int  # insertion counter: larger is more recent


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


class ReflectionMemory:
    """Up to `max_size` reflections, oldest dropped first; retrieval by lexical relevance.

    >>> memory = ReflectionMemory(max_size=2)
    >>> memory.add("3+4", "Add the digits.", step=1)
    >>> memory.retrieve("3+5", k=1)
    ['Add the digits.']
    """

    def __init__(self, max_size: int) -> None:
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        self.max_size = max_size
        self._entries: deque[MemoryEntry] = deque(maxlen=max_size)
        self._added = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def add(self, prompt: str, reflection: str, step: int) -> None:
        """Store a reflection; the oldest entry goes when the memory is full."""
        if self.max_size == 0:
            return
        self._entries.append(MemoryEntry(prompt, reflection, step, self._added))
        self._added += 1

    def retrieve(self, prompt: str, k: int, scope: str = "similar") -> list[str]:
        """The `k` reflections most relevant to `prompt` (Jaccard word overlap; recency breaks
        ties). `scope="same_prompt"`: only reflections written for this exact prompt, newest
        first (a lesson for another problem can mislead: measured: docs/log.md).
        `scope="global"`: the newest reflection alone, whatever its prompt: entries are
        added only when their retry succeeded, so this is the ERL paper's rulebook, the
        latest reflection that produced a successful retry, shown to every reflection.

        >>> memory = ReflectionMemory(max_size=2)
        >>> memory.add("3#4", "a#b = a+b+2", step=1)
        >>> memory.add("5#1", "a#b = a+b+3", step=2)
        >>> memory.retrieve("8#8", k=3, scope="global")
        ['a#b = a+b+3']
        """
        if scope not in MEMORY_SCOPES:
            raise ValueError(f"scope must be one of {list(MEMORY_SCOPES)}, got {scope!r}")
        if k <= 0 or not self._entries:
            return []
        if scope == "global":
            return [self._entries[-1].reflection]
        if scope == "same_prompt":
            own = [entry for entry in reversed(self._entries) if entry.prompt == prompt]
            return [entry.reflection for entry in own[:k]]
        query = _words(prompt)

        def relevance(entry: MemoryEntry) -> tuple[float, int]:
            words = _words(entry.prompt)
            union = len(query | words)
            return (len(query & words) / union if union else 0.0, entry.order)

        ranked = sorted(self._entries, key=relevance, reverse=True)
        return [entry.reflection for entry in ranked[:k]]

    # Persistence -------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "max_size": self.max_size,
            "added": self._added,
            "entries": [asdict(e) for e in self._entries],
        }

    def load_state_dict(self, state: dict) -> None:
        self._entries = deque((MemoryEntry(**e) for e in state["entries"]), maxlen=self.max_size)
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
