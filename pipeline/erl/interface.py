"""The ERL step's interface: what goes in (`FirstAttempts`), what comes out (`NewRows`,
`StepResult`), and what it needs from the trainer it runs in (`StepBackend`, `Processes`,
`StepSettings`). `pipeline.erl.step` is written against it; `pipeline.erl.trainer`
implements it over TRL's GRPOTrainer, and tests over plain functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

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
    # One per row after its episode (TRL's environment_factory), else None.
    environments: list | None = None


@dataclass(frozen=True)
class Generated:
    """One sample per prompt: prompt and completion ids, the decoded completions, and the
    sampler's per-token log-probs of each (None where the generator reports none)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]
    logprobs: list[list[float] | None]


@dataclass(frozen=True)
class Attempts:
    """One attempt at each row's task (the retries). `generated` holds the tokens the
    policy trains on; an episode's completion ids run through every turn, tool results
    included, and `tool_masks` says which tokens are the model's (1) and which a tool's
    (0; None: all the model's). `prompts` is the task as the reward functions see it, the
    lesson left out (an episode's: with its environment's reset text); `completions` are
    what they get (an episode: its messages); `environments`, one per row after its
    episode, or None without an environment_factory."""

    generated: Generated
    prompts: list
    completions: list
    tool_masks: list[list[int] | None]
    environments: list | None = None


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
    # Per completion token: 1 the model's own, 0 a tool's result (no loss); None: all 1.
    tool_masks: list[list[int] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.sampling_logps:
            self.sampling_logps = [None] * len(self.valid)
        if not self.tool_masks:
            self.tool_masks = [None] * len(self.valid)

    def extend(self, other: NewRows) -> None:
        """Append `other`'s rows."""
        self.prompt_ids += other.prompt_ids
        self.completion_ids += other.completion_ids
        self.advantages += other.advantages
        self.valid += other.valid
        self.trainable += other.trainable
        self.sampling_logps += other.sampling_logps
        self.tool_masks += other.tool_masks

    def add_filler(self, count: int) -> None:
        """Append `count` inert rows (they only round the row count up)."""
        self.extend(
            NewRows(
                [self.prompt_ids[0]] * count,
                [[]] * count,
                [0.0] * count,
                [False] * count,
                [False] * count,
            )
        )


@dataclass
class StepResult:
    """The rows to merge (None: no process gated a row) and the step's `erl/` metrics,
    already reduced over processes."""

    rows: NewRows | None
    metrics: dict[str, float]
    records: list[dict] = field(default_factory=list)
    """What ERL did, every process's, in process order: one record per reflection and one
    per retry (`pipeline.erl.experience`), for the trainer's experience log."""


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
    # Attempts are episodes (tools or environments): a retry's lesson goes in the system
    # prompt, and `attempt` starts the row's episode afresh.
    episodic: bool

    def generate(self, prompts: list, max_new_tokens: int) -> Generated:
        """One sample per prompt, no tools (every process calls it with as many prompts)."""

    def attempt(self, rows: list[dict], prompts: list) -> Attempts:
        """One attempt at each row's task from `prompts` (the retry prompts): a sample, or
        an episode through the trainer's tool loop, in an environment reset with the row."""

    def score(
        self, rows: list[dict], prompts: list, completions: list, completion_ids, environments=None
    ) -> Any:
        """The weighted reward of each completion against its dataset row: a (n,) tensor,
        NaN where no reward function could score it (every process scores as many rows)."""

    def feedback(
        self, rows: list[dict], prompts: list, completions: list, completion_ids, environments=None
    ):
        """One feedback string per completion (see `call_feedback`)."""

    def tokenize(self, prompts: list, rows: list[dict]) -> list[list[int]]:
        """The token ids the trainer would feed the policy for each prompt of a task's
        row (the tools its row's environment offers shown)."""

    def trainable(self, completion_ids: list[list[int]]) -> list[bool]:
        """Which completions the base trainer would train (it may mask truncated ones)."""

    def mean_token_nll(self, prompt_ids, completion_ids, tool_masks) -> float | None:
        """Mean negative log-likelihood per completion token of the model's own (tool
        results left out) under the policy (a metric; None where the trainer's scorer
        reports none). Every process calls it together."""


class StepSettings(Protocol):
    """The `ERLConfig` options the step reads (the memory's are the memory's own)."""

    reward_threshold: float
    enable_reflection: bool
    enable_internalization: bool
    internalization_coef: float
    scale_rewards: str
    reflection_system_prompt: str
    retry_system_prompt: str
    reflection_max_completion_length: int | None
    reflection_attempt_max_chars: int
    max_completion_length: int
    reflections_per_group: int
