"""ERLTrainer overrides private GRPOTrainer methods: an upgrade must fail here, loudly."""

from __future__ import annotations

import inspect

import trl
from trl import GRPOTrainer

from rewards.weights import weighted_reward

# The private GRPOTrainer methods ERLTrainer overrides or calls, with TRL 1.15.0's signatures.
EXPECTED_SIGNATURES = {
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_generate_and_score_completions": "(self, inputs: list[dict[str, torch.Tensor | typing.Any]]) -> dict[str, torch.Tensor | typing.Any]",
    "_load_optimizer_and_scheduler": "(self, checkpoint)",
    "_generate_single_turn": "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
    "_tokenize_prompts": "(self, prompts: list)",
    "_tool_call_loop": "(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)",
    "save_model": "(self, output_dir: str | None = None, _internal_call: bool = False) -> None",
    "compute_loss": "(self, model, inputs, return_outputs=False, num_items_in_batch=None)",
    "get_high_entropy_mask": "(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor",
}


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == "1.15.0", "ERLTrainer is written against TRL 1.15.0's private API"


def test_trainer_scales_the_returned_loss_as_erl_assumes():
    """ERLTrainer.compute_loss back-propagates all but the last micro-batch itself, scaled
    as Trainer.training_step (transformers 5.17) scales the loss it returns."""
    import transformers
    from transformers import Trainer

    assert transformers.__version__ == "5.17.0"
    source = inspect.getsource(Trainer.training_step)
    assert (
        "if (not self.model_accepts_loss_kwargs or num_items_in_batch is None) and "
        "self.compute_loss_func is None:\n"
        "                # If the model does not accept loss kwargs, we need to normalize the loss "
        "by the number of gradient accumulation steps\n"
        "                loss = loss / self.current_gradient_accumulation_steps"
    ) in source


# Each hand copy in pipeline/erl/upstream.py (and rewards.weights.weighted_reward), with lines of TRL 1.15.0's GRPOTrainer it
# follows: an upgrade that changes them fails here, naming the copy to compare.
UPSTREAM_LINES = {
    "weighted_reward": [
        "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
        "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
        "rewards[unscorable_mask] = torch.nan",
    ],
    "reference_logps": [
        'with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):',
    ],
    "trainable_completions": [
        "eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]",
        "is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids_list]",
    ],
    "adaptive_entropy_step": [
        'window_stats = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")',
        "if world_entropy <= self.args.entropy_target:",
    ],
    "entropy_quantile": [
        "padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=pad_value)",
        "entropy_threshold = torch.quantile(gathered, threshold)",
    ],
    "high_entropy_mask": [
        "masked_entropies = entropies * mask.float()",
        "return entropy_mask & mask.bool()",
    ],
    "importance_sampling_ratio": [
        "per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)",
        "per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)",
        'if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:',
        "invalid_mis_mask, value=0.0",
    ],
    "reset_arguments": [
        'reset_kwargs = {k: v for k, v in x.items() if k != "environment"} if self._multi_environment else x',
    ],
    "with_observation": [
        "if isinstance(observation, list) and isinstance(content, str):",
        'prompts[i] = prompt[:-1] + [{**prompt[-1], "content": content + observation}]',
    ],
    "rollout_tools": [
        'if member_name not in ("reset", "get_reward") and not member_name.startswith("_")',
        "if inspect.iscoroutinefunction(tool):",
    ],
    "render_prompt": [
        "tools=self._env_tools[name] or None,  # `or None`: Llama bug: tool boilerplate for tools=[]",
        "chat_template=self.chat_template,",
    ],
    "first_turns": [
        "[parse_response(self._tokenizer, ids, prefix=prompt_ids[i])]",
        'completions = [[{"role": "assistant", "content": content}] for content in contents]',
    ],
}


def test_every_upstream_copy_follows_lines_trl_still_has():
    from trl.trainer import grpo_trainer

    from pipeline.erl import upstream

    source = inspect.getsource(grpo_trainer)
    copies = {
        name
        for name, value in vars(upstream).items()
        if inspect.isfunction(value) and value.__module__ == upstream.__name__
    }
    # returned_loss_scale follows transformers' Trainer (the test above); weighted_reward
    # lives in rewards/weights.py, where every trainer of the project reads it.
    copies.add(weighted_reward.__name__)
    assert copies - {"returned_loss_scale"} == set(UPSTREAM_LINES)
    for name, lines in UPSTREAM_LINES.items():
        for line in lines:
            assert line in source, f"{name}: TRL no longer has {line!r}"


def test_overridden_private_signatures_are_unchanged():
    for name, expected in EXPECTED_SIGNATURES.items():
        assert str(inspect.signature(getattr(GRPOTrainer, name))) == expected, name


def test_logps_helper_takes_the_arguments_erl_passes():
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    assert params[:6] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
    ]


def test_private_attributes_erl_uses_exist(tiny_model_dir, arithmetic_dataset, erl_args):
    from conftest import length_reward

    from pipeline import ERLTrainer

    trainer = ERLTrainer(
        model=tiny_model_dir,
        args=erl_args(),
        train_dataset=arithmetic_dataset,
        reward_funcs=length_reward,
    )
    for attribute in (
        "_metrics",
        "_pending_extra_logs",
        "_pending_metrics",
        "_tokenizer",
        "generation_config",
        "generation_kwargs",
        "reward_weights",
        "use_vllm",
        "ref_model",
        "mask_truncated_completions",
        "eos_token_ids",
        "_log_metric",
        "_log_completion_extra",
        "_entropy_window_stats",
        "_entropy_bonus_enabled",
        "top_entropy_quantile",
        # multi-turn: read by ERL's retry episodes (tests/test_erl_agents.py runs them)
        "tools",
        "_standalone_tools",
        "environment_factories",
        "_multi_environment",
        "environments",
        "chat_template",
        "chat_template_kwargs",
        "max_completion_length",
    ):
        assert hasattr(trainer, attribute), attribute
    assert trainer.generation_kwargs["max_new_tokens"] == trainer.generation_config.max_new_tokens
