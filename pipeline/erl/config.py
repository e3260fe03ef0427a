"""`ERLConfig`: GRPOConfig plus the Experiential RL settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.erl.memory import MEMORY_SCOPES
from pipeline.erl.prompts import (
    DEFAULT_REFLECTION_PROMPT,
    DEFAULT_RETRY_PROMPT,
    REFLECTION_PLACEHOLDERS,
    RETRY_PLACEHOLDERS,
    template_fields,
)
from pipeline.models.backend import activate_backend

activate_backend()  # before trl: on a GPU, Unsloth rebinds trl.GRPOConfig / trl.GRPOTrainer

from trl import GRPOConfig  # noqa: E402

_NOTHING = "removed: it measured nothing on the learning bench (docs/log.md, 2026-12-02)"
_MEMORY = "moved to the memory: ERLTrainer(memory=ReflectionMemory.from_config(args, {}=True))"
# Options ERLConfig had, with the value that behaves as today's ERLConfig, and what became of
# them. An old recipe or run_config.json naming one is refused in one line (pipeline.run), but
# a resumed run whose value was that default continues: it trained as today's code does.
REMOVED_OPTIONS: dict[str, tuple[Any, str]] = {
    "train_retries": (True, _NOTHING),
    "retry_advantage": (
        "group",
        _NOTHING + "; a credit of your own: ERLTrainer(retry_advantages=...)",
    ),
    "loss_normalization": ("merged", _NOTHING),
    "memory_lessons_only": (False, _MEMORY.format("lessons_only")),
    "memory_confirmations": (False, _MEMORY.format("confirmations")),
    "memory_min_gain": (0.0, _NOTHING),
    "reflections_per_attempt": (1, _NOTHING),
    "reflection_advantage": ("retry", _NOTHING),
    "reflect_per_group": (
        0,
        "removed: reflections_per_group chooses who reflects (one reflection per group "
        "since issue 32; its bench arm erl_per_group measured one retry per reflection, "
        "docs/log.md)",
    ),
    "reuse_lessons": (False, _NOTHING),
    "memory_budget": (None, "renamed: use peak_memory_factor (the same meaning)"),
}


def removed_option_message(name: str) -> str:
    """Why ERLConfig option `name` is refused: what replaced it, or that it measured nothing."""
    return f"ERLConfig option {name} was {REMOVED_OPTIONS[name][1]}"


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
        metadata={
            "help": "Retry template; placeholders {prompt} {reflection} {feedback} (the "
            "feedback on the retry's own first attempt)."
        },
    )
    internalization_coef: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the internalization loss (CE on original prompt -> successful retry)."
        },
    )
    enable_reflection: bool = field(
        default=True,
        metadata={
            "help": "False: no reflection is written; every gated first attempt retries with "
            "its own feedback, in the retry template's {feedback} (its {reflection} left empty) "
            "or, where the template has no {feedback}, in its {reflection}; successful retries are "
            "internalized as usual (the raw-feedback baseline: is a reflection worth its "
            "tokens?). The memory and reflections_per_group are then not used."
        },
    )
    enable_memory: bool = field(
        default=True, metadata={"help": "Use the cross-episode reflection memory."}
    )
    enable_internalization: bool = field(
        default=True,
        metadata={"help": "Distil successful retries into answers to the original prompt."},
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
    reflection_max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Max tokens of a reflection (default: max_completion_length). Retries use "
            "max_completion_length, since they are trained as answers to the original prompt."
        },
    )
    reflection_attempt_max_chars: int = field(
        default=4000,
        metadata={
            "help": "Most characters of the first attempt a reflection prompt shows (an "
            "episode: every turn, tool call and tool result). A longer one keeps its first "
            "quarter and its end, the cut's length written where it was cut, and is counted "
            "in the erl/attempts_cut metric."
        },
    )

    # Default measured (docs/results.md, "The hidden rule: ERL at its paper's budget"): on the
    # learning bench k = 1 (`erl_shared`) beat per-attempt reflection (`erl`, k = 0) at
    # equal steps, generated and processed tokens, and one retry per reflection too.
    reflections_per_group: int = field(
        default=1,
        metadata={
            "help": "0: every gated first attempt writes its own reflection and retries with "
            "it. k >= 1: in each prompt's group (over every process) the first k gated "
            "attempts reflect, and every gated attempt retries, the i-th with the group's "
            "reflection i mod k. Each reflection is credited by its retries' mean r2 against "
            "its attempts' mean r1 within the group; the retries of a reflection that serves "
            "several among themselves, a reflection's only retry as its reflection."
        },
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name in REMOVED_OPTIONS:
                raise ValueError(removed_option_message(name))
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
        for name, strict in (("internalization_coef", False), ("peak_memory_factor", True)):
            value = getattr(self, name)
            if not (math.isfinite(value) and (value > 0 if strict else value >= 0)):
                raise ValueError(
                    f"{name} must be a finite number {'>' if strict else '>='} 0, got {value}"
                )
        if self.memory_scope not in MEMORY_SCOPES:
            raise ValueError(
                f"memory_scope must be one of {list(MEMORY_SCOPES)}, got {self.memory_scope!r}"
            )
        shared = self.reflections_per_group
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise ValueError(f"reflections_per_group must be an integer >= 0, got {shared!r}")
        length = self.reflection_max_completion_length
        if length is not None and length < 1:
            raise ValueError(f"reflection_max_completion_length must be >= 1, got {length}")
        chars = self.reflection_attempt_max_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
            raise ValueError(f"reflection_attempt_max_chars must be an integer >= 1, got {chars!r}")
        for name, allowed in (
            ("reflection_system_prompt", REFLECTION_PLACEHOLDERS),
            ("retry_system_prompt", RETRY_PLACEHOLDERS),
        ):
            _check_template(name, getattr(self, name), allowed)


def _check_template(name: str, template: str, allowed: tuple[str, ...]) -> None:
    """Refuse a template with an unknown placeholder, or one that cannot be formatted."""
    try:
        used = template_fields(template)
    except ValueError as err:  # e.g. a lone "{"
        raise ValueError(f"{name} is not a valid template: {err}") from err
    unknown = sorted(used - set(allowed))
    if unknown:
        raise ValueError(
            f"{name} uses unknown placeholder(s) {unknown}; allowed: {list(allowed)} "
            "(write literal braces as {{ and }})"
        )
    # Format once with values of the types the trainer passes ({reward} is a float), so that
    # a bad format spec fails here rather than at the first gated batch.
    try:
        template.format(**{key: 0.0 if key == "reward" else "" for key in allowed})
    except (ValueError, IndexError, KeyError) as err:
        raise ValueError(f"{name} cannot be formatted: {err}") from err


def _erl_fields() -> list[dataclasses.Field]:
    """The fields ERLConfig adds to GRPOConfig (all have plain defaults)."""
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [f for f in dataclasses.fields(ERLConfig) if f.name not in base]
