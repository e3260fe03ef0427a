"""The ERL step: gate -> feedback -> reflect -> retry -> credit -> remember -> new rows.

`ERLStep` takes the first attempts a base trainer generated and scored (`FirstAttempts`)
and returns the rows ERL adds to its batch (`NewRows`), with the step's metrics:

1. gate: rows whose reward r1 is below `reward_threshold` go on (NaN never does);
2. feedback: one string per gated first attempt (`feedback_func`, or a stock line);
3. reflect: one generation per gated row from the reflection template, which shows the
   stored reflections `memory_scope` retrieves from the `ReflectionMemory`;
4. retry: one generation from the retry template; r2 is scored against the original row;
5. credit: the retry advantage of each reflection and retry row (`retry_advantages`, a
   hook: `ERLTrainer(retry_advantages=...)`), over every process's retries;
6. remember: reflections whose retry reached the threshold enter the memory;
7. internalize: (original prompt -> successful retry) rows, advantage `internalization_coef`.

Everything it needs from the trainer it runs in is the small `StepBackend` interface
(generate, score, feedback, tokenize, gather), so a test drives it with plain functions
and no trainer (tests/test_erl_step.py). It imports neither trl nor transformers:
`pipeline.erl.trainer` is the adapter to TRL's GRPOTrainer.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pipeline.erl.memory import MemoryEntry, ReflectionMemory
from pipeline.erl.prompts import (
    as_completion,
    memory_text,
    prompt_text,
    reflection_prompt,
    retry_prompt,
)
from rewards import completion_text

RETRY_ADVANTAGES = ("group", "improvement")
REFLECTION_ADVANTAGES = ("retry", "siblings")
NO_FEEDBACK = "No feedback available; the reward was below the target."

# Gate and success tests allow this much float rounding below the threshold: a weighted sum
# of rewards with weights that add up to 1 can land a few ulps under 1.0 for a perfect
# completion (e.g. weights [0.2, 0.218, 0.309, 0.145, 0.127] in float32).
THRESHOLD_TOLERANCE = 1e-5

# The parts of a merged batch (`NewRows.parts` labels ERL's rows; GRPO's rows are "first").
# With ERLConfig.loss_normalization="per_part" each part is normalised over its own tokens.
PART_FIRST = "first"  # first attempts y1 (GRPO's own rows)
PART_RETRY = "retry"  # reflections and retries y2: the second attempt, advantage from r2
PART_INTERNALIZATION = "internalization"  # original prompt -> successful y2
PART_FILLER = "filler"  # inert rows
PARTS = (PART_FIRST, PART_RETRY, PART_INTERNALIZATION)


def reaches_threshold(reward: float, threshold: float) -> bool:
    """Whether `reward` reaches `threshold` up to float rounding (NaN never does)."""
    return reward >= threshold - THRESHOLD_TOLERANCE * max(1.0, abs(threshold))


# What goes in and what comes out ------------------------------------------------------


@dataclass(frozen=True)
class FirstAttempts:
    """This process's first attempts: dataset rows, prompts, completions as the reward
    functions got them, their token ids, and r1 (the weighted reward, NaN: unscorable)."""

    rows: list[dict]
    prompts: list
    completions: list
    completion_ids: list[list[int]]
    rewards: torch.Tensor


@dataclass(frozen=True)
class Generated:
    """One sample per prompt: prompt and completion ids, the decoded completions, and the
    sampler's per-token log-probs of each (None where the generator reports none)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]
    logprobs: list[list[float] | None]


@dataclass
class NewRows:
    """Rows ERL adds to a generation batch (token ids as lists, one advantage each)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: list[float]
    valid: list[bool]  # False: inert (count equalising or filler); pad-only completion
    trainable: list[bool]  # False: kept but masked, as GRPO masks truncated completions
    # Per-token log-probs the generator reported for each row (vLLM), else None.
    sampling_logps: list[list[float] | None] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # one of PARTS (or PART_FILLER) per row

    def __post_init__(self) -> None:
        if not self.sampling_logps:
            self.sampling_logps = [None] * len(self.valid)
        if not self.parts:
            self.parts = [PART_RETRY] * len(self.valid)

    def extend(self, other: NewRows) -> None:
        """Append `other`'s rows."""
        self.prompt_ids += other.prompt_ids
        self.completion_ids += other.completion_ids
        self.advantages += other.advantages
        self.valid += other.valid
        self.trainable += other.trainable
        self.sampling_logps += other.sampling_logps
        self.parts += other.parts

    def add_filler(self, count: int) -> None:
        """Append `count` inert rows (they only round the row count up)."""
        self.extend(
            NewRows(
                [self.prompt_ids[0]] * count,
                [[]] * count,
                [0.0] * count,
                [False] * count,
                [False] * count,
                parts=[PART_FILLER] * count,
            )
        )


@dataclass
class StepResult:
    """The rows to merge (None: no process gated a row) and the step's `erl/` metrics,
    already reduced over processes."""

    rows: NewRows | None
    metrics: dict[str, float]


# What the step needs from the trainer it runs in --------------------------------------


class Processes(Protocol):
    """The collectives of a run over `count` processes (this one is `index`)."""

    count: int
    index: int

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's `tensor`, concatenated along dim 0 in process order."""

    def gather_object(self, items: list) -> list:
        """Every process's `items`, concatenated in process order."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `tensor` over processes."""


class OneProcess:
    """`Processes` of a single process: every collective hands its input back."""

    count, index = 1, 0

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_object(self, items: list) -> list:
        return list(items)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class StepBackend(Protocol):
    """What the ERL step needs from a base trainer."""

    processes: Processes

    def generate(self, prompts: list, max_new_tokens: int) -> Generated:
        """One sample per prompt (every process calls it with as many prompts)."""

    def score(self, rows: list[dict], prompts: list, completions: list, completion_ids) -> Any:
        """The weighted reward of each completion against its dataset row: a (n,) tensor,
        NaN where no reward function could score it (every process scores as many rows)."""

    def feedback(self, rows: list[dict], prompts: list, completions: list, completion_ids):
        """One feedback string per completion (see `call_feedback`)."""

    def tokenize(self, prompts: list) -> list[list[int]]:
        """The token ids the trainer would feed the policy for each prompt."""

    def trainable(self, completion_ids: list[list[int]]) -> list[bool]:
        """Which completions the base trainer would train (it may mask truncated ones)."""

    def mean_token_nll(self, prompt_ids, completion_ids) -> float | None:
        """Mean negative log-likelihood per completion token under the policy (a metric;
        None where the trainer's scorer reports none). Every process calls it together."""


class StepSettings(Protocol):
    """The `ERLConfig` options the step reads."""

    reward_threshold: float
    enable_reflection: bool
    enable_memory: bool
    enable_internalization: bool
    internalization_coef: float
    train_retries: bool
    retry_advantage: str
    scale_rewards: str
    reflection_system_prompt: str
    retry_system_prompt: str
    reflection_max_completion_length: int | None
    max_completion_length: int
    memory_top_k: int
    memory_scope: str
    memory_min_gain: float
    reflections_per_attempt: int
    reflection_advantage: str
    reflect_per_group: int
    reuse_lessons: bool


RetryAdvantages = Callable[..., list[float]]
"""`(groups, r1, r2, valid, scale, mode) -> advantages`, the signature of `retry_advantages`."""


def retry_advantages(
    groups: list[str],
    r1: torch.Tensor,
    r2: torch.Tensor,
    valid: list[bool],
    scale: bool,
    mode: str = "group",
) -> list[float]:
    """Advantage of each retry (of every process: ERLStep gathers them first). `groups`
    names each retry's prompt; rows not `valid` (filler, unscorable r2) get 0.

    `mode="group"`: r2 normalised within the retries of the same prompt (divided by their
    std when `scale`), a retry alone in its group r2 - r1. `mode="improvement"`: r2 - r1 for
    every retry (a group whose retries all succeed would otherwise get 0 everywhere).

    >>> retry_advantages(["a", "a", "b"], torch.zeros(3), torch.tensor([1.0, 0.0, 0.5]),
    ...                  [True, True, True], scale=False)
    [0.5, -0.5, 0.5]
    """
    members: dict[str, list[int]] = defaultdict(list)
    for j, (key, ok) in enumerate(zip(groups, valid)):
        if ok:
            members[key].append(j)
    advantages = [0.0] * len(groups)
    r1, r2 = torch.nan_to_num(r1), torch.nan_to_num(r2)
    for rows in members.values():
        if len(rows) == 1 or mode == "improvement":
            for j in rows:
                advantages[j] = (r2[j] - r1[j]).item()
            continue
        values = r2[rows]
        centred = values - values.mean()
        if scale:
            centred = centred / (values.std() + 1e-4)
        for j, a in zip(rows, centred.tolist()):
            advantages[j] = a
    return advantages


def call_feedback(
    func: Callable[..., Sequence[str]] | None,
    rows: list[dict],
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    **context: Any,
) -> list[str]:
    """`func`'s feedback for each completion, called like a TRL reward function (the rows'
    columns as lists, plus `context`: trainer_state, log_extra, log_metric); without a
    `func`, a stock line. A wrong count or a non-string is a ValueError naming `func`."""
    if func is None:
        return [NO_FEEDBACK] * len(prompts)
    columns = {
        key: [row[key] for row in rows]
        for key in rows[0]
        if key not in ("prompt", "completion", "completion_ids")
    }
    feedback = func(
        prompts=prompts,
        completions=completions,
        completion_ids=completion_ids,
        **columns,
        **context,
    )
    name = getattr(func, "__name__", type(func).__name__)
    if not isinstance(feedback, list | tuple) or len(feedback) != len(prompts):
        got = len(feedback) if isinstance(feedback, list | tuple) else type(feedback).__name__
        raise ValueError(
            f"feedback_func '{name}' returned {got} feedback strings, but {len(prompts)} were "
            "expected (one per completion)"
        )
    bad = [type(f).__name__ for f in feedback if not isinstance(f, str)]
    if bad:
        raise ValueError(f"feedback_func '{name}' must return strings, got {bad[0]}")
    return list(feedback)


# The step -----------------------------------------------------------------------------


@dataclass
class _Unit:
    """One retry to make: gated row `row` (an index into the step's padded rows), the
    lesson it reads (a reflection to write, the raw feedback, or a confirmed lesson), and
    the memory entries its reflection prompt shows (their records count its retry)."""

    row: int
    valid: bool
    reflect: bool  # a reflection is written for it (else `lesson` is given)
    lesson: str = ""
    shown: list[MemoryEntry] = field(default_factory=list)
    reused: int | None = None  # the id of the confirmed lesson it reads directly


class ERLStep:
    """Gate, feedback, reflection, retry, credit, memory and internalization for one
    generation batch (see the module docstring). Every process of a run calls it once per
    batch, in step: it pads its rows to the global count with masked copies, and the
    memory gets the same records and reflections in the same order everywhere."""

    def __init__(
        self,
        settings: StepSettings,
        memory: ReflectionMemory,
        retry_advantages: RetryAdvantages = retry_advantages,
    ) -> None:
        self.settings = settings
        self.memory = memory
        self.retry_advantages = retry_advantages
        # Since this step object was made (a stage, or its resumed part): reflections written,
        # what the memory did with them (memory.py's outcomes), refusals below memory_min_gain.
        self.tally: Counter[str] = Counter()

    def __call__(self, backend: StepBackend, first: FirstAttempts, step: int) -> StepResult:
        """The rows ERL adds for `first` (global step `step`, stored with each memory entry)."""
        processes, s = backend.processes, self.settings
        r1 = first.rewards
        gated = [
            i
            for i, r in enumerate(r1.tolist())
            if r == r and not reaches_threshold(r, s.reward_threshold)
        ]
        all_r1 = processes.gather(r1)
        metrics = {
            "erl/r1_mean": torch.nanmean(all_r1).item(),
            "erl/gated_fraction": _global_count(processes, len(gated), r1) / all_r1.numel(),
        }
        keys = [_group_key(p) for p in first.prompts]
        if s.reflect_per_group:
            gated = self._first_per_group(processes, [keys[i] for i in gated], gated)
        counts = processes.gather(torch.tensor([len(gated)], device=r1.device))
        rows = None
        if counts.max().item() > 0:
            baseline = _group_means(processes.gather_object(keys), all_r1)
            rows = self._experience(
                backend, first, gated, int(counts.max().item()), step, metrics, baseline
            )
        else:
            metrics["erl/internalization_rows"] = 0.0
        metrics["erl/memory_size"] = float(len(self.memory))
        return StepResult(rows, metrics)

    def _first_per_group(self, processes, keys: list[str], gated: list[int]) -> list[int]:
        """The gated rows among the first `reflect_per_group` gated rows of their prompt's
        group, counted over every process in process order (a group can span processes)."""
        every = processes.gather_object([(processes.index, key) for key in keys])
        seen: dict[str, int] = defaultdict(int)
        keep = []
        for index, key in every:
            seen[key] += 1
            if index == processes.index:
                keep.append(seen[key] <= self.settings.reflect_per_group)
        return [i for i, kept in zip(gated, keep) if kept]

    def _experience(self, backend, first, gated, pad_to, step, metrics, baseline) -> NewRows:
        """Phases 2-7 for the `gated` rows, padded to `pad_to` rows with masked copies (every
        process must score as many rows: the reward gather needs it). `baseline`: each
        prompt group's mean first-attempt reward, over every process."""
        s, processes = self.settings, backend.processes
        valid = [True] * len(gated) + [False] * (pad_to - len(gated))
        idx = gated + [gated[0] if gated else 0] * (pad_to - len(gated))
        rows = [first.rows[i] for i in idx]
        prompts = [first.prompts[i] for i in idx]
        r1 = first.rewards[idx]
        p_hat = torch.tensor([baseline[_group_key(p)] for p in prompts], device=r1.device)
        feedback = backend.feedback(
            rows,
            prompts,
            [first.completions[i] for i in idx],
            [first.completion_ids[i] for i in idx],
        )
        texts = [prompt_text(p) for p in prompts]

        # ---- Reflect: `reflections_per_attempt` per row, or a confirmed lesson read
        # directly, or (the ablation) the raw feedback.
        units = self._units(processes, texts, valid, feedback, step, r1.device)
        reflecting = [u for u in units if u.reflect]
        reflections = None
        # Every process has as many reflecting units (padded), so none has any or all do;
        # with reuse_lessons every row may read a confirmed lesson and none reflect.
        if s.enable_reflection and reflecting:
            reflection_prompts = [
                reflection_prompt(
                    prompts[u.row],
                    s.reflection_system_prompt,
                    attempt=completion_text(first.completions[idx[u.row]]),
                    feedback=feedback[u.row],
                    reward=r1[u.row].item(),
                    memory=memory_text([e.reflection for e in u.shown]),
                )
                for u in reflecting
            ]
            length = s.reflection_max_completion_length or s.max_completion_length
            reflections = backend.generate(reflection_prompts, length)
            for unit, text in zip(reflecting, reflections.texts):
                unit.lesson = text.strip()

        # ---- Retry, scored by the reward functions against the ORIGINAL row (answer and
        # metadata columns); `attempt` tells them (and their logs) that these are retries.
        retry_prompts = [
            retry_prompt(prompts[u.row], s.retry_system_prompt, u.lesson) for u in units
        ]
        retries = backend.generate(retry_prompts, s.max_completion_length)
        r2 = backend.score(
            [{**rows[u.row], "attempt": 2} for u in units],
            [prompts[u.row] for u in units],
            [as_completion(prompts[u.row], text) for u, text in zip(units, retries.texts)],
            retries.completion_ids,
        )
        # A retry no reward function could score (all None -> NaN) carries no signal, as in GRPO.
        scored = [u.valid and r == r for u, r in zip(units, r2.tolist())]
        success = [
            ok and reaches_threshold(r, s.reward_threshold) for ok, r in zip(scored, r2.tolist())
        ]

        # ---- Credit: retries as a group per prompt; reflections by `reflection_advantage`.
        unit_prompts = [prompts[u.row] for u in units]
        unit_r1, unit_p_hat = r1[[u.row for u in units]], p_hat[[u.row for u in units]]
        advantages = self._credit(processes, unit_prompts, unit_r1, r2, scored)
        reflection_advantages = self._reflection_credit(units, r2, scored, unit_p_hat, advantages)

        # ---- Remember: every process applies the same records and offers in the same order.
        gains = (torch.nan_to_num(r2) - unit_p_hat).tolist()
        # A successful reflection is offered unless its retry fell short of memory_min_gain.
        enough = [
            (u, gain >= s.memory_min_gain - 1e-9)
            for u, ok, gain in zip(units, success, gains)
            if ok and u.reflect
        ]
        offers = [(texts[u.row], u.lesson) for u, gained in enough if gained]
        below_gain = sum(not gained for _, gained in enough)
        records = [
            ([e.order for e in u.shown] + ([u.reused] if u.reused is not None else []), ok)
            for u, ok in zip(units, success)
            if u.valid and (u.shown or u.reused is not None)
        ]
        self._remember(processes, records, offers, step)

        # ---- New rows: reflections and retries (untrained ones stay inert, so every process
        # keeps the same row count), then internalization.
        trained = [u.valid and s.train_retries for u in units]
        new_rows = NewRows([], [], [], [], [])
        if reflections is not None:
            kept = [i for i, u in enumerate(units) if u.reflect]
            new_rows.extend(
                NewRows(
                    reflections.prompt_ids,
                    reflections.completion_ids,
                    [reflection_advantages[i] for i in kept],
                    [trained[i] for i in kept],
                    backend.trainable(reflections.completion_ids),
                    list(reflections.logprobs),
                    parts=[PART_RETRY] * len(kept),
                )
            )
        new_rows.extend(
            NewRows(
                retries.prompt_ids,
                retries.completion_ids,
                list(advantages),
                trained,
                backend.trainable(retries.completion_ids),
                list(retries.logprobs),
                parts=[PART_RETRY] * len(units),
            )
        )
        internalize = s.enable_internalization and s.internalization_coef > 0
        kept = [i for i in range(len(units)) if success[i]] if internalize else []
        if kept:
            kept_ids = [retries.completion_ids[i] for i in kept]
            # Not sampled from the original prompt: no sampling log-probs (ratio 1, exact CE).
            new_rows.extend(
                NewRows(
                    backend.tokenize([unit_prompts[i] for i in kept]),
                    kept_ids,
                    [s.internalization_coef] * len(kept),
                    [True] * len(kept),
                    backend.trainable(kept_ids),
                    parts=[PART_INTERNALIZATION] * len(kept),
                )
            )
        metrics.update(self._metrics(backend, r2, scored, success, len(kept), new_rows))
        counts = torch.tensor(
            [
                float(sum(u.valid and u.reflect for u in units)),
                float(sum(u.valid and u.reused is not None for u in units)),
                float(below_gain),
            ],
            device=r2.device,
        )
        written, reused, below = processes.sum(counts).tolist()
        metrics["erl/reflections"] = written
        self.tally["reflections"] += int(written)
        if s.reuse_lessons:
            metrics["erl/lessons_reused"] = reused
            self.tally["reused"] += int(reused)
        if s.enable_reflection and s.enable_memory:
            metrics["erl/memory_below_gain"] = below
            self.tally["below_gain"] += int(below)
            for outcome, count in self.memory.pop_outcomes().items():
                metrics[f"erl/memory_{outcome}"] = float(count)
                self.tally[outcome] += count
        return new_rows

    def _units(self, processes, texts, valid, feedback, step, device) -> list[_Unit]:
        """The retries to make for the rows, and what each reads. Every process makes as
        many (masked copies fill up), and generates as many reflections."""
        s = self.settings
        units: list[_Unit] = []
        for row, (text, ok) in enumerate(zip(texts, valid)):
            if not s.enable_reflection:  # the ablation: the retry reads the raw feedback
                units.append(_Unit(row, ok, reflect=False, lesson=feedback[row].strip()))
                continue
            lesson = self.memory.confirmed(text) if s.reuse_lessons and s.enable_memory else None
            if lesson is not None:
                units.append(_Unit(row, ok, False, lesson.reflection, reused=lesson.order))
                continue
            for _ in range(s.reflections_per_attempt):
                units.append(_Unit(row, ok, reflect=True))
        # Equal counts everywhere: of retries (the reward gather) and of reflections (the
        # generate calls); the fillers copy a unit of the same kind and train nothing.
        reflect = [u for u in units if u.reflect]
        given = [u for u in units if not u.reflect]
        local = torch.tensor([len(reflect), len(given)], device=device)
        want = processes.gather(local).reshape(-1, 2).amax(dim=0)
        for kind, count in ((reflect, int(want[0])), (given, int(want[1]))):
            template = kind[0] if kind else _Unit(0, False, kind is reflect, feedback[0].strip())
            for _ in range(count - len(kind)):
                kind.append(_Unit(template.row, False, template.reflect, template.lesson))
        units = reflect + given
        for number, unit in enumerate(units):
            if unit.reflect:
                rng = random.Random(f"{step}:{processes.index}:{number}")
                unit.shown = self._shown(texts[unit.row], rng)
        return units

    def _shown(self, text: str, rng: random.Random | None) -> list[MemoryEntry]:
        """The entries a reflection prompt for `text` shows: those `memory_scope` picks (the
        rulebook's draw with `rng`; its strongest entry without); none with the memory off."""
        s = self.settings
        if not s.enable_memory:
            return []
        return self.memory.lookup(text, s.memory_top_k, s.memory_scope, rng)

    def memory_for(self, text: str, rng: random.Random | None = None) -> str:
        """The `{memory}` of a reflection prompt for `text` (what `_shown` picks)."""
        return memory_text([e.reflection for e in self._shown(text, rng)])

    def _credit(self, processes, prompts, r1, r2, valid) -> list[float]:
        """`retry_advantages` over the retries of every process, sliced back to this one's.

        GRPO's sampler gives each process a contiguous slice of the generation batch, so one
        prompt's generations (and its retries) can live on several processes; like GRPO for
        r1, gather the group keys, r1, r2 and validity and credit all of them. Every process
        holds the same number of retries here (padded to the global maximum)."""
        groups = [_group_key(p) for p in prompts]
        flags = torch.tensor(valid, device=r2.device, dtype=torch.long)
        advantages = self.retry_advantages(
            processes.gather_object(groups),
            processes.gather(r1),
            processes.gather(r2),
            processes.gather(flags).bool().tolist(),
            self.settings.scale_rewards != "none",
            self.settings.retry_advantage,
        )
        start = processes.index * len(groups)
        return list(advantages[start : start + len(groups)])

    def _reflection_credit(self, units, r2, valid, p_hat, advantages) -> list[float]:
        """The advantage of each unit's reflection tokens (`reflection_advantage`): its
        retry's, or its retry's reward against a baseline its own text does not move, the
        other reflections' retries on the same attempt (else the prompt's first attempts)."""
        if self.settings.reflection_advantage == "retry":
            return list(advantages)
        r2 = torch.nan_to_num(r2)
        siblings: dict[int, list[int]] = defaultdict(list)
        for i, (unit, ok) in enumerate(zip(units, valid)):
            if ok and unit.reflect:
                siblings[unit.row].append(i)
        credit = [0.0] * len(units)
        for members in siblings.values():
            for i in members:
                others = [j for j in members if j != i]
                base = r2[others].mean() if others else p_hat[i]
                credit[i] = (r2[i] - base).item()
        return credit

    def _remember(self, processes, records, offers, step: int) -> None:
        """Apply every process's records (which entries a retry read, and how it ended), then
        offer its reflections whose retry succeeded, in process order everywhere."""
        if not self.settings.enable_memory:
            return
        for orders, success in processes.gather_object(records):
            self.memory.record(orders, success)
        for text, reflection in processes.gather_object(offers):
            self.memory.add(text, reflection, step=step)

    def _metrics(self, backend, r2, valid, success, internalized, rows) -> dict[str, float]:
        """The retries' `erl/` metrics over every process."""
        processes = backend.processes
        mask = torch.tensor(valid, device=r2.device) & ~torch.isnan(r2)
        stats = torch.tensor(
            [r2[mask].sum().item(), mask.sum().item(), float(sum(success)), float(internalized)],
            device=r2.device,
        )
        total_r2, gated, successes, total_internalized = processes.sum(stats).tolist()
        metrics = {
            "erl/r2_mean": total_r2 / max(gated, 1.0),
            "erl/retry_success_rate": successes / max(gated, 1.0),
            "erl/internalization_rows": total_internalized,
        }
        # A metric-only forward, decided from the global count: a forward on some processes
        # and not others would hang sharded (FSDP/ZeRO-3) training. A process without
        # internalization rows scores one of its other rows, counted for nothing.
        if total_internalized:
            count = max(internalized, 1)
            nll = backend.mean_token_nll(rows.prompt_ids[-count:], rows.completion_ids[-count:])
            tokens = sum(len(ids) for ids in rows.completion_ids[-count:]) if internalized else 0
            if nll is None:
                nll, tokens = 0.0, 0
            total, all_tokens = processes.sum(
                torch.tensor([nll * tokens, float(tokens)], device=r2.device)
            ).tolist()
            if all_tokens:
                metrics["erl/internalization_loss"] = (
                    total / all_tokens * self.settings.internalization_coef
                )
        return metrics


def _group_key(prompt) -> str:
    """What names a prompt's group (its GRPO generations share the prompt exactly)."""
    return json.dumps(prompt, sort_keys=True, default=str)


def _group_means(keys: list[str], rewards: torch.Tensor) -> dict[str, float]:
    """The mean reward of each group over the gathered first attempts (NaN: left out; a
    group with none scored: 0)."""
    totals: dict[str, list[float]] = defaultdict(list)
    for key, reward in zip(keys, rewards.tolist()):
        if reward == reward:
            totals[key].append(reward)
    return defaultdict(float, {k: sum(v) / len(v) for k, v in totals.items()})


def _global_count(processes, count: int, like: torch.Tensor) -> float:
    return float(processes.sum(torch.tensor([float(count)], device=like.device)).item())
