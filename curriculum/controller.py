"""The curriculum controller: when a stage stops and which level the next stage trains.

The pipeline feeds the first-attempt rewards r1 of every training step to
`CurriculumController.record_step`. A stage stops once the rolling mean of the stage's
last `promote_window` rewards reaches `promote_threshold` (after `min_stage_steps`), or
after `max_stage_steps`. `end_stage` then asks `decide`, a pure function of the per-stage
history, whether the run advances, repeats the level, demotes or stops, so that a resumed
or replayed run takes exactly the same path.

Plateau policies (a stage that ends without promotion):
- "repeat": train the same level again, up to `max_repeats` retries, then STOP the run.
  We stop rather than advance because a level the model failed `max_repeats + 1` times
  is out of its reach, and a harder one starts at zero reward and teaches nothing; who
  wants to push on anyway picks "advance".
- "advance": move to the next level at once.
- "stop": end the run at once.
With `demote_threshold` set, a stage that ends below it goes back one level instead
(never below `start_level`). Demotions spend the same `max_repeats` retries of the level,
which bounds every run: a level can only be failed `max_repeats + 1` times.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

PlateauPolicy = Literal["repeat", "advance", "stop"]
Action = Literal["advance", "repeat", "demote", "stop"]
PLATEAU_POLICIES: tuple[str, ...] = ("repeat", "advance", "stop")
STATE_VERSION = 1


def _invalid(name: str, value: Any, valid: str) -> ValueError:
    return ValueError(f"curriculum config {name}={value!r} is invalid; valid: {valid}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class CurriculumConfig:
    """How stages promote, plateau and demote; fields sit beside GRPOConfig's on the CLI."""

    start_level: int = field(default=1, metadata={"help": "Difficulty level of the first stage."})
    max_level: int | None = field(
        default=None, metadata={"help": "Highest level to train (default: the task's last level)."}
    )
    num_stages: int | None = field(
        default=None,
        metadata={"help": "Most stages to train, repeats included (default: until the run ends)."},
    )
    promote_threshold: float = field(
        default=0.6,
        metadata={"help": "Promote once the rolling mean first-attempt reward is >= this."},
    )
    promote_window: int = field(
        default=32,
        metadata={
            "help": "Rolling mean over this many last first-attempt rewards of the stage; "
            "no promotion until the window is full."
        },
    )
    min_stage_steps: int = field(
        default=20, metadata={"help": "Training steps a stage runs before it may promote."}
    )
    max_stage_steps: int = field(
        default=200, metadata={"help": "Training steps after which a stage ends anyway."}
    )
    plateau_policy: PlateauPolicy = field(
        default="repeat",
        metadata={
            "help": "When a stage ends without promotion: 'repeat' the level (then stop "
            "after max_repeats retries), 'advance' anyway, or 'stop' the run."
        },
    )
    max_repeats: int = field(
        default=2,
        metadata={
            "help": "Retries of a failed level (repeats and demotions) before it counts "
            "as exhausted."
        },
    )
    demote_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Go back one level when a stage ends below this rolling mean "
            "(default: never demote)."
        },
    )
    replay_fraction: float = field(
        default=0.0,
        metadata={
            "help": "Share of a stage's prompts drawn from easier levels (0.3 prevents "
            "forgetting them)."
        },
    )

    def validate(self) -> None:
        """Raise ValueError naming the first bad field, its value and what is valid."""
        if not _is_int(self.start_level) or self.start_level < 1:
            raise _invalid("start_level", self.start_level, "an integer >= 1")
        if self.max_level is not None and (
            not _is_int(self.max_level) or self.max_level < self.start_level
        ):
            raise _invalid(
                "max_level",
                self.max_level,
                f"None or an integer >= start_level ({self.start_level})",
            )
        if self.num_stages is not None and (not _is_int(self.num_stages) or self.num_stages < 1):
            raise _invalid("num_stages", self.num_stages, "None or an integer >= 1")
        if not _is_number(self.promote_threshold):
            raise _invalid("promote_threshold", self.promote_threshold, "a finite number")
        if not _is_int(self.promote_window) or self.promote_window < 1:
            raise _invalid("promote_window", self.promote_window, "an integer >= 1")
        if not _is_int(self.min_stage_steps) or self.min_stage_steps < 0:
            raise _invalid("min_stage_steps", self.min_stage_steps, "an integer >= 0")
        if not _is_int(self.max_stage_steps) or self.max_stage_steps < max(1, self.min_stage_steps):
            raise _invalid(
                "max_stage_steps",
                self.max_stage_steps,
                f"an integer >= 1 and >= min_stage_steps ({self.min_stage_steps})",
            )
        if self.plateau_policy not in PLATEAU_POLICIES:
            raise _invalid(
                "plateau_policy", self.plateau_policy, f"one of {list(PLATEAU_POLICIES)}"
            )
        if not _is_int(self.max_repeats) or self.max_repeats < 0:
            raise _invalid("max_repeats", self.max_repeats, "an integer >= 0")
        if self.demote_threshold is not None and (
            not _is_number(self.demote_threshold) or self.demote_threshold >= self.promote_threshold
        ):
            raise _invalid(
                "demote_threshold",
                self.demote_threshold,
                f"None or a number < promote_threshold ({self.promote_threshold})",
            )
        if not _is_number(self.replay_fraction) or not 0.0 <= self.replay_fraction < 1.0:
            raise _invalid("replay_fraction", self.replay_fraction, "a number in [0, 1)")


@dataclass(frozen=True)
class StageRecord:
    """What one finished stage achieved; the history `decide` reads."""

    stage: int
    level: int
    steps: int
    r1_mean: float | None
    """Rolling mean of the last `promote_window` rewards when the stage ended."""
    r1_stage_mean: float | None
    """Mean of every counted reward of the stage."""
    promoted: bool
    action: Action | None = None
    next_level: int | None = None


@dataclass(frozen=True)
class StageDecision:
    """The verdict on a finished stage: promoted or not, and what the run does next."""

    stage: int
    level: int
    promoted: bool
    r1_mean: float | None
    action: Action
    next_level: int | None
    """Level of the next stage; None when the run is finished (action "stop")."""
    reason: str

    @property
    def status(self) -> str:
        """The stage's status in curriculum_state.json: "promoted" or "plateau"."""
        return "promoted" if self.promoted else "plateau"

    @property
    def finished(self) -> bool:
        return self.next_level is None


# Pure decisions ---------------------------------------------------------------------


def rolling_mean(window: Sequence[float]) -> float | None:
    """Mean of the window, None when it is empty."""
    return math.fsum(window) / len(window) if window else None


def promotion_reached(window: Sequence[float], steps: int, config: CurriculumConfig) -> bool:
    """Whether a stage with this reward window after `steps` steps has earned promotion."""
    # A full window keeps a lucky first batch from promoting on a handful of rewards.
    if steps < config.min_stage_steps or len(window) < config.promote_window:
        return False
    mean = rolling_mean(window[-config.promote_window :])
    return mean is not None and mean >= config.promote_threshold


def decide(
    history: Sequence[StageRecord], config: CurriculumConfig, max_level: int
) -> StageDecision:
    """What follows the last stage of `history`: a pure function of the history and config."""
    if not history:
        raise ValueError("decide needs at least one finished stage in the history")
    last = history[-1]
    failures = sum(1 for r in history if r.level == last.level and not r.promoted)
    exhausted = failures > config.max_repeats
    next_level: int | None
    if last.promoted and last.level >= max_level:
        action, next_level, reason = "stop", None, f"promoted at the last level {max_level}"
    elif last.promoted:
        action, next_level, reason = "advance", last.level + 1, f"promoted from level {last.level}"
    elif (
        config.demote_threshold is not None
        and last.r1_mean is not None
        and last.r1_mean < config.demote_threshold
        and last.level > config.start_level
        and not exhausted
    ):
        action, next_level = "demote", last.level - 1
        reason = f"r1 mean {last.r1_mean:.3f} below demote_threshold {config.demote_threshold}"
    elif config.plateau_policy == "repeat" and not exhausted:
        action, next_level = "repeat", last.level
        reason = f"plateau at level {last.level}; retry {failures} of {config.max_repeats}"
    elif config.plateau_policy == "advance" and last.level < max_level:
        action, next_level, reason = "advance", last.level + 1, f"plateau at level {last.level}"
    else:
        action, next_level = "stop", None
        reason = f"plateau at level {last.level} ({failures} failed stages, policy "
        reason += f"{config.plateau_policy!r})"
    if (
        next_level is not None
        and config.num_stages is not None
        and len(history) >= config.num_stages
    ):
        action, next_level, reason = "stop", None, f"all num_stages={config.num_stages} trained"
    return StageDecision(
        last.stage, last.level, last.promoted, last.r1_mean, action, next_level, reason
    )


def replay_levels(
    level: int, n: int, replay_fraction: float, seed: int = 0, start_level: int = 1
) -> list[int]:
    """The level each of a stage's `n` prompts is drawn from, shuffled with `seed`.

    round(n * replay_fraction) prompts come from levels start_level..level-1, the rest
    from `level`. Nearer levels get more: each step back halves the weight, so the
    previous level (the one most at risk of being forgotten) gets the largest share.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 <= replay_fraction < 1.0:
        raise ValueError(f"replay_fraction={replay_fraction!r} is invalid; valid: [0, 1)")
    if level < start_level:
        raise ValueError(f"level {level} is below start_level {start_level}")
    easier = list(range(level - 1, start_level - 1, -1))  # nearest first
    n_replay = int(n * replay_fraction + 0.5) if easier else 0
    weights = [0.5**i for i in range(len(easier))]
    shares = [n_replay * w / sum(weights) for w in weights] if easier else []
    counts = [int(s) for s in shares]
    # Largest remainder: the replay count is exact and ties favour nearer levels.
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: n_replay - sum(counts)]:
        counts[i] += 1
    levels = [level] * (n - n_replay)
    for easy, count in zip(easier, counts, strict=True):
        levels += [easy] * count
    random.Random(seed).shuffle(levels)
    return levels


# The stateful controller ------------------------------------------------------------


class CurriculumController:
    """Tracks the running stage's rewards and the stage history; decides with `decide`."""

    def __init__(self, config: CurriculumConfig, num_levels: int) -> None:
        config.validate()
        if not _is_int(num_levels) or num_levels < 1:
            raise ValueError(f"num_levels must be an integer >= 1, got {num_levels!r}")
        for name in ("start_level", "max_level"):
            value = getattr(config, name)
            if value is not None and value > num_levels:
                raise _invalid(name, value, f"a level in 1..{num_levels} (the task's levels)")
        self.config = config
        self.num_levels = num_levels
        self.max_level: int = config.max_level or num_levels
        self.stage = 1
        self.level = config.start_level
        self.finished = False
        self.history: list[StageRecord] = []
        self._reset_stage()

    def _reset_stage(self) -> None:
        self.stage_steps = 0
        self.last_step: int | None = None
        self._window: deque[float] = deque(maxlen=self.config.promote_window)
        self._reward_sum = 0.0
        self._reward_count = 0

    def _check_running(self) -> None:
        if self.finished:
            raise RuntimeError("the curriculum is finished; no stage is running")

    @property
    def repeats(self) -> int:
        """How many stages at the current level have ended without promotion."""
        return sum(1 for r in self.history if r.level == self.level and not r.promoted)

    def record_step(
        self, step: int, r1: Sequence[float | None], levels: Sequence[int] | None = None
    ) -> bool:
        """Record one training step's first-attempt rewards; False if `step` was seen.

        NaN/None rewards (TRL turns a None reward into NaN) are skipped. With `levels`
        (each completion's level), only rewards at the stage's level count, so replayed
        easier prompts cannot earn a promotion. Steps at or before the last recorded one
        are ignored, so a callback that replays steps after a resume counts them once.
        """
        self._check_running()
        if self.last_step is not None and step <= self.last_step:
            return False
        if levels is not None and len(levels) != len(r1):
            raise ValueError(f"got {len(r1)} rewards but {len(levels)} levels")
        for i, value in enumerate(r1):
            if value is None or not math.isfinite(float(value)):
                continue
            if levels is not None and levels[i] != self.level:
                continue
            self._window.append(float(value))
            self._reward_sum += float(value)
            self._reward_count += 1
        self.stage_steps += 1
        self.last_step = step
        return True

    def rolling_mean(self) -> float | None:
        """Mean of the last `promote_window` counted rewards of this stage (None: none yet)."""
        return rolling_mean(self._window)

    def promotion_reached(self) -> bool:
        """Whether the running stage has earned promotion."""
        return promotion_reached(list(self._window), self.stage_steps, self.config)

    def should_stop_stage(self) -> bool:
        """Whether the running stage should end now: promotion earned or max steps reached."""
        self._check_running()
        return self.stage_steps >= self.config.max_stage_steps or self.promotion_reached()

    def end_stage(self) -> StageDecision:
        """Close the running stage, decide what follows and move on to it."""
        self._check_running()
        record = StageRecord(
            stage=self.stage,
            level=self.level,
            steps=self.stage_steps,
            r1_mean=self.rolling_mean(),
            r1_stage_mean=self._reward_sum / self._reward_count if self._reward_count else None,
            promoted=self.promotion_reached(),
        )
        decision = decide([*self.history, record], self.config, self.max_level)
        self.history.append(replace(record, action=decision.action, next_level=decision.next_level))
        if decision.next_level is None:
            self.finished = True
        else:
            self.stage += 1
            self.level = decision.next_level
        self._reset_stage()
        return decision

    def replay_levels(self, n: int, seed: int = 0) -> list[int]:
        """The level of each of `n` prompts for the running stage (see `replay_levels`)."""
        return replay_levels(
            self.level, n, self.config.replay_fraction, seed, self.config.start_level
        )

    # Checkpointing -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly here, as JSON-serialisable values."""
        return {
            "version": STATE_VERSION,
            "config": asdict(self.config),
            "num_levels": self.num_levels,
            "stage": self.stage,
            "level": self.level,
            "finished": self.finished,
            "stage_steps": self.stage_steps,
            "last_step": self.last_step,
            "window": list(self._window),
            "reward_sum": self._reward_sum,
            "reward_count": self._reward_count,
            "history": [asdict(r) for r in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`, keeping this controller's config; ValueError if it cannot."""
        try:
            if state["version"] != STATE_VERSION:
                raise ValueError(
                    f"controller state version {state['version']!r} is not {STATE_VERSION}"
                )
            level, finished = int(state["level"]), bool(state["finished"])
            if not finished and not self.config.start_level <= level <= self.max_level:
                raise ValueError(
                    f"saved level {level} is outside this config's levels "
                    f"{self.config.start_level}..{self.max_level}"
                )
            history = [StageRecord(**r) for r in state["history"]]
            window = [float(x) for x in state["window"]]
            stage, steps = int(state["stage"]), int(state["stage_steps"])
            last_step = None if state["last_step"] is None else int(state["last_step"])
            reward_sum, reward_count = float(state["reward_sum"]), int(state["reward_count"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"controller state is malformed: {err!r}") from err
        self.stage, self.level, self.finished, self.history = stage, level, finished, history
        self._reset_stage()
        self.stage_steps, self.last_step = steps, last_step
        self._window.extend(window)
        self._reward_sum, self._reward_count = reward_sum, reward_count

    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], config: CurriculumConfig | None = None
    ) -> CurriculumController:
        """A controller continuing from `state`, with its saved config unless one is given."""
        try:
            saved_config = CurriculumConfig(**state["config"])
            num_levels = state["num_levels"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"controller state is malformed: {err!r}") from err
        controller = cls(config or saved_config, num_levels)
        controller.load_state_dict(state)
        return controller
