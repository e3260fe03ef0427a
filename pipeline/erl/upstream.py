"""Every hand copy of upstream code ERL relies on, each under a header naming the library
version it follows.

ERLTrainer re-implements these few pieces of TRL and transformers for the rows it adds
(their reward, reference log-probs, masks and importance ratios) and for the micro-batched
loss. On an upgrade of TRL or transformers, compare each with the new release:
tests/test_trl_guard.py pins the versions, the signatures ERL uses, and the upstream lines
each copy follows.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from trl.chat_template_utils import parse_response
from trl.trainer.utils import use_adapter

from curriculum.tasks.agent import environment_tools

# TRL 1.15.0, GRPOTrainer._generate_and_score_completions: the reference log-probs (the
# reference model, else the policy with its adapter off or its "ref" adapter on), and the
# completions `mask_truncated_completions` masks (the last token neither eos nor pad).


def reference_logps(trainer, batch: dict, logps) -> torch.Tensor:
    """Reference-model log-probs of `batch`, obtained the way GRPOTrainer obtains them;
    `logps(model, batch)` scores a batch under a model."""
    if trainer.ref_model is not None:
        return logps(trainer.ref_model, batch)
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return logps(trainer.model, batch)


def trainable_completions(trainer, completion_ids: list[list[int]]) -> list[bool]:
    """The completions GRPO trains: all, less truncated ones when it masks those."""
    if not trainer.mask_truncated_completions:
        return [True] * len(completion_ids)
    ends = {*trainer.eos_token_ids, trainer._tokenizer.pad_token_id}
    return [bool(ids) and ids[-1] in ends for ids in completion_ids]


# TRL 1.15.0, GRPOTrainer._compute_loss (its entropy-bonus block): the adaptive entropy
# controller's step at the optimizer-step boundary.


def adaptive_entropy_step(trainer) -> None:
    """TRL 1.15's adaptive entropy controller step, once per optimizer step, on the entropy
    of the whole accumulation window: every micro-batch added its sums to the window, since
    none ran at the boundary."""
    if trainer._entropy_window_stats is None:
        return
    window = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
    world_entropy = (window[0] / window[1].clamp(min=1.0)).item()
    args = trainer.args
    if world_entropy <= args.entropy_target:
        trainer.entropy_coef = min(
            trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max
        )
    else:
        trainer.entropy_coef = max(
            trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min
        )
    trainer._last_world_entropy = world_entropy
    trainer._entropy_window_stats = None


# TRL 1.15.0, GRPOTrainer.get_high_entropy_mask: the population of loss tokens over
# processes (a -1e9 sentinel pads each process's to one length), its quantile, and the mask.


def entropy_quantile(accelerator, local: torch.Tensor, quantile: float) -> float:
    """The `quantile` of every process's `local` entropies (inf when there are none)."""
    padded = accelerator.pad_across_processes(local.float(), dim=0, pad_index=-1e9)
    gathered = accelerator.gather(padded)
    gathered = gathered[gathered != -1e9]
    if gathered.numel() == 0:
        return math.inf
    return torch.quantile(gathered, quantile).item()


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, threshold: float):
    """The loss tokens whose entropy reaches `threshold` (TRL's mask, given the threshold)."""
    return ((entropies * mask.float()) >= threshold) & mask.bool()


# TRL 1.15.0, GRPOTrainer._generate_and_score_completions: the vLLM importance-sampling
# correction, which ERL computes for the rows it adds.


def importance_sampling_ratio(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL 1.15's vLLM importance-sampling ratio of rows ERL adds: (B, C) for token modes,
    (B, 1) for sequence modes."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


# transformers 5.17.0, Trainer.training_step (and Unsloth's rewrite of it): the factor it
# applies to compute_loss's value before its backward.


def returned_loss_scale(trainer, num_items_in_batch) -> float:
    """The factor Trainer.training_step applies to the returned loss before its backward."""
    if (
        not trainer.model_accepts_loss_kwargs or num_items_in_batch is None
    ) and trainer.compute_loss_func is None:
        return 1.0 / trainer.current_gradient_accumulation_steps
    return 1.0


# TRL 1.15.0, GRPOTrainer._generate_and_score_completions: an episode's environment reset
# with the dataset row (less the routing `environment` field when environments are mixed),
# its text appended to the prompt's last message, and the tools its rollout may call (the
# standalone tools plus the environment's public methods but reset and get_reward).


def reset_arguments(row: dict, multi_environment: bool) -> dict:
    """What `reset(**...)` gets for a dataset row."""
    return {k: v for k, v in row.items() if k != "environment"} if multi_environment else row


def with_observation(prompt: list, observation: Any) -> list:
    """`prompt` with a reset's text appended to its last message (None: as it is); the
    last message is rebuilt, not changed in place."""
    if observation is None:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return prompt[:-1] + [{**prompt[-1], "content": content + observation}]


def rollout_tools(standalone: list, environment: Any) -> tuple[dict, dict]:
    """(sync, async) tools by name for one rollout in `environment` (None: the standalone
    tools only)."""
    methods = environment_tools(environment) if environment is not None else []
    sync, asynchronous = {}, {}
    for tool in [*standalone, *methods]:
        (asynchronous if inspect.iscoroutinefunction(tool) else sync)[tool.__name__] = tool
    return sync, asynchronous


# TRL 1.15.0, GRPOTrainer._tokenize_prompts and _generate: one conversation rendered with
# the tools its rollout may call, and a first turn decoded with `parse_response` (tool
# calls included) where the tokenizer has a response template.


def render_prompt(trainer, prompt: list, tools: list | None) -> list[int]:
    """The token ids GRPOTrainer feeds the policy for a conversational prompt."""
    rendered = trainer.processing_class.apply_chat_template(
        conversation=[prompt],
        tools=tools or None,  # `or None`, as TRL: a Llama template renders tools=[] too
        chat_template=trainer.chat_template,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **trainer.chat_template_kwargs,
    )
    return list(rendered["input_ids"][0])


def first_turns(trainer, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list:
    """Each completion as TRL's tool loop starts from it: a one-message conversation."""
    tokenizer = trainer._tokenizer
    if (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    ):
        return [
            [parse_response(tokenizer, ids, prefix=prompt)]
            for prompt, ids in zip(prompt_ids, completion_ids)
        ]
    texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    return [[{"role": "assistant", "content": text}] for text in texts]
