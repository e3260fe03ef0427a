"""The first attempts' rewards a trainer keeps for the curriculum's controller.

ERLTrainer, the run's GRPO trainer and its SDPO trainer each score first attempts in
training; the run reads them once per step (`pop_first_attempts`) to decide a promotion.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class FirstAttemptLog:
    """(weighted r1, dataset row) of each first attempt scored in training since the last
    `pop`. Bounded: a trainer used without a run, which never reads it, does not grow it."""

    def __init__(self, maxlen: int) -> None:
        self._log: deque[tuple[float, dict]] = deque(maxlen=maxlen)

    @property
    def maxlen(self) -> int:
        """The most entries kept (the oldest go first)."""
        return self._log.maxlen

    def extend(self, rewards: Iterable[float], rows: Iterable[dict]) -> None:
        self._log.extend(zip(rewards, rows, strict=True))

    def pop(self) -> list[tuple[float, dict]]:
        """Everything logged since the last call, oldest first."""
        log = list(self._log)
        self._log.clear()
        return log
