"""The ERL step: gate -> feedback -> reflect -> retry -> credit -> remember -> new rows.

`ERLStep` takes the first attempts a base trainer generated and scored (`FirstAttempts`)
and returns the rows ERL adds to its batch (`NewRows`), with the step's metrics:

1. gate: rows whose reward r1 is below `reward_threshold` go on (NaN never does);
2. plan: who reflects, and whose reflection each retry reads (`reflections_per_group` k:
   the first k gated attempts of each prompt's group reflect, and the i-th retries with the
   group's reflection i mod k; 0: every gated attempt reflects and retries with its own);
3. feedback: one string per reflecting first attempt (`feedback_func`, or a stock line);
4. reflect: one generation per reflecting row from the reflection template, which shows the
   stored reflections the `ReflectionMemory` picks for it (its scope and top-k);
5. retry: one attempt per gated row from the retry template, with the reflection the
   plan gives it (an episode: a fresh one from the same row, through the trainer's tool
   loop, the reflection in its system prompt); r2 is scored against the original row;
6. credit: the advantage of each reflection and retry row (`retry_advantages`, a hook:
   `ERLTrainer(retry_advantages=...)`), over every process's retries;
7. remember: reflections a retry reached the threshold with enter the memory;
8. internalize: (original prompt -> successful retry) rows, advantage `internalization_coef`.

Everything it needs from the trainer it runs in is the small `StepBackend` interface
(generate, score, feedback, tokenize, gather), so a test drives it with plain functions
and no trainer (tests/test_erl_step.py). It imports neither trl nor transformers:
`pipeline.erl.trainer` is the adapter to TRL's GRPOTrainer.
"""

from __future__ import annotations

import inspect
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from curriculum.tasks.base import prompt_key
from pipeline.erl.interface import (
    Attempts,
    FirstAttempts,
    Generated,
    NewRows,
    StepBackend,
    StepResult,
    StepSettings,
)
from pipeline.erl.memory import MemoryEntry, ReflectionMemory
from pipeline.erl.prompts import (
    attempt_text,
    lesson_in_system,
    lesson_text,
    memory_text,
    prompt_text,
    reflection_prompt,
    retry_prompt,
    task_prompt,
    template_fields,
    without_reflection,
)

NO_FEEDBACK = "No feedback available; the reward was below the target."

# Gate and success tests allow this much float rounding below the threshold: a weighted sum
# of rewards with weights that add up to 1 can land a few ulps under 1.0 for a perfect
# completion (e.g. weights [0.2, 0.218, 0.309, 0.145, 0.127] in float32).
THRESHOLD_TOLERANCE = 1e-5


def reaches_threshold(reward: float, threshold: float) -> bool:
    """Whether `reward` reaches `threshold` up to float rounding (NaN never does)."""
    return reward >= threshold - THRESHOLD_TOLERANCE * max(1.0, abs(threshold))


RetryAdvantages = Callable[[list[str], torch.Tensor, torch.Tensor, list[bool], bool], list[float]]
"""`(groups, r1, r2, valid, scale) -> advantages`, the signature of `retry_advantages`."""


def retry_advantages(
    groups: list[str],
    r1: torch.Tensor,
    r2: torch.Tensor,
    valid: list[bool],
    scale: bool,
) -> list[float]:
    """Advantage of each retry (of every process: ERLStep gathers them first). `groups`
    names each retry's prompt; rows not `valid` (filler, unscorable r2) get 0: r2 normalised
    within the retries of the same prompt (divided by their std when `scale`), a retry alone
    in its group r2 - r1.

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
        if len(rows) == 1:
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
    columns as lists, plus `context`: trainer_state, log_extra, log_metric, and
    `environments` after an episode); without a `func`, each environment's `feedback`
    property where it has one, else a stock line. A wrong count or a non-string is a
    ValueError naming `func`."""
    if func is None:
        environments = context.get("environments") or [None] * len(prompts)
        return [environment_feedback(environment) for environment in environments]
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


def environment_feedback(environment: Any) -> str:
    """An environment's `feedback` (a property or attribute: TRL offers every public
    method as a tool, so a method would be shown to the model), else the stock line."""
    feedback = getattr(environment, "feedback", None)
    if feedback is None:
        return NO_FEEDBACK
    if not isinstance(feedback, str):
        raise ValueError(
            f"{type(environment).__name__}.feedback must be a string (a property or an "
            f"attribute), got {type(feedback).__name__}"
        )
    return feedback


def refuse_feedback_method(kind: type) -> None:
    """ValueError when environment class `kind` has a `feedback` method: TRL offers every
    public method of an environment to the model as a tool, so ERL reads an environment's
    feedback from a property (or an attribute) only."""
    if inspect.isfunction(inspect.getattr_static(kind, "feedback", None)):
        raise ValueError(
            f"{kind.__name__}.feedback is a method, which TRL offers to the model as a "
            "tool (every public method of an environment is one); ERLTrainer reads an "
            "environment's feedback from a property: make it @property, or pass "
            "feedback_func="
        )


# The step -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Gated:
    """The first attempts that reflect and retry, padded to the global count with masked
    copies (`valid` False): every process scores, generates and credits as many rows."""

    index: list[int]  # into the first attempts
    valid: list[bool]
    rows: list[dict]
    prompts: list
    texts: list[str]  # the prompts as text (the memory's keys)
    r1: torch.Tensor


@dataclass(frozen=True)
class Plan:
    """Which gated rows reflect, and which reflection each retry reads.

    A reflection's position numbers every process's reflections in process order, each
    process's padded to the same count: process p's slot-th is p * count + slot."""

    reflecting: Gated  # this process's reflecting rows, padded to the global count
    source: list[int]  # per retry (Gated row): its reflection's position; -1: a filler
    groups: list[str]  # per retry: its reflection's id, which its retries are credited among
    reflection_groups: list[str | None]  # per position: its prompt's group key (None: filler)


@dataclass(frozen=True)
class EveryRetry:
    """Every process's retries (padded), in process order: what credit and memory read,
    so that a reflection whose retries live on several processes is judged by all of them."""

    groups: list[str]
    sources: list[int]
    r1: torch.Tensor
    r2: torch.Tensor
    scored: list[bool]  # neither a filler nor unscorable (NaN r2)
    success: list[bool]


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
        # Since this step object was made (a stage, or its resumed part): reflections written
        # and what the memory did with them (memory.py's outcomes).
        self.tally: Counter[str] = Counter()

    def __call__(self, backend: StepBackend, first: FirstAttempts, step: int) -> StepResult:
        """The rows ERL adds for `first` (global step `step`, stored with each memory entry)."""
        processes = backend.processes
        all_r1 = processes.gather(first.rewards)
        gated = self._gate(first.rewards)
        metrics = {
            "erl/r1_mean": torch.nanmean(all_r1).item(),
            "erl/gated_fraction": _global_sum(processes, len(gated), all_r1) / all_r1.numel(),
        }
        counts = processes.gather(torch.tensor([len(gated)], device=all_r1.device))
        rows, records = None, []
        if counts.max().item() > 0:
            rows, experience, records = self._experience(
                backend, first, gated, int(counts.max()), step
            )
            metrics.update(experience)
        else:
            metrics["erl/internalization_rows"] = 0.0
        metrics["erl/memory_size"] = float(len(self.memory))
        return StepResult(rows, metrics, records)

    def _experience(self, backend, first, gated, pad_to, step) -> tuple[NewRows, dict, list]:
        """Phases 2-8 for the `gated` rows, padded to `pad_to`: the new rows, their metrics
        and every process's records of what happened (`_records`)."""
        processes = backend.processes
        chosen = self._pad(first, gated, pad_to)
        plan = self._plan(processes, first, chosen, len(gated))
        own = self._feedback(backend, first, chosen) if self._retries_read_feedback() else None
        feedback = (
            self._feedback(backend, first, plan.reflecting)
            if own is None
            else _feedback_of(plan.reflecting, chosen, own)
        )
        reflections, shown, cut = None, [], 0
        if self.settings.enable_reflection:
            shown = self._shown_per_row(processes, plan.reflecting, step)
            reflections, cut = self._reflect(backend, first, plan.reflecting, feedback, shown)
            lessons = [lesson_text(text) for text in reflections.texts]
        else:  # the raw-feedback baseline: each retry reads its own attempt's feedback
            lessons = feedback
        per_retry = self._lessons_per_retry(processes, plan, lessons)
        retries, r2, shown_prompts = self._retry(
            backend, chosen, self._reflections_shown(per_retry), own or [""] * len(per_retry)
        )
        # A retry no reward function could score (all None -> NaN) carries no signal, as in GRPO.
        scored = [ok and r == r for ok, r in zip(chosen.valid, r2.tolist())]
        success = [
            ok and reaches_threshold(r, self.settings.reward_threshold)
            for ok, r in zip(scored, r2.tolist())
        ]
        every = self._every_retry(processes, plan, chosen, r2, scored, success)
        advantages = self._credit(processes, plan, every)
        if reflections is not None:  # feedback is no lesson: nothing enters the memory
            self._remember(processes, plan, lessons, shown, every, step)
        kept = self._internalized(r2, scored, success)
        rows = self._new_rows(backend, plan, chosen, reflections, retries, advantages, kept)
        metrics = self._metrics(backend, plan, r2, scored, success, len(kept), rows)
        metrics["erl/attempts_cut"] = _global_sum(processes, cut, r2)
        records = self._records(
            processes, step, first, plan, chosen, feedback, reflections, lessons, shown,
            (per_retry, shown_prompts, retries.completions, r2.tolist(), success), every,
        )  # fmt: skip
        return rows, metrics, processes.gather_object(records)

    def _records(self, processes, step, first, plan, chosen, feedback, reflections, lessons,
                 shown, tried, every: EveryRetry) -> list[dict]:  # fmt: skip
        """This process's records (`pipeline.erl.experience`): each reflection it wrote
        (the attempt, its feedback, the memory shown, the reflection, the lesson taken from
        it) and each retry it ran (the lesson it read, its actual prompt, its completion,
        r2); a retry names its reflection's id ("step:position"). A reflection is `offered`
        to the memory when a retry with it, on any process, succeeded. Fillers are left out."""
        records = []
        if reflections is not None:
            succeeded = {source for source, ok in zip(every.sources, every.success) if ok}
            start = processes.index * len(lessons)  # the position of this process's first
            reflecting = plan.reflecting
            for j, valid in enumerate(reflecting.valid):
                if not valid:
                    continue
                i = reflecting.index[j]
                records.append(
                    {
                        "kind": "reflection",
                        "step": step,
                        "id": f"{step}:{start + j}",
                        **_row_fields(reflecting.rows[j]),
                        "attempt": first.completions[i],
                        "r1": reflecting.r1[j].item(),
                        "feedback": feedback[j],
                        "memory": [e.reflection for e in shown[j]],
                        "reflection": reflections.texts[j],
                        "lesson": lessons[j],
                        "offered": start + j in succeeded,
                    }
                )
        for i, (lesson, prompt, completion, r2, success) in enumerate(zip(*tried)):
            if not chosen.valid[i]:
                continue
            source = plan.source[i]
            records.append(
                {
                    "kind": "retry",
                    "step": step,
                    "reflection": f"{step}:{source}" if reflections is not None else None,
                    **_row_fields(chosen.rows[i]),
                    "r1": chosen.r1[i].item(),
                    "lesson": lesson,
                    "retry_prompt": prompt,
                    "completion": completion,
                    "r2": r2,
                    "success": success,
                }
            )
        return records

    # ---- Gate: r1 below the threshold (NaN never).

    def _gate(self, r1: torch.Tensor) -> list[int]:
        threshold = self.settings.reward_threshold
        return [
            i for i, r in enumerate(r1.tolist()) if r == r and not reaches_threshold(r, threshold)
        ]

    def _pad(self, first: FirstAttempts, gated: list[int], pad_to: int) -> Gated:
        index = gated + [gated[0] if gated else 0] * (pad_to - len(gated))
        prompts = [first.prompts[i] for i in index]
        return Gated(
            index,
            [True] * len(gated) + [False] * (pad_to - len(gated)),
            [first.rows[i] for i in index],
            prompts,
            [prompt_text(p) for p in prompts],
            first.rewards[index],
        )

    # ---- Plan: which gated rows reflect, and whose reflection each retry reads.

    def _plan(self, processes, first: FirstAttempts, chosen: Gated, count: int) -> Plan:
        """Over every process's `count` gated rows in process order (a prompt's group can
        span processes): with `reflections_per_group` k the first k of a group reflect and
        the i-th retries with the group's reflection i mod k (so a reflecting row reads its
        own); with 0 every gated row reflects and reads its own. `chosen`'s fillers reflect
        as fillers and read none. Every process computes the same plan."""
        keys = [prompt_key(p) for p in chosen.prompts]
        # Without reflections every gated row retries with its own attempt's feedback.
        k = self.settings.reflections_per_group if self.settings.enable_reflection else 0
        every = processes.gather_object([(processes.index, key) for key in keys[:count]])
        ordinal: Counter[str] = Counter()
        slots: Counter[int] = Counter()  # reflections per process so far
        place: dict[tuple[str, int], tuple[int, int]] = {}  # (key, number) -> (process, slot)
        mine: list[tuple[str, int]] = []  # this process's rows: (key, number in the group)
        for process, key in every:
            number = ordinal[key]
            ordinal[key] += 1
            if not k or number < k:
                place[key, number] = (process, slots[process])
                slots[process] += 1
            if process == processes.index:
                mine.append((key, number))
        width = max(slots.values())
        reflection_groups: list[str | None] = [None] * (processes.count * width)
        for (key, _), (process, slot) in place.items():
            reflection_groups[process * width + slot] = key
        reads = [(key, number % k if k else number) for key, number in mine]
        source = [process * width + slot for process, slot in (place[row] for row in reads)]
        reflecting = [chosen.index[j] for j, row in enumerate(mine) if row == reads[j]]
        return Plan(
            self._pad(first, reflecting, width),
            source + [-1] * (len(keys) - count),
            [f"reflection {number} of {key}" for key, number in reads] + keys[count:],
            reflection_groups,
        )

    def _lessons_per_retry(self, processes, plan: Plan, lessons: list[str]) -> list[str]:
        """The reflection each retry reads, which may have been written on another process
        (a filler retry reads none)."""
        every = processes.gather_object(lessons)
        return [every[s] if s >= 0 else "" for s in plan.source]

    # ---- Feedback: one string per reflecting first attempt, and per gated one where the
    # retries read their own ({feedback} in the retry template, or no reflection).

    def _retries_read_feedback(self) -> bool:
        s = self.settings
        return not s.enable_reflection or "feedback" in template_fields(s.retry_system_prompt)

    def _reflections_shown(self, lessons: list[str]) -> list[str]:
        """The retry template's {reflection} per retry: the lesson, or without a reflection
        the feedback as `without_reflection` places it."""
        if self.settings.enable_reflection:
            return lessons
        return [without_reflection(self.settings.retry_system_prompt, f)[0] for f in lessons]

    def _feedback(self, backend, first: FirstAttempts, chosen: Gated) -> list[str]:
        environments = first.environments
        return backend.feedback(
            chosen.rows,
            chosen.prompts,
            [first.completions[i] for i in chosen.index],
            [first.completion_ids[i] for i in chosen.index],
            environments=[environments[i] for i in chosen.index] if environments else None,
        )

    # ---- Reflect: one reflection per row, its prompt showing what the memory picks.

    def _shown_per_row(self, processes, chosen: Gated, step: int) -> list[list[MemoryEntry]]:
        """The memory entries each row's reflection prompt shows (the global rulebook draws
        with a generator seeded by step, process and row, the same on a resume)."""
        return [
            self.memory.shown(text, random.Random(f"{step}:{processes.index}:{number}"))
            for number, text in enumerate(chosen.texts)
        ]

    def _reflect(self, backend, first, chosen: Gated, feedback, shown) -> tuple[Generated, int]:
        """The reflections, and how many of the attempts they were shown were cut."""
        s = self.settings
        attempts = [
            attempt_text(first.completions[i], s.reflection_attempt_max_chars) for i in chosen.index
        ]
        prompts = [
            reflection_prompt(
                prompt,
                s.reflection_system_prompt,
                attempt=attempt,
                feedback=text,
                reward=r1,
                memory=memory_text([e.reflection for e in entries]),
            )
            for prompt, (attempt, _), text, r1, entries in zip(
                chosen.prompts, attempts, feedback, chosen.r1.tolist(), shown
            )
        ]
        reflections = backend.generate(
            prompts, s.reflection_max_completion_length or s.max_completion_length
        )
        return reflections, sum(cut for (_, cut), ok in zip(attempts, chosen.valid) if ok)

    def memory_for(self, text: str, rng: random.Random | None = None) -> str:
        """The `{memory}` of a reflection prompt for `text` (what the memory shows it)."""
        return memory_text([e.reflection for e in self.memory.shown(text, rng)])

    # ---- Retry, scored by the reward functions against the ORIGINAL row (answer and
    # metadata columns); `attempt` tells them (and their logs) that these are retries.

    def _retry(
        self, backend, chosen: Gated, lessons: list[str], feedback: list[str]
    ) -> tuple[Attempts, torch.Tensor, list]:
        """The retries, r2 and the prompts they were given (the lesson in them).
        `feedback`: each retry's own first attempt's (the template's {feedback})."""
        template = self.settings.retry_system_prompt
        if backend.episodic:  # a fresh episode from the row, the lesson as its rulebook
            prompts = [
                lesson_in_system(task_prompt(row), template, lesson, text)
                for row, lesson, text in zip(chosen.rows, lessons, feedback)
            ]
        else:
            prompts = [
                retry_prompt(p, template, lesson, text)
                for p, lesson, text in zip(chosen.prompts, lessons, feedback)
            ]
        retries = backend.attempt(chosen.rows, prompts)
        r2 = backend.score(
            [{**row, "attempt": 2} for row in chosen.rows],
            retries.prompts,
            retries.completions,
            retries.generated.completion_ids,
            environments=retries.environments,
        )
        return retries, r2, prompts

    # ---- Credit, over every process: the reflections of one prompt as a group, and the
    # retries of one reflection.

    def _every_retry(self, processes, plan: Plan, chosen: Gated, r2, scored, success):
        """Every process's retries: GRPO's sampler gives each process a contiguous slice of
        the generation batch, so one prompt's generations (and their reflections' retries)
        can live on several processes. Like GRPO for r1, gather them; every process holds
        the same number of retries here (padded to the global maximum)."""
        flags = torch.tensor(list(zip(scored, success)), device=r2.device, dtype=torch.long)
        pairs = processes.gather_object(list(zip(plan.groups, plan.source)))
        flags = processes.gather(flags).bool()
        return EveryRetry(
            [group for group, _ in pairs],
            [source for _, source in pairs],
            processes.gather(chosen.r1),
            processes.gather(r2),
            flags[:, 0].tolist(),
            flags[:, 1].tolist(),
        )

    def _credit(self, processes, plan: Plan, every: EveryRetry) -> tuple[list, list]:
        """(reflection advantages, retry advantages) of this process's rows.

        A reflection is credited among its prompt's reflections (`_reflection_credit`). The
        retries of a reflection that serves several are credited among themselves
        (`retry_advantages` over every process's retries, grouped by reflection); a retry
        that is its reflection's only one gets its reflection's advantage, so that with
        `reflections_per_group` 0 a reflection and its retry are credited alike, within
        their prompt's group, as in the ERL paper."""
        scale = self.settings.scale_rewards != "none"
        served = Counter(source for source in every.sources if source >= 0)
        shared = None
        if any(count > 1 for count in served.values()):
            shared = self.retry_advantages(every.groups, every.r1, every.r2, every.scored, scale)
        reflections = self._reflection_credit(plan, every, scale)
        retries = [
            shared[j] if served[source] > 1 else reflections[source] if source >= 0 else 0.0
            for j, source in enumerate(every.sources)
        ]
        width, count = len(plan.reflecting.index), len(plan.groups)
        mine = slice(processes.index * width, (processes.index + 1) * width)
        return reflections[mine], retries[processes.index * count : (processes.index + 1) * count]

    def _reflection_credit(self, plan: Plan, every: EveryRetry, scale) -> list[float]:
        """The hook over every process's reflections, grouped by prompt, each a row with r1 =
        the mean r1 of the attempts that retried with it and r2 = the mean r2 of its scored
        retries, so a reflection is judged by what its retries gained (one with no scored
        retry carries nothing; a lone one in its group: mean r2 - mean r1)."""
        r1s: dict[int, list[float]] = defaultdict(list)
        r2s: dict[int, list[float]] = defaultdict(list)
        for source, r1, r2, ok in zip(
            every.sources, every.r1.tolist(), every.r2.tolist(), every.scored
        ):
            if source >= 0:  # a filler retry read no reflection
                r1s[source].append(r1)
                if ok:
                    r2s[source].append(r2)
        positions = range(len(plan.reflection_groups))
        return list(
            self.retry_advantages(
                [group or "" for group in plan.reflection_groups],
                _means([r1s[p] for p in positions], every.r1),
                _means([r2s[p] for p in positions], every.r1),
                [
                    group is not None and bool(r2s[p])
                    for p, group in enumerate(plan.reflection_groups)
                ],
                scale,
            )
        )

    # ---- Remember: every process applies the same records and offers in the same order.

    def _remember(self, processes, plan: Plan, lessons, shown, every, step: int) -> None:
        """Apply every process's records (which entries a reflection read, and whether a retry
        with it succeeded), then offer the reflections a retry succeeded with, once each, in
        process order everywhere."""
        succeeded = {source for source, ok in zip(every.sources, every.success) if ok}
        start = processes.index * len(lessons)
        worked = [start + slot in succeeded for slot in range(len(lessons))]
        reflecting = plan.reflecting
        records = [
            ([e.order for e in entries], ok)
            for entries, ok, valid in zip(shown, worked, reflecting.valid)
            if valid and entries
        ]
        offers = [
            (text, lesson) for text, lesson, ok in zip(reflecting.texts, lessons, worked) if ok
        ]
        for orders, ok in processes.gather_object(records):
            self.memory.record(orders, ok)
        for text, lesson in processes.gather_object(offers):
            self.memory.add(text, lesson, step=step)

    # ---- New rows: reflections and retries (filler rows stay inert, so every process keeps
    # the same row count), then internalization.

    def _internalized(self, r2, scored, success) -> list[tuple[int, float]]:
        """(retry, advantage) of each internalization row: every successful retry, at
        `internalization_coef` (the bench's ablations override this)."""
        s = self.settings
        if not (s.enable_internalization and s.internalization_coef > 0):
            return []
        return [(i, s.internalization_coef) for i, ok in enumerate(success) if ok]

    def _new_rows(self, backend, plan, chosen, reflections, retries, advantages, kept) -> NewRows:
        for_reflections, for_retries = advantages
        tried = retries.generated
        rows = NewRows(
            tried.prompt_ids,
            tried.completion_ids,
            list(for_retries),
            list(chosen.valid),
            backend.trainable(tried.completion_ids),
            list(tried.logprobs),
            list(retries.tool_masks),
        )
        if reflections is not None:  # the reflections' rows come first, then the retries'
            reflection_rows = NewRows(
                reflections.prompt_ids,
                reflections.completion_ids,
                list(for_reflections),
                list(plan.reflecting.valid),
                backend.trainable(reflections.completion_ids),
                list(reflections.logprobs),
            )
            reflection_rows.extend(rows)
            rows = reflection_rows
        if kept:
            kept, weights = [i for i, _ in kept], [a for _, a in kept]
            kept_ids = [tried.completion_ids[i] for i in kept]
            # The retry's trajectory under the task's own prompt (an episode's, its tool
            # results still masked). Not sampled from that prompt: no sampling log-probs
            # (ratio 1, exact CE).
            rows.extend(
                NewRows(
                    backend.tokenize(
                        [retries.prompts[i] for i in kept], [chosen.rows[i] for i in kept]
                    ),
                    kept_ids,
                    weights,
                    [True] * len(kept),
                    backend.trainable(kept_ids),
                    tool_masks=[retries.tool_masks[i] for i in kept],
                )
            )
        return rows

    # ---- Metrics over every process.

    def _metrics(self, backend, plan, r2, valid, success, internalized, rows) -> dict[str, float]:
        """The retries' `erl/` metrics over every process, and the stage's tally (a reflection
        may serve several retries, so `erl/retries` counts the scored ones apart)."""
        processes = backend.processes
        mask = torch.tensor(valid, device=r2.device) & ~torch.isnan(r2)
        stats = torch.tensor(
            [
                r2[mask].sum().item(),
                mask.sum().item(),
                float(sum(success)),
                float(internalized),
                float(sum(plan.reflecting.valid) if self.settings.enable_reflection else 0),
            ],
            device=r2.device,
        )
        total_r2, gated, successes, total_internalized, written = processes.sum(stats).tolist()
        metrics = {
            "erl/r2_mean": total_r2 / max(gated, 1.0),
            "erl/retry_success_rate": successes / max(gated, 1.0),
            "erl/internalization_rows": total_internalized,
            "erl/reflections": written,
        }
        metrics["erl/retries"] = gated
        if total_internalized:
            metrics["erl/internalization_loss"] = self._internalization_loss(
                backend, rows, internalized, r2.device
            )
        self.tally["reflections"] += int(written)
        for outcome, count in self.memory.pop_outcomes().items():
            metrics[f"erl/memory_{outcome}"] = float(count)
            self.tally[outcome] += count
        return {k: v for k, v in metrics.items() if v is not None}

    def _internalization_loss(self, backend, rows, internalized, device) -> float | None:
        """coef x the mean token NLL of the internalization rows, over every process.

        A metric-only forward, decided from the global count: a forward on some processes
        and not others would hang sharded (FSDP/ZeRO-3) training. A process without
        internalization rows scores one of its other rows, counted for nothing."""
        count = max(internalized, 1)
        masks = rows.tool_masks[-count:]
        nll = backend.mean_token_nll(rows.prompt_ids[-count:], rows.completion_ids[-count:], masks)
        tokens = 0
        if internalized:  # the model's own tokens, as the NLL counts them
            tokens = sum(
                len(ids) if mask is None else sum(mask)
                for ids, mask in zip(rows.completion_ids[-count:], masks)
            )
        if nll is None:
            nll, tokens = 0.0, 0
        total, all_tokens = backend.processes.sum(
            torch.tensor([nll * tokens, float(tokens)], device=device)
        ).tolist()
        return total / all_tokens * self.settings.internalization_coef if all_tokens else None


def _row_fields(row: dict) -> dict:
    """What a record says of its dataset row: task, level and prompt (the rest is answer)."""
    return {key: row[key] for key in ("task", "level", "prompt") if key in row}


def _feedback_of(rows: Gated, chosen: Gated, feedback: list[str]) -> list[str]:
    """The feedback of `rows` (a subset of `chosen`'s first attempts) from `chosen`'s
    `feedback`; a filler row gets the stock line (it is masked out)."""
    by_attempt = {i: text for i, ok, text in zip(chosen.index, chosen.valid, feedback) if ok}
    return [by_attempt[i] if ok else NO_FEEDBACK for i, ok in zip(rows.index, rows.valid)]


def _means(values: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """The mean of each list (0 for an empty one, which the caller marks not valid)."""
    return torch.tensor(
        [sum(v) / len(v) if v else 0.0 for v in values], dtype=like.dtype, device=like.device
    )


def _global_sum(processes, count: int, like: torch.Tensor) -> float:
    """`count` summed over processes."""
    return float(processes.sum(torch.tensor([float(count)], device=like.device)).item())
