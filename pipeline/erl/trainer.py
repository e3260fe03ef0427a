"""`ERLTrainer`: TRL's GRPOTrainer plus Experiential RL, the adapter between the two.

The ERL step itself (gate, feedback, reflection, retry, credit, memory, internalization)
is `pipeline.erl.step`, written against a small interface; this module is the glue to TRL:

- the hooks: `_calculate_rewards` hands the step GRPO's first attempts and r1,
  `_generate_and_score_completions` runs the step on every training generation batch and
  merges its rows into GRPO's batch (`pipeline.erl.batch`), and `compute_loss` trains a
  merged chunk in micro-batches (`pipeline.erl.loss`), sized by the memory budget
  (`pipeline.erl.budget`);
- the step's interface over the trainer (`pipeline.erl.step_backend`): TRL's own
  single-turn generation (vLLM/Unsloth fast generation included) in as few calls as the
  budget allows, and with tools or environments TRL's own tool loop for a retry's episode
  (`pipeline.erl.episodes`); its reward functions, tokenizer and the accelerator's
  collectives;
- the guards (what ERL cannot train: `pipeline.erl.guards`), and save/load of the
  reflection memory.

Evaluation never reflects: deployment sees first attempts only. The class is defined at
import, after `activate_backend()`: with Unsloth (on a GPU, or on a CPU with the opt-in)
the base is Unsloth's generated GRPOTrainer (it rebinds `trl.GRPOTrainer`).
"""

from __future__ import annotations

import json
import logging
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
from trl import GRPOTrainer  # noqa: E402

from curriculum.tasks.base import prompt_key  # noqa: E402
from pipeline.erl.batch import INERT_KEY, NewRows, merge_rows  # noqa: E402
from pipeline.erl.budget import MemoryModel, StepBudget  # noqa: E402
from pipeline.erl.config import ERLConfig  # noqa: E402
from pipeline.erl.experience import ExperienceLog  # noqa: E402
from pipeline.erl.guards import refuse_feedback_methods, refuse_unsupported  # noqa: E402
from pipeline.erl.interface import FirstAttempts, Generated  # noqa: E402
from pipeline.erl.loss import chunk_entropy_mask, merged_chunk_loss  # noqa: E402
from pipeline.erl.memory import ReflectionMemory  # noqa: E402
from pipeline.erl.micro_batches import reference_tokens, split_plan  # noqa: E402
from pipeline.erl.step import ERLStep, RetryAdvantages, retry_advantages  # noqa: E402
from pipeline.erl.step_backend import TrainerStepBackend  # noqa: E402
from pipeline.erl.upstream import reference_logps  # noqa: E402
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
        refuse_unsupported(model, args, feedback_func, memory, kwargs)
        if not isinstance(model, str):
            add_mode_switches(model)  # before the base's __init__, which reads the precision mark
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        fix_cpu_weight_sync(self)  # TRL's vLLM sync fails on a CPU (pipeline.models.vllm_colocate)
        if feedback_func is None and self.environment_factories is not None:
            refuse_feedback_methods(self._environment_pool)
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
        # The step's interface over this trainer; with tools or environments it plays the
        # retries' episodes (`backend.episodes`: their own environments and tool calls).
        self._backend = TrainerStepBackend(self)
        self._generate_calls = 0  # reflection and retry generate calls since the last log
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
            episodes = self._backend.episodes
            metrics["erl/retry_tool_calls"].append(float(episodes.tool_calls))
            episodes.tool_calls = 0
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

    def _prompt_ids(self, prompts: list, rows: list[dict] | None = None) -> list[list[int]]:
        """The token ids TRL feeds the policy for each prompt (its chat template), each
        distinct prompt tokenized once: the retries of a shared reflection repeat one.

        With tools or environments, a prompt of a task's `rows` shows the tools its rollout
        may call (`pipeline.erl.episodes.RetryEpisodes.prompt_ids`)."""
        if not self.tools and self.environment_factories is None:
            keys = [prompt_key(prompt) for prompt in prompts]
            distinct = {key: prompt for key, prompt in zip(keys, prompts)}
            ids, _, _ = self._tokenize_prompts(list(distinct.values()))
            by_key = dict(zip(distinct, ids))
            return [list(by_key[key]) for key in keys]  # a list of its own per row
        return self._backend.episodes.prompt_ids(prompts, rows)

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
