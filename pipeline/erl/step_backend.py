"""The ERL step's interface (`pipeline.erl.interface.StepBackend`) over an ERLTrainer: TRL's
own single-turn generation (vLLM/Unsloth fast generation included) in as few calls as the
memory budget allows, with tools or environments TRL's own tool loop for a retry's episode
(`pipeline.erl.episodes`); its reward functions, feedback, tokenizer and the accelerator's
collectives."""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

from pipeline.erl.batch import NewRows, completion_layout, loss_mask, pad_rows
from pipeline.erl.episodes import RetryEpisodes
from pipeline.erl.interface import Attempts, Generated
from pipeline.erl.prompts import as_completion, task_prompt
from pipeline.erl.step import call_feedback
from pipeline.erl.upstream import trainable_completions
from rewards.weights import weighted_reward


class AcceleratorProcesses:
    """The ERL step's collectives (`pipeline.erl.interface.Processes`) over the accelerator."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.count, self.index = accelerator.num_processes, accelerator.process_index

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.gather(tensor)

    def gather_object(self, items: list) -> list:
        return gather_object(items) if self.count > 1 else list(items)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(tensor, reduction="sum")


class TrainerStepBackend:
    """The ERL step's interface (`pipeline.erl.interface.StepBackend`) over an ERLTrainer."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.processes = AcceleratorProcesses(trainer.accelerator)
        self.episodic = bool(trainer.tools) or trainer.environment_factories is not None
        # the retries' own environments and tool calls (with tools or environments)
        self.episodes = RetryEpisodes(trainer) if self.episodic else None

    def generate(self, prompts: list, max_new_tokens: int) -> Generated:
        return self.trainer._generate_rows(prompts, max_new_tokens)

    def attempt(self, rows: list[dict], prompts: list) -> Attempts:
        trainer = self.trainer
        if self.episodic:
            return self.episodes.play(rows, prompts)
        generated = trainer._generate_rows(prompts, trainer.max_completion_length)
        tasks = [task_prompt(row) for row in rows]
        completions = [as_completion(task, text) for task, text in zip(tasks, generated.texts)]
        return Attempts(generated, tasks, completions, [None] * len(rows))

    def score(self, rows, prompts, completions, completion_ids, environments=None):
        trainer = self.trainer
        # The reward functions (an environment's get_reward among them) read the retries'
        # environments where TRL keeps the first attempts'.
        saved, trainer.environments = trainer.environments, environments
        try:
            rewards = trainer._calculate_rewards(rows, prompts, completions, completion_ids)
        finally:
            trainer.environments = saved
        # That call queued completion-table columns and metrics for these rows; GRPO already
        # flushed the first attempts', and retries have no place in its table.
        trainer._pending_extra_logs.clear()
        trainer._pending_metrics.clear()
        return weighted_reward(trainer._local(rewards), trainer.reward_weights)

    def feedback(self, rows, prompts, completions, completion_ids, environments=None):
        # What it logs through log_extra/log_metric is dropped with the retries' logs (`score`).
        trainer = self.trainer
        context = {} if environments is None else {"environments": environments}
        return call_feedback(
            trainer.feedback_func,
            rows,
            prompts,
            completions,
            completion_ids,
            trainer_state=trainer.state,
            log_extra=trainer._log_completion_extra,
            log_metric=trainer._log_metric,
            **context,
        )

    def tokenize(self, prompts: list, rows: list[dict]) -> list[list[int]]:
        return self.trainer._prompt_ids(prompts, rows)

    def trainable(self, completion_ids: list[list[int]]) -> list[bool]:
        return trainable_completions(self.trainer, completion_ids)

    def mean_token_nll(self, prompt_ids, completion_ids, tool_masks) -> float | None:
        trainer = self.trainer
        count = len(prompt_ids)
        rows = NewRows(prompt_ids, completion_ids, [0.0] * count, [True] * count, [True] * count)
        rows.tool_masks = list(tool_masks)
        batch = pad_rows(rows, trainer._tokenizer.pad_token_id, trainer.accelerator.device)
        logps = trainer._logps(trainer.model, batch)
        if logps is None:
            return None
        mask = loss_mask(batch)
        logps = completion_layout(logps, batch["prompt_mask"], mask.size(1))
        return (-(logps * mask).sum() / mask.sum().clamp(min=1)).item()
