"""`ERLConfig`: GRPOConfig plus the Experiential RL settings."""

from __future__ import annotations

import dataclasses
import math
import string
import warnings
from dataclasses import dataclass, field
from typing import Any

from pipeline.erl.memory import MEMORY_SCOPES
from pipeline.erl.prompts import (
    DEFAULT_REFLECTION_PROMPT,
    DEFAULT_RETRY_PROMPT,
    REFLECTION_PLACEHOLDERS,
    RETRY_PLACEHOLDERS,
)
from pipeline.erl.step import REFLECTION_ADVANTAGES, RETRY_ADVANTAGES
from pipeline.models.backend import activate_backend

activate_backend()  # before trl: on a GPU, Unsloth rebinds trl.GRPOConfig / trl.GRPOTrainer

from trl import GRPOConfig  # noqa: E402

LOSS_NORMALIZATIONS = ("merged", "per_part")
# Losses whose normaliser is the global token count and that are linear in the advantage
# (positive scaling commutes with DAPO's clipping), so scaling a part's advantages by
# (merged tokens / part tokens) is exactly normalising that part over its own tokens.
PER_PART_LOSSES = ("dapo", "cispo")


def template_fields(template: str) -> set[str]:
    """The `{placeholder}` names used in a str.format template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


@dataclass(init=False)
class ERLConfig(GRPOConfig):
    """GRPOConfig plus the Experiential RL settings (see docs/erl.md, "The ERL step").

    The base config's own `__init__` builds everything but ERL's fields, so ERLConfig holds
    exactly what `GRPOConfig(...)` would for the same options: with Unsloth's trainer, that
    is Unsloth's config and its adjustments (learning-rate default, vLLM settings, ...).
    """

    reward_threshold: float = field(
        default=1.0,
        metadata={
            "help": "Gating threshold: first attempts with reward r1 below it reflect and retry."
        },
    )
    memory_size: int = field(
        default=50,
        metadata={"help": "Most successful reflections kept in the cross-episode memory (FIFO)."},
    )
    memory_top_k: int = field(
        default=3,
        metadata={
            "help": "Stored reflections retrieved (most relevant first) per reflection prompt."
        },
    )
    reflection_system_prompt: str = field(
        default=DEFAULT_REFLECTION_PROMPT,
        metadata={
            "help": "Reflection template; placeholders {prompt} {attempt} {feedback} {reward} {memory}."
        },
    )
    retry_system_prompt: str = field(
        default=DEFAULT_RETRY_PROMPT,
        metadata={"help": "Retry template; placeholders {prompt} {reflection}."},
    )
    internalization_coef: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the internalization loss (CE on original prompt -> successful retry)."
        },
    )
    enable_memory: bool = field(
        default=True, metadata={"help": "Use the cross-episode reflection memory."}
    )
    enable_reflection: bool = field(
        default=True,
        metadata={
            "help": "Write a reflection before the retry. False (an ablation): the retry reads "
            "the raw feedback in the retry template's {reflection} slot, no reflection rows are "
            "trained, and nothing enters the memory."
        },
    )
    enable_internalization: bool = field(
        default=True,
        metadata={"help": "Distil successful retries into answers to the original prompt."},
    )
    train_retries: bool = field(
        default=True,
        metadata={
            "help": "Train the reflection and retry rows with the retry advantage. False: they "
            "stay in the batch inert, and only supply the memory and the internalized answers "
            "(the first attempts and internalization are then all the loss sees)."
        },
    )
    retry_advantage: str = field(
        default="group",
        metadata={
            "help": "Advantage of reflection and retry rows. 'group': r2 normalised among the "
            "retries of the same prompt (a lone retry: r2 - r1). 'improvement': r2 - r1 for "
            "every retry, so retries that all succeed are still reinforced."
        },
    )
    loss_normalization: str = field(
        default="merged",
        metadata={
            "help": "How the merged batch's loss weighs its parts (first attempts; reflections "
            "and retries; internalization). 'merged': one DAPO loss over every token of the "
            "merged batch, so each part weighs by its share of the tokens. 'per_part': each "
            "part normalised over its own tokens, as if trained alone: first attempts exactly "
            "as GRPO would, plus the retry loss, plus internalization_coef times the mean "
            "token cross-entropy. Needs loss_type 'dapo' or 'cispo'; with beta > 0 the KL term "
            "stays a mean over all trained tokens."
        },
    )
    # Default measured (docs/log.md, "memory_scope and loss_normalization"): other problems'
    # lessons were copied into reflections and cut retry success from ~0.20 to ~0.07.
    memory_scope: str = field(
        default="same_prompt",
        metadata={
            "help": "Which stored reflections a reflection prompt retrieves. 'same_prompt': only "
            "reflections written for this very prompt (from earlier epochs), newest first, so "
            "lessons specific to another problem never reach it. 'similar': the memory_top_k "
            "most lexically similar prompts' reflections (other problems' too). 'global': the "
            "ERL paper's rulebook, the latest reflection whose retry succeeded, shown to every "
            "reflection whatever its prompt (for tasks whose lessons carry over)."
        },
    )
    # What the memory keeps, how reflections are credited, and how many are written (issue
    # 27). All off by default; docs/results.md has what each measured on the learning bench.
    memory_lessons_only: bool = field(
        default=False,
        metadata={
            "help": "Refuse a reflection that is no lesson: empty, an answer in the answer "
            "format, a copy of the prompt, or one term repeated (pipeline/erl/memory.py, "
            "lesson_problem). False: whatever preceded a successful retry is stored."
        },
    )
    memory_confirmations: bool = field(
        default=False,
        metadata={
            "help": "Keep each memory entry's record of the retries that read it: a full memory "
            "evicts its weakest entry, and the global rulebook shows each reflection the entry "
            "of the highest Beta draw from that record, so a lesson keeps its place while its "
            "readers succeed. False: a FIFO, and the rulebook is the newest entry."
        },
    )
    memory_min_gain: float = field(
        default=0.0,
        metadata={
            "help": "A reflection enters the memory only when its retry's reward beats the mean "
            "first-attempt reward of its prompt (what the prompt does without it) by at least "
            "this much. 0: any successful retry's reflection (it costs no generation)."
        },
    )
    reflections_per_attempt: int = field(
        default=1,
        metadata={
            "help": "Reflections (each with its own retry) per failed first attempt. With 2 or "
            "more, reflection_advantage 'siblings' credits each reflection against the others "
            "on the same attempt."
        },
    )
    reflection_advantage: str = field(
        default="retry",
        metadata={
            "help": "Advantage of a reflection's tokens. 'retry': its retry's advantage. "
            "'siblings': its retry's reward minus a baseline its own text does not move: the "
            "mean reward of the retries of the other reflections on the same failed attempt "
            "(reflections_per_attempt >= 2), else the mean first-attempt reward of its prompt."
        },
    )
    reflect_per_group: int = field(
        default=0,
        metadata={
            "help": "At most this many failed first attempts of one prompt's group reflect and "
            "retry (the first ones, in the batch's order); the others are trained as GRPO's "
            "first attempts only. 0: every failed attempt."
        },
    )
    reuse_lessons: bool = field(
        default=False,
        metadata={
            "help": "When the memory holds a confirmed lesson for the prompt (the strongest "
            "entry its scope shows, whose record holds at least 3 successful retries, the "
            "admitting one included, and no more failures than successes), retry with it "
            "directly: no reflection is written. Needs memory_confirmations."
        },
    )
    # Bytes, not the reflection memory: the peak of ERL's extra calls against GRPO's.
    peak_memory_factor: float = field(
        default=1.5,
        metadata={
            "help": "The most memory a reflection or retry generate call, or a loss forward of "
            "the merged batch, may take, as a multiple of one loss forward of GRPO's own batch "
            "(where a GRPO step peaks), planned from what the backend's loss forward is "
            "measured to hold on the first merged batches (pipeline/erl/budget.py). Larger: "
            "fewer, wider calls. Under vLLM generation is one call per phase."
        },
    )
    memory_budget: float | None = field(
        default=None,
        metadata={"help": "Deprecated: the old name of peak_memory_factor."},
    )
    reflection_max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Max tokens of a reflection (default: max_completion_length). Retries use "
            "max_completion_length, since they are trained as answers to the original prompt."
        },
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ERL's fields are set first: the base __init__ ends by calling __post_init__.
        for f in _erl_fields():
            setattr(self, f.name, kwargs.pop(f.name, f.default))
        GRPOConfig.__init__(self, *args, **kwargs)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.reward_threshold):
            raise ValueError(f"reward_threshold must be finite, got {self.reward_threshold}")
        for name in ("memory_size", "memory_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (math.isfinite(self.internalization_coef) and self.internalization_coef >= 0):
            raise ValueError(
                f"internalization_coef must be a finite number >= 0, got {self.internalization_coef}"
            )
        if self.retry_advantage not in RETRY_ADVANTAGES:
            raise ValueError(
                f"retry_advantage must be one of {list(RETRY_ADVANTAGES)}, got {self.retry_advantage!r}"
            )
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"loss_normalization must be one of {list(LOSS_NORMALIZATIONS)}, got "
                f"{self.loss_normalization!r}"
            )
        if self.loss_normalization == "per_part" and self.loss_type not in PER_PART_LOSSES:
            raise ValueError(
                f"loss_normalization='per_part' needs loss_type in {list(PER_PART_LOSSES)}, got "
                f"loss_type={self.loss_type!r} (its normaliser is not the global token count); "
                "use loss_normalization='merged'"
            )
        if self.memory_scope not in MEMORY_SCOPES:
            raise ValueError(
                f"memory_scope must be one of {list(MEMORY_SCOPES)}, got {self.memory_scope!r}"
            )
        if not (math.isfinite(self.memory_min_gain) and self.memory_min_gain >= 0):
            raise ValueError(
                f"memory_min_gain must be a finite number >= 0, got {self.memory_min_gain}"
            )
        if self.reflections_per_attempt < 1:
            raise ValueError(
                f"reflections_per_attempt must be >= 1, got {self.reflections_per_attempt}"
            )
        if self.reflect_per_group < 0:
            raise ValueError(f"reflect_per_group must be >= 0, got {self.reflect_per_group}")
        if self.reflection_advantage not in REFLECTION_ADVANTAGES:
            raise ValueError(
                f"reflection_advantage must be one of {list(REFLECTION_ADVANTAGES)}, got "
                f"{self.reflection_advantage!r}"
            )
        if self.reuse_lessons and not self.memory_confirmations:
            raise ValueError(
                "reuse_lessons=True needs memory_confirmations=True: a lesson is confirmed by "
                "the record that option keeps"
            )
        if self.memory_budget is not None:
            warnings.warn(
                "ERLConfig option memory_budget is deprecated: use peak_memory_factor (the "
                f"same meaning); peak_memory_factor={self.memory_budget} is used",
                FutureWarning,
                stacklevel=3,
            )
            self.peak_memory_factor, self.memory_budget = self.memory_budget, None
        if not (math.isfinite(self.peak_memory_factor) and self.peak_memory_factor > 0):
            raise ValueError(
                f"peak_memory_factor must be a finite number > 0, got {self.peak_memory_factor}"
            )
        if (
            self.reflection_max_completion_length is not None
            and self.reflection_max_completion_length < 1
        ):
            raise ValueError(
                f"reflection_max_completion_length must be >= 1, got {self.reflection_max_completion_length}"
            )
        for name, allowed in (
            ("reflection_system_prompt", REFLECTION_PLACEHOLDERS),
            ("retry_system_prompt", RETRY_PLACEHOLDERS),
        ):
            try:
                used = template_fields(getattr(self, name))
            except ValueError as err:  # e.g. a lone "{"
                raise ValueError(f"{name} is not a valid template: {err}") from err
            unknown = sorted(used - set(allowed))
            if unknown:
                raise ValueError(
                    f"{name} uses unknown placeholder(s) {unknown}; allowed: {list(allowed)} "
                    "(write literal braces as {{ and }})"
                )
            # Format once with values of the types the trainer passes ({reward} is a float),
            # so that a bad format spec fails here rather than at the first gated batch.
            try:
                getattr(self, name).format(
                    **{key: 0.0 if key == "reward" else "" for key in allowed}
                )
            except (ValueError, IndexError, KeyError) as err:
                raise ValueError(f"{name} cannot be formatted: {err}") from err


def _erl_fields() -> list[dataclasses.Field]:
    """The fields ERLConfig adds to GRPOConfig (all have plain defaults)."""
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [f for f in dataclasses.fields(ERLConfig) if f.name not in base]
