"""What ERLTrainer cannot train, refused in one line before the base trainer is built."""

from __future__ import annotations

import os

from pipeline.erl.config import ERLConfig
from pipeline.erl.memory import ReflectionMemory
from pipeline.erl.step import refuse_feedback_method
from pipeline.models.backend import unsloth_trainer_active

# Unsloth options that add batch keys (sample weights, rollout log-probs as old) that ERL's
# rows would have to carry; refused up front rather than at the first gated batch.
UNSLOTH_BATCH_OPTIONS = (
    "UNSLOTH_GRPO_ZERO_VARIANCE_EXCLUDE",
    "UNSLOTH_GRPO_LOSS_AGGREGATION",
    "UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD",
)


def refuse_unsupported(model, args, feedback_func, memory, kwargs: dict) -> None:
    """What ERLTrainer cannot train, refused before the base trainer is built."""
    if not isinstance(args, ERLConfig):
        raise TypeError(
            f"ERLTrainer needs args=ERLConfig(...), got {type(args).__name__}; "
            "ERLConfig takes every GRPOConfig option plus the ERL ones"
        )
    if feedback_func is not None and not callable(feedback_func):
        raise TypeError(f"feedback_func must be callable, got {type(feedback_func).__name__}")
    if memory is not None and not isinstance(memory, ReflectionMemory):
        raise TypeError(f"memory must be a ReflectionMemory, got {type(memory).__name__}")
    disagreement = memory.disagreement(args) if memory is not None else None
    if disagreement is not None:
        raise ValueError(
            f"memory= disagrees with args on {disagreement}: build it with "
            "ReflectionMemory.from_config(args, ...) or set the same options in ERLConfig"
        )
    if "select_reflecting" in kwargs:
        raise TypeError(
            "ERLTrainer's select_reflecting= hook was removed: ERLConfig.reflections_per_group "
            "chooses which gated first attempts reflect"
        )
    if kwargs.get("rollout_func") is not None:
        raise ValueError(
            "ERLTrainer does not support rollout_func=: a retry is a fresh episode of the same "
            "row with the reflection in its prompt, which ERL cannot start inside a rollout "
            "function that owns its prompts' rendering and its environments; use "
            "environment_factory= or tools= (docs/erl.md, 'Agents')"
        )
    if unsloth_trainer_active():
        if isinstance(model, str):
            raise TypeError(
                "Unsloth's GRPOTrainer needs a loaded model, not a path: load it with "
                "pipeline.models.loading.load_policy or unsloth.FastLanguageModel"
            )
        enabled = [
            name
            for name in UNSLOTH_BATCH_OPTIONS
            if os.environ.get(name, "").strip() not in ("", "0")
        ]
        if enabled:
            raise ValueError(
                f"ERLTrainer does not support {', '.join(enabled)} (Unsloth adds batch keys "
                "for it that ERL's reflection and retry rows do not carry); unset it"
            )


def refuse_feedback_methods(pools: dict) -> None:
    """An environment's feedback is read from a `feedback` property (`refuse_feedback_method`)."""
    for instances in pools.values():
        refuse_feedback_method(type(instances[0]))
