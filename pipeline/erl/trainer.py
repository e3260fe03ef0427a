"""`ERLTrainer`: TRL's GRPOTrainer plus Experiential RL.

Per generation batch, after GRPO has generated and scored the first attempts y1:

1. first attempt: y1, reward r1 (GRPO's weighted reward) and feedback from `feedback_func`;
2. gating: rows with r1 < `reward_threshold` go on;
3. reflection: one generation per gated row from `reflection_system_prompt`, with the
   `memory_top_k` stored reflections of the same prompt (`memory_scope`; or the most
   similar prompts'; or, `global`, the newest one: the ERL paper's rulebook);
4. retry: one generation y2 from `retry_system_prompt`; r2 is scored by the reward
   functions against the ORIGINAL row (its answer/metadata columns);
5. memory: reflections whose retry reached the threshold enter the FIFO memory;
6. GRPO update over y1 rows (GRPO's advantages), reflection rows and y2 rows (advantage
   from r2, normalised within the retries of the same prompt; alone: r2 - r1);
7. internalization: (original prompt -> y2) rows for successful retries, advantage
   `internalization_coef`. On-policy (ratio 1) and with beta=0 the policy-gradient loss of
   such a row has exactly the gradient of token-level cross-entropy weighted by the
   coefficient, normalised like the RL tokens (tests/test_erl_internalization.py).

Everything happens in `_generate_and_score_completions`, so TRL's buffering, splitting
into `steps_per_generation` chunks, loss types and logging apply to the merged batch
unchanged. `pipeline.erl.batch` puts the new rows into the base trainer's layout;
`compute_loss` trains a merged chunk in micro-batches (`pipeline.erl.micro_batches`,
every loss term counted once), and reflections and retries are generated in as few calls
as `memory_budget` allows (`pipeline.erl.budget`; figures: bench/erl_overhead.py).
Evaluation never reflects: deployment sees first attempts only.

The class is defined at import, after `activate_backend()`: with Unsloth (on a GPU, or on
a CPU with the opt-in) the base is Unsloth's generated GRPOTrainer (it rebinds
`trl.GRPOTrainer`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.models.backend import activate_backend, check_trainer_base, unsloth_trainer_active

activate_backend()  # before trl: on a GPU, Unsloth rebinds trl.GRPOTrainer

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl.trainer.utils import use_adapter  # noqa: E402

from pipeline.erl.batch import (  # noqa: E402
    INERT_KEY,
    PART_INTERNALIZATION,
    PART_RETRY,
    TOKEN_BUDGET_KEY,
    NewRows,
    completion_layout,
    merge_rows,
    normalise_parts,
    pad_rows,
)
from pipeline.erl.budget import MemoryModel, plan_generation  # noqa: E402
from pipeline.erl.config import ERLConfig, reaches_threshold  # noqa: E402
from pipeline.erl.memory import ReflectionMemory  # noqa: E402
from pipeline.erl.micro_batches import (  # noqa: E402
    PartWeights,
    collapse_metrics,
    loss_token_mask,
    micro_batch,
    part_weights,
    plan_equal_micro_batches,
    plan_micro_batches,
    rows_per_micro_batch,
    select_rows,
    split_plan,
)
from pipeline.erl.prompts import (  # noqa: E402
    as_completion,
    memory_text,
    prompt_text,
    reflection_prompt,
    retry_prompt,
)
from pipeline.models.loading import add_mode_switches  # noqa: E402
from pipeline.models.quantization import (  # noqa: E402
    record_base_quantization,
    undo_qlora_bf16_cast,
)
from rewards import completion_text  # noqa: E402

FeedbackFunc = Callable[..., list[str]]

# Unsloth options that add batch keys (sample weights, rollout log-probs as old) that ERL's
# rows would have to carry; refused up front rather than at the first gated batch.
_UNSLOTH_BATCH_OPTIONS = (
    "UNSLOTH_GRPO_ZERO_VARIANCE_EXCLUDE",
    "UNSLOTH_GRPO_LOSS_AGGREGATION",
    "UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD",
)


class ERLTrainer(GRPOTrainer):
    """GRPOTrainer plus reflection, retry, memory and internalization (Experiential RL).

    Takes every GRPOTrainer argument, `args` must be an `ERLConfig`, and
    `feedback_func(prompts, completions, **columns) -> list[str]` (the reward-function
    signature) explains to the model what went wrong with each completion.
    """

    _tag_names = ["trl", "grpo", "erl"]

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: ERLConfig | None = None,
        *positional: Any,
        feedback_func: FeedbackFunc | None = None,
        **kwargs: Any,
    ) -> None:
        check_trainer_base(ERLTrainer.__bases__[0])
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = ERLConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-ERL")
        if not isinstance(args, ERLConfig):
            raise TypeError(
                f"ERLTrainer needs args=ERLConfig(...), got {type(args).__name__}; "
                "ERLConfig takes every GRPOConfig option plus the ERL ones"
            )
        if feedback_func is not None and not callable(feedback_func):
            raise TypeError(f"feedback_func must be callable, got {type(feedback_func).__name__}")
        for unsupported in ("tools", "rollout_func", "environment_factory"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(
                    f"ERLTrainer does not support {unsupported}= (multi-turn rollouts)"
                )
        if args.top_entropy_quantile < 1.0:
            # The base takes the quantile over one loss call's tokens; ERL trains a merged
            # chunk in several calls, so the mask would come from each micro-batch alone.
            raise ValueError(
                f"ERLTrainer does not support top_entropy_quantile={args.top_entropy_quantile} "
                "(< 1): a merged chunk is trained in micro-batches, and the entropy quantile "
                "would be taken per micro-batch instead of over the chunk; use 1.0"
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
        if not isinstance(model, str):
            add_mode_switches(model)  # before the base's __init__, which reads the precision mark
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
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
        self.memory = ReflectionMemory(args.memory_size if args.enable_memory else 0)
        self._memory_model = MemoryModel.of(
            self.model.config.get_text_config(),
            dtype_bytes=2 if args.bf16 or args.fp16 else _float_bytes(self.model),
            gradient_checkpointing=args.gradient_checkpointing,
        )
        self._generate_calls = 0  # reflection and retry generate calls since the last log
        self._first_attempt: tuple | None = None
        # Bounded: only a consumer such as the curriculum callback empties it.
        self._first_attempt_log: deque[tuple[float, dict]] = deque(
            maxlen=64 * args.generation_batch_size
        )

    def pop_first_attempts(self) -> list[tuple[float, dict]]:
        """(r1, dataset row) of every first attempt since the last call (this process's rows)."""
        log = list(self._first_attempt_log)
        self._first_attempt_log.clear()
        return log

    # Hooks into GRPOTrainer ------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        # Kept for `_generate_and_score_completions`, which needs r1 and the decoded y1.
        self._first_attempt = (inputs, prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        # Read the mode first: Unsloth's version of the call below puts the model in training mode.
        training = self.model.training
        output = super()._generate_and_score_completions(inputs)
        if not training:
            return output  # evaluation sees first attempts only
        rows, prompts, completions, completion_ids, rewards_per_func = self._first_attempt
        r1 = self._weighted_reward(self._local(rewards_per_func))
        self._first_attempt_log.extend(zip(r1.tolist(), rows))
        threshold = self.args.reward_threshold
        # Solved up to float rounding does not gate; NaN (unscorable) never gates.
        gated = [
            i for i, r in enumerate(r1.tolist()) if r == r and not reaches_threshold(r, threshold)
        ]

        metrics = self._metrics["train"]
        all_r1 = self.accelerator.gather(r1)
        metrics["erl/r1_mean"].append(torch.nanmean(all_r1).item())
        num_gated = self.accelerator.gather(torch.tensor([len(gated)], device=r1.device))
        metrics["erl/gated_fraction"].append(num_gated.sum().item() / all_r1.numel())
        if num_gated.max().item() > 0:
            # The memory budget: a multiple of one forward of GRPO's own batch (its rows at
            # per_device_train_batch_size, at its width), which is where a GRPO step peaks.
            width = output["prompt_ids"].size(1) + output["completion_ids"].size(1)
            tokens_per_forward = int(
                self.args.memory_budget * self.args.per_device_train_batch_size * width
            )
            new_rows = self._experience(
                rows,
                prompts,
                completions,
                completion_ids,
                r1,
                gated,
                pad_to=int(num_gated.max().item()),
                generation_budget=self._memory_model.loss_forward(tokens_per_forward),
            )
            first_rows = output["prompt_ids"].size(0)
            output = merge_rows(self, output, new_rows, tokens_per_forward)
            if self.args.loss_normalization == "per_part":
                tokens = normalise_parts(output, first_rows, new_rows, self.accelerator.gather)
                for part, count in tokens.items():
                    metrics[f"erl/tokens_{part}"].append(float(count))
        else:
            metrics["erl/internalization_rows"].append(0.0)
        metrics["erl/memory_size"].append(float(len(self.memory)))
        metrics["erl/generate_calls"].append(float(self._generate_calls))
        self._generate_calls = 0
        return output

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model as GRPOTrainer does, plus the reflection memory beside it."""
        super().save_model(output_dir, _internal_call)  # checkpoints go through here too
        if self.args.should_save:
            self.memory.save(output_dir or self.args.output_dir)
            record_base_quantization(self.model, output_dir or self.args.output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.memory.load(checkpoint)

    # The ERL phases --------------------------------------------------------------------

    def _experience(
        self, rows, prompts, completions, completion_ids, r1, gated, pad_to, generation_budget
    ) -> NewRows:
        """Phases 1-7 for the gated rows; returns the reflection, retry and internalization
        rows. `generation_budget`: the bytes a reflection or retry generate call may hold."""
        valid = [True] * len(gated) + [False] * (pad_to - len(gated))
        # Every process must score the same number of rows (the reward gather needs it):
        # pad with copies of a real row that are masked out of the loss.
        idx = gated + [gated[0] if gated else 0] * (pad_to - len(gated))
        g_rows = [rows[i] for i in idx]
        g_prompts = [prompts[i] for i in idx]
        g_r1 = r1[idx]
        feedback = self._feedback(
            g_rows, g_prompts, [completions[i] for i in idx], [completion_ids[i] for i in idx]
        )

        prompt_texts = [prompt_text(p) for p in g_prompts]
        if self.args.enable_reflection:
            reflection_prompts = [
                reflection_prompt(
                    g_prompts[j],
                    self.args.reflection_system_prompt,
                    attempt=completion_text(completions[i]),
                    feedback=feedback[j],
                    reward=g_r1[j].item(),
                    memory=self._memory_text(prompt_texts[j]),
                )
                for j, i in enumerate(idx)
            ]
            reflection_len = (
                self.args.reflection_max_completion_length or self.args.max_completion_length
            )
            refl_prompt_ids, refl_ids, reflections, refl_logps = self._generate_rows(
                reflection_prompts, reflection_len, generation_budget
            )
        else:  # the ablation: the retry reads the raw feedback where the reflection would be
            reflections = list(feedback)

        retry_prompts = [
            retry_prompt(g_prompts[j], self.args.retry_system_prompt, reflections[j].strip())
            for j in range(len(idx))
        ]
        retry_prompt_ids, retry_ids, retry_texts, retry_logps = self._generate_rows(
            retry_prompts, self.args.max_completion_length, generation_budget
        )

        # r2: the reward functions score y2 against the original row (answer/metadata columns).
        retries = [as_completion(g_prompts[j], retry_texts[j]) for j in range(len(idx))]
        # `attempt` tells reward functions (and their logs) that these are retries.
        retry_rows = [{**row, "attempt": 2} for row in g_rows]
        r2 = self._weighted_reward(
            self._local(super()._calculate_rewards(retry_rows, g_prompts, retries, retry_ids))
        )
        # That call queued completion-table columns and metrics for y2 rows; GRPO already
        # flushed y1's, and y2 rows have no place in its table.
        self._pending_extra_logs.clear()
        self._pending_metrics.clear()

        # A retry no reward function could score (all None -> NaN) carries no signal, as in GRPO.
        scored = [v and r == r for v, r in zip(valid, r2.tolist())]
        advantages = self._global_retry_advantages(
            [json.dumps(p, sort_keys=True, default=str) for p in g_prompts],
            r1=g_r1,
            r2=r2,
            valid=scored,
            scale=self.args.scale_rewards != "none",
            mode=self.args.retry_advantage,
        )
        success = [
            v and reaches_threshold(r, self.args.reward_threshold)
            for v, r in zip(scored, r2.tolist())
        ]
        if self.args.enable_reflection:  # without one there is no lesson to store
            self._remember(
                [(prompt_texts[j], reflections[j].strip()) for j in range(len(idx)) if success[j]]
            )

        # Untrained retries stay as inert rows: every process keeps the same row count.
        trained = list(valid) if self.args.train_retries else [False] * len(valid)
        new_rows = NewRows(
            retry_prompt_ids,
            retry_ids,
            list(advantages),
            list(trained),
            self._trainable(retry_ids),
            retry_logps,
            parts=[PART_RETRY] * len(idx),
        )
        if self.args.enable_reflection:
            reflection_rows = NewRows(
                refl_prompt_ids,
                refl_ids,
                advantages,
                trained,
                self._trainable(refl_ids),
                refl_logps,
                parts=[PART_RETRY] * len(idx),
            )
            reflection_rows.extend(new_rows)
            new_rows = reflection_rows
        internalize = self.args.enable_internalization and self.args.internalization_coef > 0
        kept = [j for j in range(len(idx)) if success[j]] if internalize else []
        if kept:
            original_ids, _, _ = self._tokenize_prompts([g_prompts[j] for j in kept])
            kept_ids = [retry_ids[j] for j in kept]
            # Not sampled from the original prompt: no sampling log-probs (ratio 1, exact CE).
            new_rows.extend(
                NewRows(
                    list(original_ids),
                    kept_ids,
                    [self.args.internalization_coef] * len(kept),
                    [True] * len(kept),
                    self._trainable(kept_ids),
                    parts=[PART_INTERNALIZATION] * len(kept),
                )
            )
        self._log_experience(r2, valid, success, len(kept), new_rows)
        return new_rows

    def _global_retry_advantages(
        self,
        groups: list[str],
        r1: torch.Tensor,
        r2: torch.Tensor,
        valid: list[bool],
        scale: bool,
        mode: str = "group",
    ) -> list[float]:
        """`_retry_advantages` over the retries of every process, sliced back to this one's.

        GRPO's sampler gives each process a contiguous slice of the generation batch, so
        one prompt's generations (and its retries) can live on several processes; like GRPO
        for r1, gather the group keys, r1, r2 and validity and normalise over all of them.
        Every process holds the same number of rows here (padded to the global maximum).
        """
        if self.accelerator.num_processes == 1:
            return _retry_advantages(groups, r1=r1, r2=r2, valid=valid, scale=scale, mode=mode)
        valid_mask = torch.tensor(valid, device=r2.device, dtype=torch.long)
        advantages = _retry_advantages(
            gather_object(groups),
            r1=self.accelerator.gather(r1),
            r2=self.accelerator.gather(r2),
            valid=self.accelerator.gather(valid_mask).bool().tolist(),
            scale=scale,
            mode=mode,
        )
        start = self.accelerator.process_index * len(groups)
        return advantages[start : start + len(groups)]

    def _trainable(self, completion_ids: list[list[int]]) -> list[bool]:
        """Which rows GRPO would train: all, less truncated completions when it masks those
        (`mask_truncated_completions`)."""
        if not self.mask_truncated_completions:
            return [True] * len(completion_ids)
        ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        return [bool(ids) and ids[-1] in ends for ids in completion_ids]

    def _feedback(self, rows, prompts, completions, completion_ids) -> list[str]:
        """One feedback string per completion, from `feedback_func` (or the bare reward)."""
        if self.feedback_func is None:
            return ["No feedback available; the reward was below the target."] * len(prompts)
        # The reward functions' keyword arguments (TRL's _calculate_rewards). Anything it logs
        # through log_extra/log_metric is dropped with the retries' logs (see _experience).
        columns = {
            key: [row[key] for row in rows]
            for key in rows[0]
            if key not in ("prompt", "completion", "completion_ids")
        }
        feedback = self.feedback_func(
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            **columns,
            trainer_state=self.state,
            log_extra=self._log_completion_extra,
            log_metric=self._log_metric,
        )
        name = getattr(self.feedback_func, "__name__", type(self.feedback_func).__name__)
        if not isinstance(feedback, list | tuple) or len(feedback) != len(prompts):
            got = len(feedback) if isinstance(feedback, list | tuple) else type(feedback).__name__
            raise ValueError(
                f"feedback_func '{name}' returned {got} feedback strings, but {len(prompts)} were "
                "expected (one per completion)"
            )
        bad = [type(f).__name__ for f in feedback if not isinstance(f, str)]
        if bad:
            raise ValueError(f"feedback_func '{name}' must return strings, got {bad[0]}")
        return list(feedback)

    def _memory_text(self, text: str) -> str:
        """The `{memory}` of a reflection prompt: the stored reflections `memory_scope` picks."""
        if not self.args.enable_memory:
            return memory_text([])
        return memory_text(
            self.memory.retrieve(text, self.args.memory_top_k, self.args.memory_scope)
        )

    def _remember(self, successes: list[tuple[str, str]]) -> None:
        """Add successful reflections; every process adds the same ones in the same order."""
        if not self.args.enable_memory:
            return
        if self.accelerator.num_processes > 1:
            successes = gather_object(successes)
        for text, reflection in successes:
            self.memory.add(text, reflection, step=self.state.global_step)

    def _log_experience(self, r2, valid, success, num_internalized, new_rows: NewRows) -> None:
        metrics = self._metrics["train"]
        mask = torch.tensor(valid, device=r2.device) & ~torch.isnan(r2)
        stats = torch.tensor(
            [
                r2[mask].sum().item(),
                mask.sum().item(),
                float(sum(success)),
                float(num_internalized),
            ],
            device=r2.device,
        )
        total_r2, total_gated, total_success, total_internalized = self.accelerator.reduce(
            stats, reduction="sum"
        ).tolist()
        metrics["erl/r2_mean"].append(total_r2 / max(total_gated, 1.0))
        metrics["erl/retry_success_rate"].append(total_success / max(total_gated, 1.0))
        metrics["erl/internalization_rows"].append(total_internalized)
        # A metric-only forward, decided from the global count: a forward on some ranks and
        # not others would hang sharded (FSDP/ZeRO-3) training.
        if total_internalized:
            loss = self._global_internalization_loss(new_rows, num_internalized)
            if loss is not None:
                metrics["erl/internalization_loss"].append(loss)

    def _global_internalization_loss(self, rows: NewRows, count: int) -> float | None:
        """The internalization-loss metric over every process's rows (token-weighted)."""
        if self.accelerator.num_processes == 1:
            return self._internalization_loss(rows, count)
        # A process without internalization rows scores one of its other rows, counted for nothing.
        loss = self._internalization_loss(rows, max(count, 1))
        tokens = sum(len(ids) for ids in rows.completion_ids[-count:]) if count else 0
        if loss is None:
            tokens = 0
        stats = torch.tensor(
            [(loss or 0.0) * tokens, float(tokens)], device=self.accelerator.device
        )
        total, all_tokens = self.accelerator.reduce(stats, reduction="sum").tolist()
        return total / all_tokens if all_tokens else None

    @torch.no_grad()
    def _internalization_loss(self, rows: NewRows, count: int) -> float | None:
        """Mean token cross-entropy of (original prompt -> y2), times the coefficient (a metric)."""
        batch = pad_rows(
            NewRows(
                rows.prompt_ids[-count:],
                rows.completion_ids[-count:],
                [0.0] * count,
                [True] * count,
                [True] * count,
            ),
            self._tokenizer.pad_token_id,
            self.accelerator.device,
        )
        logps = self._logps(self.model, batch)
        if logps is None:
            return None
        mask = batch["completion_mask"]
        logps = completion_layout(logps, batch["prompt_mask"], mask.size(1))
        return (
            -(logps * mask).sum() / mask.sum().clamp(min=1)
        ).item() * self.args.internalization_coef

    # Generation ------------------------------------------------------------------------

    def _generate_rows(self, prompts: list, max_new_tokens: int, budget: float):
        """One sample per prompt through the trainer's own generation path (vLLM/Unsloth fast
        generation included); returns prompt ids, completion ids, decoded texts and the
        sampler's per-token log-probs (vLLM's; None per row where the path reports none).

        Without vLLM (which manages its own cache) the prompts are generated in calls of at
        most `budget` bytes (`pipeline.erl.budget`: the memory budget)."""
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        if self.use_vllm:
            plan = [list(range(len(prompt_ids)))]
        else:
            plan = plan_generation(
                [len(p) for p in prompt_ids], max_new_tokens, self._memory_model, budget
            )
            if self.accelerator.num_processes > 1:  # ZeRO-3 gathers weights per call
                count = self.accelerator.gather(torch.tensor([len(plan)], device=self.model.device))
                plan = split_plan(plan, int(count.max()))
        self._generate_calls += len(plan)
        completion_ids, logprobs = [], []
        with self._generation_length(max_new_tokens):
            for rows in plan:
                ids, lps = self._generate_single_turn([prompt_ids[i] for i in rows], None, {}, 1)
                completion_ids += [list(c) for c in ids]
                logprobs += [list(lp) for lp in lps] if lps is not None else [None] * len(rows)
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [list(p) for p in prompt_ids], completion_ids, texts, logprobs

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

    # Training on the merged batch ------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The base trainer's loss, leaving out ERL's inert rows, in micro-batches of at most
        the padded tokens the memory budget allows (a merged chunk holds up to ~4x GRPO's
        rows, and retries have longer prompts), each followed by its backward.

        Every term of the base's loss is counted once for the chunk, as one forward would
        count it (`pipeline.erl.micro_batches`): policy and KL through the advantages and
        beta, the entropy bonus through entropy_coef, the MoE router loss through its
        coefficient; the adaptive entropy controller steps once per optimizer step, and the
        logged metrics get one value per chunk."""
        inert = inputs.get(INERT_KEY)
        if inert is None:  # GRPO's own batch (gate closed, evaluation): untouched
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        budget = int(inputs[TOKEN_BUDGET_KEY])
        inputs = {k: v for k, v in inputs.items() if k not in (INERT_KEY, TOKEN_BUDGET_KEY)}
        # Several processes keep their inert rows (masked, pad-only): every process must pass
        # the same number of rows through the loss, whose metric gathers are collective.
        if not inert.all() and self.accelerator.num_processes == 1:
            inputs = select_rows(inputs, ~inert)  # an all-inert chunk has a zero loss as it is
        pad_id = self._tokenizer.pad_token_id
        if self.accelerator.num_processes == 1:
            plan = plan_micro_batches(inputs, pad_id, budget)
        else:  # the loss's metric gathers need equal micro-batches on every process
            size = rows_per_micro_batch(inputs, pad_id, budget)
            size = self.accelerator.gather(torch.tensor([size], device=inert.device)).min()
            plan = plan_equal_micro_batches(inputs, pad_id, int(size))
        if len(plan) == 1:  # one forward: the base's loss as it is
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        unsloth = unsloth_trainer_active()
        token_mask = loss_token_mask(
            inputs, pad_id, unsloth=unsloth, mask_truncated=bool(self.mask_truncated_completions)
        )
        weights = part_weights(self.args.loss_type, plan, inputs, token_mask)
        parts = [
            micro_batch(inputs, rows, pad_id, unsloth, self.pad_to_multiple_of) for rows in plan
        ]
        # Each micro-batch's loss tokens and rows over every process, for the metric means.
        counts = torch.tensor(
            [[float(token_mask[rows].sum()), float(len(rows))] for rows in plan],
            device=token_mask.device,
        )
        counts = self.accelerator.reduce(counts, reduction="sum")
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics[mode]
        before = {key: len(values) for key, values in metrics.items()}
        # No base call (and no backward of ERL's) runs at the accumulation boundary: TRL's
        # adaptive entropy controller would step once per call there (it steps once below),
        # and under DeepSpeed a backward there steps the optimizer.
        sync, self.accelerator.sync_gradients = self.accelerator.sync_gradients, False
        try:
            done = None
            for part, weight in zip(parts[:-1], weights[:-1]):
                loss = self._weighted_loss(model, part, weight, return_outputs, num_items_in_batch)
                # What Trainer.training_step does with the returned loss, for the parts it never sees.
                with self.accelerator.no_sync(model):
                    self.accelerator.backward(loss * self._returned_loss_scale(num_items_in_batch))
                done = loss.detach() if done is None else done + loss.detach()
            loss = self._weighted_loss(
                model, parts[-1], weights[-1], return_outputs, num_items_in_batch
            )
        finally:
            self.accelerator.sync_gradients = sync
        collapse_metrics(
            metrics,
            before,
            weights,
            tokens=counts[:, 0].tolist(),
            rows=counts[:, 1].tolist(),
            unsloth=unsloth,
            sequence_level=self.importance_sampling_level == "sequence",
        )
        # Unsloth's loss has no adaptive control and logs no entropy_coef.
        if sync and mode == "train" and not unsloth and self._entropy_bonus_enabled:
            if self.use_adaptive_entropy:
                self._adaptive_entropy_step()
            metrics["entropy_coef"].append(self.entropy_coef)  # TRL logs it at the boundary
        return loss + done

    def _weighted_loss(self, model, part, weight: PartWeights, return_outputs, num_items_in_batch):
        """The base loss of micro-batch `part`, each term weighted by its share of the chunk.

        The weights go into what the base reads at call time (advantages, beta, entropy_coef,
        router_aux_loss_coef), not onto the returned loss: Unsloth's loss functions hand
        autograd gradients computed in their forward and ignore the upstream gradient in
        their backward, so a scaled loss kept its unscaled gradient. Every supported loss
        is linear in (advantages, beta) for a positive weight: the clipped surrogate, the
        KL term and the normalisers; clipping and masks read only the advantages' sign."""
        saved = self.beta, self.entropy_coef, self.router_aux_loss_coef
        part = {**part, "advantages": part["advantages"] * weight.policy}
        self.beta = self.beta * weight.policy
        self.entropy_coef = self.entropy_coef * weight.entropy
        self.router_aux_loss_coef = self.router_aux_loss_coef * weight.aux
        try:
            return super().compute_loss(model, part, return_outputs, num_items_in_batch)
        finally:
            self.beta, self.entropy_coef, self.router_aux_loss_coef = saved

    def _adaptive_entropy_step(self) -> None:
        """TRL 1.15's adaptive entropy controller step (the end of GRPOTrainer._compute_loss),
        once per optimizer step, on the entropy of the whole accumulation window: every
        micro-batch added its sums to the window, since none ran at the boundary."""
        if self._entropy_window_stats is None:
            return
        window = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
        world_entropy = (window[0] / window[1].clamp(min=1.0)).item()
        args = self.args
        if world_entropy <= args.entropy_target:
            self.entropy_coef = min(
                self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max
            )
        else:
            self.entropy_coef = max(
                self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min
            )
        self._last_world_entropy = world_entropy
        self._entropy_window_stats = None

    def _returned_loss_scale(self, num_items_in_batch) -> float:
        """The factor Trainer.training_step (transformers 5.17, and Unsloth's rewrite of it)
        applies to compute_loss's value before its backward."""
        if (
            not self.model_accepts_loss_kwargs or num_items_in_batch is None
        ) and self.compute_loss_func is None:
            return 1.0 / self.current_gradient_accumulation_steps
        return 1.0

    @torch.no_grad()
    def _logps(self, model, batch: dict) -> torch.Tensor:
        """Per-token log-probs of the completions, in forwards of at most
        `per_device_train_batch_size` rows, and for a merged batch of at most the padded
        tokens the memory budget allows a loss forward."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        rows = self.args.per_device_train_batch_size
        if TOKEN_BUDGET_KEY in batch:
            rows = max(1, int(batch[TOKEN_BUDGET_KEY]) // input_ids.size(1))
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=rows
        )
        return logps

    def _ref_logps(self, batch: dict) -> torch.Tensor:
        """Reference-model log-probs, obtained the way GRPOTrainer obtains them."""
        if self.ref_model is not None:
            return self._logps(self.ref_model, batch)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._logps(self.model, batch)

    # Small helpers -----------------------------------------------------------------------

    def _local(self, gathered: torch.Tensor) -> torch.Tensor:
        """This process's rows of a tensor gathered over processes."""
        n = gathered.size(0) // self.accelerator.num_processes
        start = self.accelerator.process_index * n
        return gathered[start : start + n]

    def _weighted_reward(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """GRPO's scalar reward: the weighted nansum over functions (NaN where all are NaN)."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards


def _retry_advantages(
    groups: list[str],
    r1: torch.Tensor,
    r2: torch.Tensor,
    valid: list[bool],
    scale: bool,
    mode: str = "group",
) -> list[float]:
    """Advantage of each retry. `mode="group"`: r2 normalised within the retries of the
    same prompt, a retry alone in its group r2 - r1. `mode="improvement"`: r2 - r1 for
    every retry (a group whose retries all succeed would otherwise get 0 everywhere)."""
    members: dict[str, list[int]] = defaultdict(list)
    for j, (key, ok) in enumerate(zip(groups, valid)):
        if ok:
            members[key].append(j)
    advantages = [0.0] * len(groups)
    r1, r2 = torch.nan_to_num(r1), torch.nan_to_num(r2)
    for rows in members.values():
        if len(rows) == 1 or mode == "improvement":
            for j in rows:
                advantages[j] = (r2[j] - r1[j]).item()
            continue
        values = r2[rows]
        centred = values - values.mean()
        if scale:
            centred = centred / (values.std() + 1e-4)
        for j, a in zip(rows, centred.tolist()):
            advantages[j] = a
    return advantages


def _float_bytes(model) -> int:
    """Bytes of the model's floating-point values (a 4-bit model computes in its compute dtype)."""
    dtype = next((p.dtype for p in model.parameters() if p.dtype.is_floating_point), torch.float32)
    return torch.finfo(dtype).bits // 8
