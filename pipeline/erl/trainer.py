"""`ERLTrainer`: TRL's GRPOTrainer plus Experiential RL, the adapter between the two.

The ERL step itself (gate, feedback, reflection, retry, credit, memory, internalization)
is `pipeline.erl.step`, written against a small interface; this module is the glue to TRL:

- the hooks: `_calculate_rewards` hands the step GRPO's first attempts and r1,
  `_generate_and_score_completions` runs the step on every training generation batch and
  merges its rows into GRPO's batch (`pipeline.erl.batch`), and `compute_loss` trains a
  merged chunk in micro-batches (`pipeline.erl.loss`), sized by the memory budget
  (`pipeline.erl.budget`);
- `_Backend`, the step's interface over the trainer: TRL's own single-turn generation
  (vLLM/Unsloth fast generation included) in as few calls as the budget allows, and with
  tools or environments TRL's own tool loop for a retry's episode; its reward functions,
  tokenizer and the accelerator's collectives;
- the guards (what ERL cannot train), and save/load of the reflection memory.

Evaluation never reflects: deployment sees first attempts only. The class is defined at
import, after `activate_backend()`: with Unsloth (on a GPU, or on a CPU with the opt-in)
the base is Unsloth's generated GRPOTrainer (it rebinds `trl.GRPOTrainer`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from curriculum.atomic import atomic_write_json
from pipeline.models.backend import (
    activate_backend,
    check_trainer_base,
    unsloth_compiles_loss,
    unsloth_trainer_active,
)

activate_backend()  # before trl: on a GPU, Unsloth rebinds trl.GRPOTrainer

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from curriculum.tasks.base import prompt_key  # noqa: E402
from pipeline.erl.batch import (  # noqa: E402
    INERT_KEY,
    NewRows,
    completion_layout,
    loss_mask,
    merge_rows,
    pad_rows,
)
from pipeline.erl.budget import MemoryModel, StepBudget  # noqa: E402
from pipeline.erl.config import ERLConfig  # noqa: E402
from pipeline.erl.experience import ExperienceLog  # noqa: E402
from pipeline.erl.interface import Attempts, FirstAttempts, Generated  # noqa: E402
from pipeline.erl.loss import chunk_entropy_mask, merged_chunk_loss  # noqa: E402
from pipeline.erl.memory import ReflectionMemory  # noqa: E402
from pipeline.erl.micro_batches import reference_tokens, split_plan  # noqa: E402
from pipeline.erl.prompts import as_completion, task_prompt  # noqa: E402
from pipeline.erl.step import (  # noqa: E402
    ERLStep,
    RetryAdvantages,
    call_feedback,
    refuse_feedback_method,
    retry_advantages,
)
from pipeline.erl.upstream import (  # noqa: E402
    first_turns,
    reference_logps,
    render_prompt,
    reset_arguments,
    rollout_tools,
    trainable_completions,
    with_observation,
)
from pipeline.models.loading import add_mode_switches  # noqa: E402
from pipeline.models.quantization import (  # noqa: E402
    record_base_quantization,
    undo_qlora_bf16_cast,
)
from pipeline.models.vllm_colocate import fix_cpu_weight_sync  # noqa: E402
from rewards.first_attempts import FirstAttemptLog  # noqa: E402
from rewards.weights import weighted_reward  # noqa: E402

FeedbackFunc = Callable[..., list[str]]
logger = logging.getLogger(__name__)

STATE_FILE = "erl_state.json"
"""In a checkpoint, what a resumed ERL step continues from besides the memory: its counts
(reflections written, the memory's outcomes) and what its memory budget measured."""

# Unsloth options that add batch keys (sample weights, rollout log-probs as old) that ERL's
# rows would have to carry; refused up front rather than at the first gated batch.
_UNSLOTH_BATCH_OPTIONS = (
    "UNSLOTH_GRPO_ZERO_VARIANCE_EXCLUDE",
    "UNSLOTH_GRPO_LOSS_AGGREGATION",
    "UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD",
)


class ERLTrainer(GRPOTrainer):
    """GRPOTrainer plus reflection, retry, memory and internalization (Experiential RL).

    Takes every GRPOTrainer argument (`tools=` and `environment_factory=` included; not
    `rollout_func=`, see docs/erl.md); `args` must be an `ERLConfig`, and
    `feedback_func(prompts, completions, **columns) -> list[str]` (the reward-function
    signature, `environments=` included after episodes) explains to the model what went
    wrong with each completion. Without one, an environment's `feedback` property is read.

    Hooks, for what is still being tried (the learning bench's arms): `memory`, the
    `ReflectionMemory` to read and fill (default `ReflectionMemory.from_config(args)`; one
    of your own must share the config's size, scope and top-k);
    `retry_advantages(groups, r1, r2, valid, scale) -> list[float]`, how reflection and
    retry rows are credited (default `pipeline.erl.step.retry_advantages`). Who reflects,
    and whose reflection each retry reads, is `args.reflections_per_group`.
    `experience_log`: where every reflection and retry is written (default
    `ExperienceLog(args.output_dir)`: `<output_dir>/experience.jsonl`).
    """

    _tag_names = ["trl", "grpo", "erl"]

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: ERLConfig | None = None,
        *positional: Any,
        feedback_func: FeedbackFunc | None = None,
        memory: ReflectionMemory | None = None,
        retry_advantages: RetryAdvantages = retry_advantages,
        experience_log: ExperienceLog | None = None,
        **kwargs: Any,
    ) -> None:
        check_trainer_base(ERLTrainer.__bases__[0])
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = ERLConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-ERL")
        _refuse_unsupported(model, args, feedback_func, memory, kwargs)
        if not isinstance(model, str):
            add_mode_switches(model)  # before the base's __init__, which reads the precision mark
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        fix_cpu_weight_sync(self)  # TRL's vLLM sync fails on a CPU (pipeline.models.vllm_colocate)
        if feedback_func is None and self.environment_factories is not None:
            _refuse_feedback_methods(self._environment_pool)
        if not unsloth_trainer_active():
            # TRL's __init__ casts a quantized model's adapter to bf16, which freezes lora_A at
            # small learning rates and makes a resume come back in float32; Unsloth's trainer
            # does not cast. Float32 adapters, as Unsloth's (pipeline.models.quantization).
            undo_qlora_bf16_cast(self.model)
        columns = set(getattr(self.train_dataset, "column_names", None) or [])
        if self._is_vlm or columns & {"image", "images"}:
            raise NotImplementedError(
                "ERLTrainer does not support multimodal datasets or processors (image columns "
                "or a ProcessorMixin): reflection and retry rows are text only"
            )
        # Unsloth's trainer switches modes through these; a plain model lacks them.
        add_mode_switches(self.model)
        self.feedback_func = feedback_func
        self.memory = memory if memory is not None else ReflectionMemory.from_config(args)
        self.erl_step = ERLStep(args, self.memory, retry_advantages)
        # Every reflection and retry, written by the main process (pipeline.erl.experience).
        self.experience_log = experience_log or ExperienceLog(args.output_dir)
        self.budget = StepBudget(
            args.peak_memory_factor,
            MemoryModel.of(
                self.model.config.get_text_config(),
                dtype_bytes=2 if args.bf16 or args.fp16 else _float_bytes(self.model),
                gradient_checkpointing=args.gradient_checkpointing,
            ),
            self.accelerator.device,
            packed=unsloth_trainer_active(),
            measure=_can_measure(self.accelerator.device),
        )
        self._backend = _Backend(self)
        self._generate_calls = 0  # reflection and retry generate calls since the last log
        self._retry_tool_calls = 0  # tool calls of retry episodes since the last log
        # Retries' environments, apart from TRL's pool so that the first attempts' stay as
        # their episodes left them; made once and reset per retry, as TRL's are.
        self._retry_pool: dict[str | None, list] = {}
        self._captured: list[FirstAttempts] | None = None  # open during the base's generation
        # Bounded: only a consumer such as the curriculum callback empties it.
        self._first_attempt_log = FirstAttemptLog(64 * args.generation_batch_size)

    def pop_first_attempts(self) -> list[tuple[float, dict]]:
        """(r1, dataset row) of every first attempt since the last call (this process's rows)."""
        return self._first_attempt_log.pop()

    # Hooks into GRPOTrainer ------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        if self._captured is not None:  # GRPO scoring its first attempts: hand them to ERL
            r1 = weighted_reward(self._local(rewards_per_func), self.reward_weights)
            ids = list(completion_ids_list)  # as the reward functions got them
            environments = list(self.environments) if self.environments is not None else None
            self._captured.append(
                FirstAttempts(inputs, prompts, completions, ids, r1, environments)
            )
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        # Read the mode first: Unsloth's version of the call below puts the model in training mode.
        training = self.model.training
        self._captured = []
        try:
            output = super()._generate_and_score_completions(inputs)
            first = self._captured[-1] if training else None
        finally:
            self._captured = None
        if not training:
            return output  # evaluation sees first attempts only
        self._first_attempt_log.extend(first.rewards.tolist(), first.rows)
        packed = unsloth_trainer_active()
        self.budget.reference_tokens = reference_tokens(
            output, self._tokenizer.pad_token_id, self.args.per_device_train_batch_size, packed
        )
        result = self.erl_step(self._backend, first, self.state.global_step)
        if self.accelerator.is_main_process:
            self.experience_log.append(result.records)
        metrics = self._metrics["train"]
        for key, value in result.metrics.items():
            metrics[key].append(value)
        if result.rows is not None:
            output = self._merge_rows(output, result.rows)
        metrics["erl/generate_calls"].append(float(self._generate_calls))
        self._generate_calls = 0
        if self._backend.episodic:
            metrics["erl/retry_tool_calls"].append(float(self._retry_tool_calls))
            self._retry_tool_calls = 0
        return output

    def _merge_rows(self, output: dict, rows: NewRows) -> dict:
        """`rows` appended to GRPO's batch `output`, in the base trainer's layout."""
        args = self.args
        return merge_rows(
            output,
            rows,
            pad_id=self._tokenizer.pad_token_id,
            multiple=self.pad_to_multiple_of,
            steps_per_generation=args.steps_per_generation,
            gather=self.accelerator.gather,
            logps=lambda batch: self._logps(self.model, batch, budgeted=True),
            ref_logps=lambda batch: reference_logps(
                self, batch, lambda model, rows: self._logps(model, rows, budgeted=True)
            ),
            importance_sampling=(
                args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_min,
                args.vllm_importance_sampling_clip_max,
            ),
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The base trainer's loss; a merged chunk (ERL's rows in it) in micro-batches within
        the memory budget, every term counted once (`pipeline.erl.loss.merged_chunk_loss`)."""
        if INERT_KEY not in inputs:  # GRPO's own batch (gate closed, evaluation): untouched
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inert = inputs[INERT_KEY]
        inputs = {k: v for k, v in inputs.items() if k != INERT_KEY}
        return merged_chunk_loss(
            self,
            super().compute_loss,
            model,
            inputs,
            inert,
            self.budget,
            return_outputs,
            num_items_in_batch,
        )

    def get_high_entropy_mask(self, entropies, mask, threshold):
        """GRPO's mask of high-entropy loss tokens. In a micro-batched chunk the quantile is
        the chunk's (`pipeline.erl.loss`): its first pass collects the population here."""
        chunk = chunk_entropy_mask(entropies, mask)
        return super().get_high_entropy_mask(entropies, mask, threshold) if chunk is None else chunk

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model as GRPOTrainer does, plus the reflection memory beside it."""
        super().save_model(output_dir, _internal_call)  # checkpoints go through here too
        if self.args.should_save:
            folder = Path(output_dir or self.args.output_dir)
            self.memory.save(folder)
            # The step's counts so far (a resumed stage counts the whole stage) and the
            # budget's measurements (a resumed run splits its generate calls as before).
            state = {"tally": dict(self.erl_step.tally), "budget": self.budget.state_dict()}
            atomic_write_json(folder / STATE_FILE, state)
            record_base_quantization(self.model, folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.memory.load(checkpoint)
            saved = Path(checkpoint) / STATE_FILE
            if saved.exists():
                state = json.loads(saved.read_text())
                self.erl_step.tally = Counter(state["tally"])
                self.budget.load_state_dict(state["budget"])

    # Generation and scoring ------------------------------------------------------------

    def _generate_rows(self, prompts: list, max_new_tokens: int) -> Generated:
        """One sample per prompt through the trainer's own generation path (vLLM/Unsloth fast
        generation included), with the sampler's per-token log-probs (vLLM's; None per row
        where the path reports none).

        Without vLLM (which manages its own cache) the prompts are generated in as few calls
        as the memory budget allows (`pipeline.erl.budget`), each measured while the budget
        calibrates."""
        prompt_ids = self._prompt_ids(prompts)
        completion_ids, logprobs = [], []
        for rows in self._generation_calls(prompt_ids, max_new_tokens):
            ids, lps = self._generate_single_turn([prompt_ids[i] for i in rows], None, {}, 1)
            completion_ids += [list(c) for c in ids]
            logprobs += [list(lp) for lp in lps] if lps is not None else [None] * len(rows)
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return Generated(prompt_ids, completion_ids, texts, logprobs)

    def _generation_calls(
        self, prompt_ids: list, max_new_tokens: int, span: int | None = None
    ) -> Iterator[list[int]]:
        """The rows of each generate call at `max_new_tokens`: as few calls as the memory
        budget allows for `span` tokens past each prompt (default `max_new_tokens`), one
        under vLLM, which manages its own cache; each measured while the budget calibrates.
        Every process makes as many calls."""
        lengths = [len(p) for p in prompt_ids]
        span = span or max_new_tokens
        if self.use_vllm:
            plan = [list(range(len(prompt_ids)))]
        else:
            plan = self.budget.plan_generation(lengths, span)
            if self.accelerator.num_processes > 1:  # ZeRO-3 gathers weights per call
                count = self.accelerator.gather(torch.tensor([len(plan)], device=self.model.device))
                plan = split_plan(plan, int(count.max()))
        self._generate_calls += len(plan)
        with self._generation_length(max_new_tokens):
            for rows in plan:
                if self.use_vllm:
                    yield rows
                    continue
                longest = max(lengths[i] for i in rows)
                with self.budget.generate_call(len(rows), longest, span):
                    yield rows

    def _episodes(self, rows: list[dict], prompts: list) -> Attempts:
        """One episode per row from `prompts` (the retry prompts) through TRL's tool loop,
        at its turn limit: in a fresh environment reset with the row (its text appended to
        the prompt, as TRL does), with the tools the row's rollout may call."""
        environments = self._retry_environments(rows)
        tasks = [task_prompt(row) for row in rows]
        prompts = copy.deepcopy(prompts)
        if environments is not None:
            for i, (environment, row) in enumerate(zip(environments, rows)):
                text = environment.reset(**reset_arguments(row, self._multi_environment))
                prompts[i] = with_observation(prompts[i], text)
                tasks[i] = with_observation(tasks[i], text)
        prompt_ids = self._prompt_ids(prompts, rows)
        length = self.max_completion_length
        completion_ids: list = [None] * len(rows)
        logprobs: list = [None] * len(rows)
        completions: list = [None] * len(rows)
        tool_masks: list = [None] * len(rows)
        # A turn after a tool result continues from up to `length` completion tokens and
        # may generate `length` more: the budget plans each call for both.
        for chunk in self._generation_calls(prompt_ids, length, span=2 * length):
            ids, lps = self._generate_single_turn([prompt_ids[i] for i in chunk], None, {}, 1)
            ids = [list(c) for c in ids]
            turns = first_turns(self, [prompt_ids[i] for i in chunk], ids)
            masks = None
            if self.tools:
                tools = [rollout_tools(self._standalone_tools, _at(environments, i)) for i in chunk]
                masks, turns, ids, lps = self._tool_loop(
                    [copy.deepcopy(prompts[i]) for i in chunk],
                    [prompt_ids[i] for i in chunk],
                    ids,
                    turns,
                    lps,
                    tools,
                )
            for j, i in enumerate(chunk):
                completion_ids[i], completions[i] = ids[j], turns[j]
                logprobs[i] = list(lps[j]) if lps is not None else None
                tool_masks[i] = list(masks[j]) if masks is not None else None
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        generated = Generated(prompt_ids, completion_ids, texts, logprobs)
        return Attempts(generated, tasks, completions, tool_masks, environments)

    def _tool_loop(self, prompts, prompt_ids, completion_ids, turns, logprobs, tools):
        """TRL's tool loop over these rollouts, with their tools in the per-rollout tool
        dicts it reads (the first attempts' are put back after)."""
        saved = getattr(self, "_sync_tool_dicts", None), getattr(self, "_async_tool_dicts", None)
        self._sync_tool_dicts = [sync for sync, _ in tools]
        self._async_tool_dicts = [asynchronous for _, asynchronous in tools]
        try:
            masks, turns, completion_ids, logprobs, calls, *_ = self._tool_call_loop(
                prompts, prompt_ids, completion_ids, turns, logprobs, None, {}
            )
        finally:
            self._sync_tool_dicts, self._async_tool_dicts = saved
        self._retry_tool_calls += calls
        return masks, turns, completion_ids, logprobs

    def _retry_environments(self, rows: list[dict]) -> list | None:
        """One environment per row from the retries' own pool (None without a factory)."""
        if self.environment_factories is None:
            return None
        handed: dict[str | None, int] = {}
        environments = []
        for row in rows:
            name = self._environment_name(row)
            pool = self._retry_pool.setdefault(name, [])
            index = handed.get(name, 0)
            if index == len(pool):
                pool.append(self.environment_factories[name]())
            handed[name] = index + 1
            environments.append(pool[index])
        return environments

    def _prompt_ids(self, prompts: list, rows: list[dict] | None = None) -> list[list[int]]:
        """The token ids TRL feeds the policy for each prompt (its chat template), each
        distinct prompt tokenized once: the retries of a shared reflection repeat one.

        With tools or environments, a prompt of a task's `rows` shows the tools its rollout
        may call (its environment's), and one without rows (a reflection) shows none."""
        if not self.tools and self.environment_factories is None:
            keys = [prompt_key(prompt) for prompt in prompts]
            distinct = {key: prompt for key, prompt in zip(keys, prompts)}
            ids, _, _ = self._tokenize_prompts(list(distinct.values()))
            by_key = dict(zip(distinct, ids))
            return [list(by_key[key]) for key in keys]  # a list of its own per row
        names = (
            [self._environment_name(row) for row in rows]
            if rows is not None
            else [False] * len(prompts)  # no tools shown
        )
        rendered: dict[tuple, list[int]] = {}
        result = []
        for prompt, name in zip(prompts, names):
            key = (prompt_key(prompt), name)
            if key not in rendered:
                tools = None if name is False else self._tools_of(name)
                rendered[key] = render_prompt(self, prompt, tools)
            result.append(list(rendered[key]))
        return result

    def _environment_name(self, row: dict):
        """The name of a row's environment (None: the one environment, or none), which
        decides the tools its rollout is shown."""
        return row.get("environment") if self._multi_environment else None

    def _tools_of(self, name) -> list:
        """The tools shown to a rollout of environment `name` (TRL's per-example schema)."""
        if self.environment_factories is not None:
            return self._env_tools[name]
        return self.tools

    @contextmanager
    def _generation_length(self, max_new_tokens: int) -> Iterator[None]:
        """Temporarily change the generation length (reflections have their own)."""
        if self.use_vllm:
            saved = self.vllm_generation.max_completion_length
            self.vllm_generation.max_completion_length = max_new_tokens
        else:
            saved = self.generation_config.max_new_tokens
            self.generation_config.max_new_tokens = max_new_tokens
            self.generation_kwargs["max_new_tokens"] = max_new_tokens
        try:
            yield
        finally:
            if self.use_vllm:
                self.vllm_generation.max_completion_length = saved
            else:
                self.generation_config.max_new_tokens = saved
                self.generation_kwargs["max_new_tokens"] = saved

    @torch.no_grad()
    def _logps(self, model, batch: dict, budgeted: bool = False) -> torch.Tensor:
        """Per-token log-probs of the completions, in forwards of at most
        `per_device_train_batch_size` rows, or, `budgeted` (a merged batch), of at most the
        tokens the memory budget allows a loss forward."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        rows = self.args.per_device_train_batch_size
        if budgeted:
            rows = max(1, self.budget.loss_tokens() // input_ids.size(1))
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=rows
        )
        return logps

    def _local(self, gathered: torch.Tensor) -> torch.Tensor:
        """This process's rows of a tensor gathered over processes."""
        n = gathered.size(0) // self.accelerator.num_processes
        start = self.accelerator.process_index * n
        return gathered[start : start + n]


def _at(items: list | None, index: int):
    """`items[index]`, or None without items."""
    return None if items is None else items[index]


class _Processes:
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


class _Backend:
    """The ERL step's interface (`pipeline.erl.interface.StepBackend`) over an ERLTrainer."""

    def __init__(self, trainer: ERLTrainer) -> None:
        self.trainer = trainer
        self.processes = _Processes(trainer.accelerator)
        self.episodic = bool(trainer.tools) or trainer.environment_factories is not None

    def generate(self, prompts: list, max_new_tokens: int) -> Generated:
        return self.trainer._generate_rows(prompts, max_new_tokens)

    def attempt(self, rows: list[dict], prompts: list) -> Attempts:
        trainer = self.trainer
        if self.episodic:
            return trainer._episodes(rows, prompts)
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


def _refuse_unsupported(model, args, feedback_func, memory, kwargs: dict) -> None:
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
            for name in _UNSLOTH_BATCH_OPTIONS
            if os.environ.get(name, "").strip() not in ("", "0")
        ]
        if enabled:
            raise ValueError(
                f"ERLTrainer does not support {', '.join(enabled)} (Unsloth adds batch keys "
                "for it that ERL's reflection and retry rows do not carry); unset it"
            )


def _refuse_feedback_methods(pools: dict) -> None:
    """An environment's feedback is read from a `feedback` property (`refuse_feedback_method`)."""
    for instances in pools.values():
        refuse_feedback_method(type(instances[0]))


def _can_measure(device: torch.device) -> bool:
    """Whether the memory budget can measure this trainer's steps. Not on a CPU under
    Unsloth's compiled loss: the CPU meter is a TorchDispatchMode, under which
    torch.compile(fullgraph=True) finds no frame to compile; the budget then keeps its plan
    within GRPO's own forward (`pipeline.erl.budget`), and says so once."""
    if device.type == "cuda" or not unsloth_compiles_loss():
        return True
    logger.warning(
        "ERL's memory budget: Unsloth compiles its loss (UNSLOTH_COMPILE_DISABLE is not set), "
        "which the CPU's memory meter would break; loss micro-batches stay within GRPO's own "
        "forward, unmeasured"
    )
    return False


def _float_bytes(model) -> int:
    """Bytes of the model's floating-point values (a 4-bit model computes in its compute dtype)."""
    dtype = next((p.dtype for p in model.parameters() if p.dtype.is_floating_point), torch.float32)
    return torch.finfo(dtype).bits // 8
