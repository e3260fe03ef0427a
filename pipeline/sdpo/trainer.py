"""`FeedbackSDPOTrainer`: TRL's SDPOTrainer whose teacher reads the feedback on each rollout.

TRL 1.15 takes one `privileged_context` per dataset row, fixed before training, and shows
it to every rollout of the prompt. Here the trainer instead asks `rollout_feedback` (the
reward-function signature, the text ERL's reflection reads) for the feedback on each
rollout right after scoring it, empty for a rollout that succeeded, and hands those texts
to TRL's own teacher-prompt builder in place of the dataset's column. Which sibling is
shown, `environment_feedback_only_without_solution` and the templates stay TRL's.

The trainer also keeps what the curriculum run reads of every method's trainer: the
first attempts' weighted rewards with their rows (`pop_first_attempts`) and the tokens it
generated in training (`generated_tokens`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from pipeline.models.backend import activate_backend

activate_backend()  # before trl, as everywhere

with warnings.catch_warnings():  # trl.experimental warns on import that it is experimental
    warnings.simplefilter("ignore")
    from trl.experimental.sdpo import SDPOConfig, SDPOTrainer  # noqa: E402
    from trl.experimental.sdpo.sdpo_trainer import (  # noqa: E402
        SuccessfulRolloutTeacherContextBuilder,
    )

from pipeline.models.quantization import record_base_quantization, undo_qlora_bf16_cast  # noqa: E402
from pipeline.models.vllm_colocate import fix_cpu_weight_sync  # noqa: E402
from rewards.first_attempts import FirstAttemptLog  # noqa: E402
from rewards.weights import weighted_reward  # noqa: E402

FeedbackFunc = Callable[..., list[str]]

# SDPO as the project runs it: TRL 1.15's SDPOTrainer at its SDPOConfig defaults (EMA teacher
# at rate 0.05, importance-sampling clip 2, no reprompt on a rollout's own success), logit
# distillation over the teacher's top 100 tokens plus a tail bucket, environment feedback
# used only where no sibling succeeded, half policy gradient (the fair bench's `sdpo_mixed`).
# The divergence is TRL's at `distillation_alpha` 0.5: TRL's interpolation, which at 0.5 is
# the Jensen-Shannon divergence. The SDPO authors' configuration (lasgroup/SDPO,
# verl/trainer/config/actor/actor.yaml) also says alpha 0.5, but there it selects a Renyi
# reverse KL (rho 0.25), which TRL does not implement: the numbers coincide, the losses do not.
RUN_SETTINGS = dict(
    distillation_mode="topk_logits",
    distillation_topk=100,
    distillation_add_tail=True,
    distillation_alpha=0.5,
    distillation_weight=0.5,
    include_environment_feedback=True,
    environment_feedback_only_without_solution=True,
)


def sdpo_config(args: Any, success_threshold: float, **overrides: Any) -> SDPOConfig:
    """An SDPOConfig holding every option of the GRPO-style config `args` that SDPOConfig
    also has (schedule, batch, sampling, output, ...), RUN_SETTINGS and `overrides`.
    `success_threshold`: the reward at which a rollout counts as solved (ERL's gate)."""
    # generation_batch_size is derived from steps_per_generation (or the reverse), and
    # SDPOConfig, like GRPOConfig, refuses both: the derived one stays out.
    shared = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(SDPOConfig)
        if f.init and hasattr(args, f.name) and f.name != "generation_batch_size"
    }
    # GRPOConfig has no prompt limit; SDPO's default (512 tokens) would cut long prompts.
    settings = shared | {"max_prompt_length": None} | RUN_SETTINGS | overrides
    return SDPOConfig(**settings, success_reward_threshold=success_threshold)


class _RolloutFeedbackTeacher(SuccessfulRolloutTeacherContextBuilder):
    """TRL's teacher-prompt builder, fed the feedback on each rollout."""

    def build(self, output, prompts, rewards, feedbacks=None):
        return super().build(output, prompts, rewards, self.trainer.pop_rollout_feedback())


class FeedbackSDPOTrainer(SDPOTrainer):
    """SDPOTrainer plus per-rollout feedback (`rollout_feedback`, optional), the first
    attempts' log and a count of generated tokens. Takes every SDPOTrainer argument."""

    def __init__(
        self, model: Any, *args: Any, rollout_feedback: FeedbackFunc | None = None, **kwargs: Any
    ):
        _drop_teacher_adapter(model)  # an earlier trainer's (a curriculum's previous stage)
        super().__init__(model, *args, **kwargs)
        fix_cpu_weight_sync(self)  # as ERLTrainer does (pipeline.models.vllm_colocate)
        # TRL casts a quantized model's adapter to bf16 under bf16 (pipeline.models.quantization).
        undo_qlora_bf16_cast(self.model)
        if self.teacher_model is not self.model:
            # TRL builds this teacher from the model's path, which holds the weights before any
            # training of this process (a warm-up, earlier stages): start it at the student's.
            student = self.accelerator.unwrap_model(self.model).state_dict()
            self.accelerator.unwrap_model(self.teacher_model).load_state_dict(student)
        self.generated_tokens = 0
        self._first_attempt_log = FirstAttemptLog(64 * self.args.generation_batch_size)
        self.rollout_feedback, self._feedback = rollout_feedback, None
        if rollout_feedback is not None:
            self.teacher_context_builder = _RolloutFeedbackTeacher(self)

    def _generate(self, prompt_ids):
        prompt_ids, completion_ids = super()._generate(prompt_ids)
        if self.model.training:  # not an evaluation
            self.generated_tokens += sum(len(ids) for ids in completion_ids)
        return prompt_ids, completion_ids

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        start = self.accelerator.process_index * len(prompts)  # the rewards are gathered
        total = weighted_reward(rewards, self.reward_weights)[start : start + len(prompts)].tolist()
        if self.model.training:
            self._first_attempt_log.extend(total, inputs)
        if self.rollout_feedback is not None:
            columns = {
                k: [row[k] for row in inputs]
                for k in inputs[0]
                if k not in ("prompt", "completion", "completion_ids")
            }
            texts = self.rollout_feedback(prompts=prompts, completions=completions, **columns)
            if len(texts) != len(prompts):
                raise ValueError(
                    f"the feedback function returned {len(texts)} texts for {len(prompts)} "
                    "completions: it must return one string per completion"
                )
            threshold = self.args.success_reward_threshold
            self._feedback = ["" if r >= threshold else t for r, t in zip(total, texts)]
        return rewards

    def pop_rollout_feedback(self) -> list[str]:
        """The feedback on the rollouts just scored (once)."""
        feedback, self._feedback = self._feedback, None
        if feedback is None:
            raise RuntimeError("no rollout feedback: the rewards were not scored first")
        return feedback

    def pop_first_attempts(self) -> list[tuple[float, dict]]:
        """(reward, dataset row) of every rollout since the last call (this process's)."""
        return self._first_attempt_log.pop()

    def train(self, *args: Any, **kwargs: Any):
        """SDPOTrainer's training; then the EMA teacher's adapter (LoRA) leaves the model, so
        that the saved policy holds the student's adapter alone."""
        try:
            return super().train(*args, **kwargs)
        finally:
            _drop_teacher_adapter(self.accelerator.unwrap_model(self.model))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        # A checkpoint holds the teacher's adapter too; the EMA callback adds it again when
        # training begins (TRL keeps no EMA state in checkpoints: the teacher starts afresh).
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        _drop_teacher_adapter(self.accelerator.unwrap_model(model or self.model))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as SDPOTrainer does, noting a 4-bit base beside an adapter (for evaluation)."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            record_base_quantization(self.model, output_dir or self.args.output_dir)


TEACHER_ADAPTER = "teacher"
"""The LoRA adapter TRL's EMA teacher adds to a PEFT student (PEFTAdapterEMACallback)."""


def _drop_teacher_adapter(model: Any) -> None:
    """Remove the EMA teacher's adapter from a PEFT model, if it has one."""
    if TEACHER_ADAPTER in (getattr(model, "peft_config", None) or {}):
        model.delete_adapter(TEACHER_ADAPTER)
