"""`ERLTrainer`: TRL's GRPOTrainer plus Experiential RL.

Per generation batch, after GRPO has generated and scored the first attempts y1:

1. first attempt: y1, reward r1 (GRPO's weighted reward) and feedback from `feedback_func`;
2. gating: rows with r1 < `reward_threshold` go on;
3. reflection: one generation per gated row from `reflection_system_prompt`, with the
   `memory_top_k` stored reflections most relevant to the prompt;
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
unchanged. Evaluation never reflects: deployment sees first attempts only.

The class is defined at import, after `activate_backend()`: on a GPU with Unsloth the
base is Unsloth's patched GRPOTrainer (it rebinds `trl.GRPOTrainer`).
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipeline.backend import activate_backend, check_trainer_base

activate_backend()  # before trl: on a GPU, Unsloth rebinds trl.GRPOTrainer

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl.data_utils import is_conversational  # noqa: E402
from trl.trainer.utils import pad, use_adapter  # noqa: E402

from pipeline.erl_config import ERLConfig  # noqa: E402
from pipeline.memory import ReflectionMemory  # noqa: E402
from rewards import completion_text  # noqa: E402

FeedbackFunc = Callable[..., list[str]]

# Batch keys whose rows ERL knows how to extend; anything else (images, tool masks) is refused.
_ROW_KEYS = {
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "max_left_pad",
}
_SCALAR_KEYS = {"num_items_in_batch"}


@dataclass
class _NewRows:
    """Rows ERL adds to a generation batch (token ids as lists, one advantage each)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: list[float]
    valid: list[bool]  # False for rows that only equalise row counts across processes

    def extend(self, other: _NewRows) -> None:
        self.prompt_ids += other.prompt_ids
        self.completion_ids += other.completion_ids
        self.advantages += other.advantages
        self.valid += other.valid


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
        super().__init__(model, reward_funcs, args, *positional, **kwargs)
        self.feedback_func = feedback_func
        self.memory = ReflectionMemory(args.memory_size if args.enable_memory else 0)
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
        gated = [
            i for i, r in enumerate(r1.tolist()) if r < threshold
        ]  # NaN (unscorable) never gates

        metrics = self._metrics["train"]
        all_r1 = self.accelerator.gather(r1)
        metrics["erl/r1_mean"].append(torch.nanmean(all_r1).item())
        num_gated = self.accelerator.gather(torch.tensor([len(gated)], device=r1.device))
        metrics["erl/gated_fraction"].append(num_gated.sum().item() / all_r1.numel())
        if num_gated.max().item() > 0:
            new_rows = self._experience(
                rows,
                prompts,
                completions,
                completion_ids,
                r1,
                gated,
                pad_to=int(num_gated.max().item()),
            )
            output = self._merge_rows(output, new_rows)
        else:
            metrics["erl/internalization_rows"].append(0.0)
        metrics["erl/memory_size"].append(float(len(self.memory)))
        return output

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model as GRPOTrainer does, plus the reflection memory beside it."""
        super().save_model(output_dir, _internal_call)  # checkpoints go through here too
        if self.args.should_save:
            self.memory.save(output_dir or self.args.output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.memory.load(checkpoint)

    # The ERL phases --------------------------------------------------------------------

    def _experience(
        self, rows, prompts, completions, completion_ids, r1, gated, pad_to
    ) -> _NewRows:
        """Phases 1-7 for the gated rows; returns the reflection, retry and internalization rows."""
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

        prompt_texts = [_prompt_text(p) for p in g_prompts]
        reflection_prompts = [
            self._as_prompt(
                g_prompts[j],
                self.args.reflection_system_prompt.format(
                    prompt=prompt_texts[j],
                    attempt=completion_text(completions[i]),
                    feedback=feedback[j],
                    reward=g_r1[j].item(),
                    memory=self._memory_text(prompt_texts[j]),
                ),
            )
            for j, i in enumerate(idx)
        ]
        reflection_len = (
            self.args.reflection_max_completion_length or self.args.max_completion_length
        )
        refl_prompt_ids, refl_ids, reflections = self._generate_rows(
            reflection_prompts, reflection_len
        )

        retry_prompts = [
            self._retry_prompt(g_prompts[j], reflections[j].strip()) for j in range(len(idx))
        ]
        retry_prompt_ids, retry_ids, retry_texts = self._generate_rows(
            retry_prompts, self.args.max_completion_length
        )

        # r2: the reward functions score y2 against the original row (answer/metadata columns).
        retries = [_as_completion(g_prompts[j], retry_texts[j]) for j in range(len(idx))]
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
        advantages = _retry_advantages(
            [json.dumps(p, sort_keys=True, default=str) for p in g_prompts],
            r1=g_r1,
            r2=r2,
            valid=scored,
            scale=self.args.scale_rewards != "none",
            mode=self.args.retry_advantage,
        )
        success = [v and r >= self.args.reward_threshold for v, r in zip(scored, r2.tolist())]
        self._remember(
            [(prompt_texts[j], reflections[j].strip()) for j in range(len(idx)) if success[j]]
        )

        new_rows = _NewRows(refl_prompt_ids, refl_ids, advantages, self._trainable(refl_ids, valid))
        new_rows.extend(
            _NewRows(
                retry_prompt_ids, retry_ids, list(advantages), self._trainable(retry_ids, valid)
            )
        )
        internalize = self.args.enable_internalization and self.args.internalization_coef > 0
        kept = [j for j in range(len(idx)) if success[j]] if internalize else []
        if kept:
            original_ids, _, _ = self._tokenize_prompts([g_prompts[j] for j in kept])
            kept_ids = [retry_ids[j] for j in kept]
            new_rows.extend(
                _NewRows(
                    list(original_ids),
                    kept_ids,
                    [self.args.internalization_coef] * len(kept),
                    self._trainable(kept_ids, [True] * len(kept)),
                )
            )
        self._log_experience(r2, valid, success, len(kept), new_rows)
        return new_rows

    def _trainable(self, completion_ids: list[list[int]], valid: list[bool]) -> list[bool]:
        """Which rows enter the loss: valid ones, less truncated completions when GRPO masks
        those (`mask_truncated_completions`)."""
        if not self.mask_truncated_completions:
            return list(valid)
        ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        return [ok and bool(ids) and ids[-1] in ends for ok, ids in zip(valid, completion_ids)]

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

    def _memory_text(self, prompt_text: str) -> str:
        lessons = (
            self.memory.retrieve(prompt_text, self.args.memory_top_k)
            if self.args.enable_memory
            else []
        )
        return "\n".join(f"- {lesson}" for lesson in lessons) if lessons else "(none yet)"

    def _remember(self, successes: list[tuple[str, str]]) -> None:
        """Add successful reflections; every process adds the same ones in the same order."""
        if not self.args.enable_memory:
            return
        if self.accelerator.num_processes > 1:
            successes = gather_object(successes)
        for prompt_text, reflection in successes:
            self.memory.add(prompt_text, reflection, step=self.state.global_step)

    def _log_experience(self, r2, valid, success, num_internalized, new_rows: _NewRows) -> None:
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
        # A metric-only forward; single-process only, since a forward on some ranks and not
        # others would hang sharded (FSDP/ZeRO-3) training.
        single = self.accelerator.num_processes == 1
        loss = (
            self._internalization_loss(new_rows, num_internalized)
            if num_internalized and single
            else None
        )
        if loss is not None:
            metrics["erl/internalization_loss"].append(loss)

    @torch.no_grad()
    def _internalization_loss(self, rows: _NewRows, count: int) -> float | None:
        """Mean token cross-entropy of (original prompt -> y2), times the coefficient (a metric)."""
        batch = _pad_rows(
            rows.prompt_ids[-count:],
            rows.completion_ids[-count:],
            [True] * count,
            self._tokenizer.pad_token_id,
            self.accelerator.device,
        )
        logps = self._logps(self.model, batch)
        mask = batch["completion_mask"]
        if logps is None or logps.shape != mask.shape:
            return None  # Unsloth's GPU scorer returns a packed layout; the metric is skipped there
        return (
            -(logps * mask).sum() / mask.sum().clamp(min=1)
        ).item() * self.args.internalization_coef

    # Generation ------------------------------------------------------------------------

    def _generate_rows(self, prompts: list, max_new_tokens: int):
        """One sample per prompt through the trainer's own generation path (vLLM/Unsloth fast
        generation included); returns prompt ids, completion ids and decoded texts."""
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        with self._generation_length(max_new_tokens):
            completion_ids, _ = self._generate_single_turn(prompt_ids, None, {}, 1)
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [list(p) for p in prompt_ids], [list(c) for c in completion_ids], texts

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

    @staticmethod
    def _as_prompt(original, text: str):
        """A prompt in the dataset's format: one user message, or plain text."""
        return (
            [{"role": "user", "content": text}] if is_conversational({"prompt": original}) else text
        )

    def _retry_prompt(self, original, reflection: str):
        """The original prompt with its last turn rewritten by the retry template: a
        conversation keeps its system message, so the retry asks the task as before."""
        template = self.args.retry_system_prompt
        if not is_conversational({"prompt": original}):
            return template.format(prompt=original, reflection=reflection)
        *context, last = original
        return [
            *context,
            {**last, "content": template.format(prompt=last["content"], reflection=reflection)},
        ]

    # Merging rows into GRPO's batch ----------------------------------------------------

    def _merge_rows(self, output: dict, rows: _NewRows) -> dict:
        """Append `rows` to GRPO's batch: re-pad, give them every per-row tensor the batch
        has, pad the row count to a multiple of `steps_per_generation` (TRL drops the rest
        when it splits the batch) and recount `num_items_in_batch`."""
        unknown = sorted(set(output) - _ROW_KEYS - _SCALAR_KEYS)
        if unknown:
            raise NotImplementedError(
                f"ERLTrainer cannot add rows to a batch with {unknown} "
                "(multimodal or tool batches are not supported)"
            )
        device = output["prompt_ids"].device
        # Pad the new rows so that every process adds the same number, a multiple of the split.
        counts = self.accelerator.gather(torch.tensor([len(rows.valid)], device=device))
        target = int(counts.max().item())
        total = output["prompt_ids"].size(0) + target
        target += -total % self.args.steps_per_generation
        filler = target - len(rows.valid)
        rows.extend(
            _NewRows(
                [rows.prompt_ids[0]] * filler,
                [rows.completion_ids[0]] * filler,
                [0.0] * filler,
                [False] * filler,
            )
        )
        new = _pad_rows(
            rows.prompt_ids, rows.completion_ids, rows.valid, self._tokenizer.pad_token_id, device
        )
        new["advantages"] = torch.tensor(
            rows.advantages, device=device, dtype=output["advantages"].dtype
        )

        pad_id = self._tokenizer.pad_token_id
        merged = {
            "prompt_ids": _cat_padded(output["prompt_ids"], new["prompt_ids"], pad_id, "left"),
            "prompt_mask": _cat_padded(output["prompt_mask"], new["prompt_mask"], 0, "left"),
            "completion_ids": _cat_padded(
                output["completion_ids"], new["completion_ids"], pad_id, "right"
            ),
            "completion_mask": _cat_padded(
                output["completion_mask"], new["completion_mask"], 0, "right"
            ),
            "advantages": torch.cat([output["advantages"], new["advantages"]]),
        }
        # Optional tensors exist only in some configurations (vLLM, beta > 0, generation
        # reuse): the merged batch has one exactly when GRPO's batch has it. Old and
        # reference log-probs are recomputed over the whole merged batch: GRPO's rows were
        # re-padded, and the backend's own scorer (TRL's, or Unsloth's packed layout) must
        # see one consistent batch. New rows are sampled by the current policy, so their
        # sampling log-probs are the current ones and no vLLM correction applies (ratio 1).
        rows_before = output["prompt_ids"].size(0)
        has = {
            k
            for k in (
                "old_per_token_logps",
                "ref_per_token_logps",
                "sampling_per_token_logps",
                "importance_sampling_ratio",
            )
            if output.get(k) is not None
        }
        if has & {"old_per_token_logps", "sampling_per_token_logps"}:
            current = self._logps(self.model, merged)
            if "old_per_token_logps" in has:
                merged["old_per_token_logps"] = current
            if "sampling_per_token_logps" in has:
                sampling = output["sampling_per_token_logps"]
                merged["sampling_per_token_logps"] = _cat_padded(
                    sampling, current[rows_before:].to(sampling.dtype), 0.0, "right"
                )
        if "ref_per_token_logps" in has:
            merged["ref_per_token_logps"] = self._ref_logps(merged)
        if "importance_sampling_ratio" in has:
            ratio = output["importance_sampling_ratio"]  # (B, T) per token or (B, 1) per sequence
            width = 1 if ratio.size(1) == 1 else new["completion_ids"].size(1)
            ones = torch.ones(
                new["completion_ids"].size(0), width, device=device, dtype=ratio.dtype
            )
            merged["importance_sampling_ratio"] = _cat_padded(ratio, ones, 1.0, "right")
        if "max_left_pad" in output:  # Unsloth: the widest left padding of the batch, per row
            left_pad = int((merged["prompt_mask"] == 0).sum(dim=1).max().item())
            merged["max_left_pad"] = torch.full(
                (merged["prompt_ids"].size(0), 1), left_pad, dtype=output["max_left_pad"].dtype
            )
        merged["num_items_in_batch"] = self.accelerator.gather(
            merged["completion_mask"].sum()
        ).sum()
        return merged

    @torch.no_grad()
    def _logps(self, model, batch: dict) -> torch.Tensor:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size,
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


def _pad_rows(prompt_ids, completion_ids, valid, pad_id, device) -> dict:
    """Left-padded prompts and right-padded completions; invalid rows are fully masked."""
    prompts = [torch.tensor(p, dtype=torch.long) for p in prompt_ids]
    completions = [torch.tensor(c if c else [pad_id], dtype=torch.long) for c in completion_ids]
    completion_mask = [
        torch.full_like(c, int(ok and len(raw) > 0))
        for c, raw, ok in zip(completions, completion_ids, valid)
    ]
    return {
        "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left").to(device),
        "prompt_mask": pad(
            [torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"
        ).to(device),
        "completion_ids": pad(completions, padding_value=pad_id, padding_side="right").to(device),
        "completion_mask": pad(completion_mask, padding_value=0, padding_side="right").to(device),
    }


def _cat_padded(a: torch.Tensor, b: torch.Tensor, value, side: str) -> torch.Tensor:
    """Concatenate two (rows, length) tensors along rows, padding the shorter length."""
    width = max(a.size(1), b.size(1))

    def widen(t: torch.Tensor) -> torch.Tensor:
        extra = width - t.size(1)
        if extra == 0:
            return t
        filler = torch.full((t.size(0), extra), value, dtype=t.dtype, device=t.device)
        return torch.cat([filler, t] if side == "left" else [t, filler], dim=1)

    return torch.cat([widen(a), widen(b).to(a.device)], dim=0)


def _prompt_text(prompt) -> str:
    """A prompt as plain text for the templates (conversational: the non-assistant turns)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m["content"]) for m in prompt if m.get("role") != "assistant")


def _as_completion(prompt, text: str):
    """A completion in the format the reward functions get for this dataset."""
    return (
        [{"role": "assistant", "content": text}] if is_conversational({"prompt": prompt}) else text
    )
