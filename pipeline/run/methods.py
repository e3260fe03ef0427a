"""The trainer a curriculum stage trains with: `method` grpo, erl or sdpo.

- `erl`: `ERLTrainer` (pipeline.erl), the default.
- `grpo`: the base trainer itself, `trl.GRPOTrainer` as bound after the backend is chosen
  (Unsloth's generated `UnslothGRPOTrainer` under the Unsloth backend), not ERLTrainer with
  a closed gate.
- `sdpo`: TRL's `SDPOTrainer` with the task's feedback on each rollout as the teacher's
  privileged context (`pipeline.sdpo`).

Whatever the method, the stage reads the same three things of its trainer: the first
attempts' rewards with their rows (`pop_first_attempts`, for the controller), the tokens
it generated while training (`generated_tokens`) and, for ERL only, its reflections'
tally. The classes below add the first two to TRL's trainers; each is defined at import,
after the backend is active (`activate_backend`), like ERLTrainer.
"""

from __future__ import annotations

from typing import Any

from pipeline.models.backend import activate_backend, check_trainer_base, unsloth_trainer_active

activate_backend()  # before trl: under Unsloth, trl.GRPOTrainer is Unsloth's

from trl import GRPOTrainer  # noqa: E402

from pipeline.erl.trainer import ERLTrainer  # noqa: E402
from pipeline.models.loading import add_mode_switches  # noqa: E402
from pipeline.models.quantization import (  # noqa: E402
    record_base_quantization,
    undo_qlora_bf16_cast,
)
from pipeline.models.vllm_colocate import fix_cpu_weight_sync, shared_engine  # noqa: E402
from rewards.first_attempts import FirstAttemptLog  # noqa: E402
from rewards.weights import weighted_reward  # noqa: E402

METHOD_NAMES = {"grpo": "GRPO", "erl": "ERL", "sdpo": "SDPO"}


class CountingERLTrainer(ERLTrainer):
    """ERLTrainer that counts the tokens it generates in training (first attempts,
    reflections and retries)."""

    generated_tokens = 0

    def _generate_single_turn(self, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        if self.model.training:  # not an evaluation
            self.generated_tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs


class RunGRPOTrainer(GRPOTrainer):
    """The backend's GRPOTrainer, plus the first attempts' log and a generated-token count."""

    def __init__(self, model: Any, *args: Any, **kwargs: Any) -> None:
        check_trainer_base(RunGRPOTrainer.__bases__[0])
        add_mode_switches(model)  # Unsloth's trainer switches modes through these
        super().__init__(model, *args, **kwargs)
        fix_cpu_weight_sync(self)  # as ERLTrainer does (pipeline.models.vllm_colocate)
        if not unsloth_trainer_active():
            undo_qlora_bf16_cast(self.model)  # as ERLTrainer does (pipeline.models.quantization)
        self.generated_tokens = 0
        self._scoring_training_batch = False
        self._first_attempt_log = FirstAttemptLog(64 * self.args.generation_batch_size)

    def pop_first_attempts(self) -> list[tuple[float, dict]]:
        """(reward, dataset row) of every first attempt since the last call (this process's)."""
        return self._first_attempt_log.pop()

    def _generate_and_score_completions(self, inputs):
        # Read the mode first: Unsloth's version of the call puts the model in training mode.
        self._scoring_training_batch = self.model.training
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._scoring_training_batch = False

    def _generate_single_turn(self, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        if self._scoring_training_batch:
            self.generated_tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        if self._scoring_training_batch:
            n = rewards_per_func.size(0) // self.accelerator.num_processes  # gathered rows
            local = rewards_per_func[self.accelerator.process_index * n :][:n]
            rewards = weighted_reward(local, self.reward_weights)
            self._first_attempt_log.extend(rewards.tolist(), inputs)
        return rewards_per_func

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as GRPOTrainer does, noting a 4-bit base beside an adapter (for evaluation)."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            record_base_quantization(self.model, output_dir or self.args.output_dir)


def build_trainer(
    method: str,
    *,
    model,
    args,
    train_dataset,
    rewards,
    memory,
    tokenizer,
    success_threshold,
    environment_factory=None,
    experience_log=None,
):
    """The stage's trainer for `method`, on the run's model, rewards and stage config
    (`args`, an ERLConfig: grpo reads its GRPOConfig options, sdpo those SDPOConfig shares).
    `environment_factory`: an agent task's (`AgentTask.make_environment`), for erl and grpo;
    TRL's SDPOTrainer takes none (`pipeline.run.checks` refuses the pair first).
    `experience_log`: where erl writes its reflections and retries (the run folder's)."""
    common = dict(
        model=model,
        # Each stage's own list: TRL appends an environment's get_reward to it in place, and
        # the next stage's trainer would then get one function more than its weights.
        reward_funcs=list(rewards.funcs),
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )
    if environment_factory is not None:
        if method == "sdpo":
            raise ValueError("SDPOTrainer (TRL 1.15) takes no environment_factory")
        common["environment_factory"] = environment_factory
    # Every stage's trainer on the run's model: one colocated vLLM engine for them all.
    with shared_engine(model):
        if method == "erl":
            # One memory for the whole run; checkpoints save and restore it.
            return CountingERLTrainer(
                args=args,
                feedback_func=rewards.feedback,
                memory=memory,
                experience_log=experience_log,
                **common,
            )
        if method == "grpo":
            return RunGRPOTrainer(args=args, **common)
        if method == "sdpo":
            from pipeline.sdpo.trainer import FeedbackSDPOTrainer, sdpo_config

            return FeedbackSDPOTrainer(
                args=sdpo_config(args, success_threshold),
                rollout_feedback=rewards.feedback,
                **common,
            )
    raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHOD_NAMES)}")
