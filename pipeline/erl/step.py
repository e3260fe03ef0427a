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
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from pipeline.erl.memory import ReflectionMemory
from pipeline.erl.prompts import (
    as_completion,
    memory_text,
    prompt_text,
    reflection_prompt,
    retry_prompt,
)
from rewards import completion_text

RETRY_ADVANTAGES = ("group", "improvement")
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


class ERLStep:
    """Gate, feedback, reflection, retry, credit, memory and internalization for one
    generation batch (see the module docstring). Every process of a run calls it once per
    batch, in step: it pads its gated rows to the global count with masked copies, and the
    memory gets the same reflections in the same order everywhere."""

    def __init__(
        self,
        settings: StepSettings,
        memory: ReflectionMemory,
        retry_advantages: RetryAdvantages = retry_advantages,
    ) -> None:
        self.settings = settings
        self.memory = memory
        self.retry_advantages = retry_advantages

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
        counts = processes.gather(torch.tensor([len(gated)], device=r1.device))
        metrics = {
            "erl/r1_mean": torch.nanmean(all_r1).item(),
            "erl/gated_fraction": counts.sum().item() / all_r1.numel(),
        }
        rows = None
        if counts.max().item() > 0:
            rows = self._experience(backend, first, gated, int(counts.max().item()), step, metrics)
        else:
            metrics["erl/internalization_rows"] = 0.0
        metrics["erl/memory_size"] = float(len(self.memory))
        return StepResult(rows, metrics)

    def _experience(self, backend, first, gated, pad_to, step, metrics) -> NewRows:
        """Phases 2-7 for the `gated` rows, padded to `pad_to` rows with masked copies (every
        process must score as many rows: the reward gather needs it)."""
        s, processes = self.settings, backend.processes
        valid = [True] * len(gated) + [False] * (pad_to - len(gated))
        idx = gated + [gated[0] if gated else 0] * (pad_to - len(gated))
        rows = [first.rows[i] for i in idx]
        prompts = [first.prompts[i] for i in idx]
        r1 = first.rewards[idx]
        feedback = backend.feedback(
            rows,
            prompts,
            [first.completions[i] for i in idx],
            [first.completion_ids[i] for i in idx],
        )

        texts = [prompt_text(p) for p in prompts]
        if s.enable_reflection:
            reflection_prompts = [
                reflection_prompt(
                    prompts[j],
                    s.reflection_system_prompt,
                    attempt=completion_text(first.completions[i]),
                    feedback=feedback[j],
                    reward=r1[j].item(),
                    memory=self.memory_for(texts[j]),
                )
                for j, i in enumerate(idx)
            ]
            length = s.reflection_max_completion_length or s.max_completion_length
            reflections = backend.generate(reflection_prompts, length)
            lessons = [text.strip() for text in reflections.texts]
        else:  # the ablation: the retry reads the raw feedback where the reflection would be
            reflections, lessons = None, [f.strip() for f in feedback]

        retry_prompts = [
            retry_prompt(p, s.retry_system_prompt, lesson) for p, lesson in zip(prompts, lessons)
        ]
        retries = backend.generate(retry_prompts, s.max_completion_length)
        # r2: the reward functions score y2 against the original row (answer/metadata
        # columns); `attempt` tells them (and their logs) that these are retries.
        r2 = backend.score(
            [{**row, "attempt": 2} for row in rows],
            prompts,
            [as_completion(p, text) for p, text in zip(prompts, retries.texts)],
            retries.completion_ids,
        )

        # A retry no reward function could score (all None -> NaN) carries no signal, as in GRPO.
        scored = [v and r == r for v, r in zip(valid, r2.tolist())]
        advantages = self._credit(processes, prompts, r1, r2, scored)
        success = [
            v and reaches_threshold(r, s.reward_threshold) for v, r in zip(scored, r2.tolist())
        ]
        if s.enable_reflection:  # without one there is no lesson to store
            self._remember(
                processes, [(texts[j], lessons[j]) for j in range(len(idx)) if success[j]], step
            )

        # Untrained retries stay as inert rows: every process keeps the same row count.
        trained = list(valid) if s.train_retries else [False] * len(valid)
        new_rows = NewRows([], [], [], [], [])
        for generated in (reflections, retries):
            if generated is not None:
                new_rows.extend(
                    NewRows(
                        generated.prompt_ids,
                        generated.completion_ids,
                        list(advantages),
                        list(trained),
                        backend.trainable(generated.completion_ids),
                        list(generated.logprobs),
                        parts=[PART_RETRY] * len(idx),
                    )
                )
        internalize = s.enable_internalization and s.internalization_coef > 0
        kept = [j for j in range(len(idx)) if success[j]] if internalize else []
        if kept:
            kept_ids = [retries.completion_ids[j] for j in kept]
            # Not sampled from the original prompt: no sampling log-probs (ratio 1, exact CE).
            new_rows.extend(
                NewRows(
                    backend.tokenize([prompts[j] for j in kept]),
                    kept_ids,
                    [s.internalization_coef] * len(kept),
                    [True] * len(kept),
                    backend.trainable(kept_ids),
                    parts=[PART_INTERNALIZATION] * len(kept),
                )
            )
        metrics.update(self._metrics(backend, r2, valid, success, len(kept), new_rows))
        return new_rows

    def _credit(self, processes, prompts, r1, r2, valid) -> list[float]:
        """`retry_advantages` over the retries of every process, sliced back to this one's.

        GRPO's sampler gives each process a contiguous slice of the generation batch, so one
        prompt's generations (and its retries) can live on several processes; like GRPO for
        r1, gather the group keys, r1, r2 and validity and credit all of them. Every process
        holds the same number of rows here (padded to the global maximum)."""
        groups = [json.dumps(p, sort_keys=True, default=str) for p in prompts]
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

    def memory_for(self, text: str) -> str:
        """The `{memory}` of a reflection prompt: the stored reflections `memory_scope` picks."""
        s = self.settings
        if not s.enable_memory:
            return memory_text([])
        return memory_text(self.memory.retrieve(text, s.memory_top_k, s.memory_scope))

    def _remember(self, processes, successes: list[tuple[str, str]], step: int) -> None:
        """Add successful reflections; every process adds the same ones in the same order."""
        if not self.settings.enable_memory:
            return
        for text, reflection in processes.gather_object(successes):
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
