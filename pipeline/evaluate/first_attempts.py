"""First-attempt evaluation: the deployment view of a policy, without reflection.

The model answers held-out prompts of one task level ONCE; each completion is scored by
the task's verifier. `mean_reward` is the mean task reward (or, given `weights`, the mean
weighted reward exactly as GRPO computes r1) and `success_rate` the share solved.

    model, tokenizer = load_for_evaluation("runs/demo/final")
    result = evaluate_first_attempts(model, tokenizer, get_task("arithmetic"), level=1, n=64)
    print(result.mean_reward, result.success_rate)

Held-out prompts: row i of an evaluation at `level` is drawn with
`Random(EVAL_SEED_BASE + EVAL_SEED_STRIDE * level + i)` (see `held_out_seed`). Training
rows must use seeds below `EVAL_SEED_BASE` (10**6) so that the two never share a draw.
Disjoint seeds do not make disjoint problems when a level has few distinct problems, so
`trained` (the prompts the run trained on, `pipeline.evaluate.held_out`) are skipped and
drawn again; where a level has too few others (arithmetic level 1 has 100 sums) they are
kept and counted in `EvalResult.trained`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from curriculum.tasks.agent import is_agent_task
from curriculum.tasks.base import HELD_OUT_SEED_BASE, Row, Task
from pipeline.erl.prompts import prompt_text
from pipeline.evaluate.held_out import held_out_rows
from pipeline.layout import CHECKPOINTS_DIR
from pipeline.models.backend import activate_backend
from rewards import Scorer, build_reward_funcs

logger = logging.getLogger(__name__)

EVAL_SEED_BASE = HELD_OUT_SEED_BASE
"""Evaluation seeds start here; training seeds stay below it (the Task API's constant)."""
EVAL_SEED_STRIDE = 10**4
"""Seed distance between levels, so that evaluations of up to 10,000 rows never overlap."""


def held_out_seed(level: int) -> int:
    """The default seed of the held-out prompts at `level` (disjoint from training seeds)."""
    return EVAL_SEED_BASE + EVAL_SEED_STRIDE * level


@dataclass
class EvalResult:
    """First-attempt scores of one task level, with a few samples for the logs."""

    task: str
    level: int | None
    n: int
    mean_reward: float
    success_rate: float
    failure_rate: float
    """Share of completions that could not be scored (no parse, verifier error)."""
    seed: int | None = None
    trained: int = 0
    """Prompts the run had trained on, kept because the level has too few others."""
    rewards: list[float] = field(default_factory=list, repr=False)
    """Per-completion rewards, in prompt order (left out of `to_dict` to keep logs small)."""
    samples: list[dict[str, Any]] = field(default_factory=list, repr=False)
    """The first few (prompt, completion, reward, solved, feedback) records."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the summary and the samples."""
        out = asdict(self)
        del out["rewards"]
        return out


# Scoring ---------------------------------------------------------------------------


def score_completions(
    task: Task,
    rows: Sequence[Row],
    completions: Sequence[str],
    *,
    weights: Mapping[str, float] | None = None,
    environment_weight: float = 0.0,
    seed: int | None = None,
    num_samples: int = 4,
) -> EvalResult:
    """Score one completion per row with `task`; never raises on the completions.

    A completion that cannot be scored counts reward 0 and unsolved (with `weights`, the
    reward functions' fallback). `weights` maps signal names to weights as in training;
    with them, an agent task's environment that has `get_reward` adds it at
    `environment_weight` (what training gave it: `agent.ENVIRONMENT_REWARD_WEIGHT`, as the
    run records in run_config.json), so the reward is the one training summed.
    """
    if len(rows) != len(completions):
        raise ValueError(f"{len(rows)} rows but {len(completions)} completions")
    # An agent task's completions are episodes (lists of messages): the scorer hands them to
    # the task as they are; anything else that is not text is scored as its text.
    agent = is_agent_task(task)
    texts = [c if isinstance(c, str) or agent else str(c) for c in completions]
    columns: dict[str, Any] = {
        name: [row[name] for row in rows] for name in ("task", "level", "answer", "meta")
    }
    columns["prompts"] = [row.get("prompt") for row in rows]
    # The Scorer is what training uses: it turns a raising verifier or an out-of-range value
    # into a counted failure instead of an exception.
    scorer = Scorer(task)
    results = scorer.score("evaluation", texts, columns).results
    if weights is None:
        rewards = [0.0 if r.kind is not None else float(r.evaluation.reward) for r in results]
    else:
        funcs, func_weights = build_reward_funcs(task, weights, scorer=scorer)
        rewards = [0.0] * len(texts)
        for func, weight in zip(funcs, func_weights):
            for i, value in enumerate(func(completions=texts, **columns)):
                rewards[i] += weight * value
        if agent and environment_weight:
            for i, row in enumerate(rows):
                rewards[i] += environment_weight * task.environment_reward(row, texts[i])
    solved = [r.kind is None and r.evaluation.solved for r in results]
    failures = sum(r.kind is not None for r in results)
    n = len(texts)
    levels = {row["level"] for row in rows}
    samples = [
        {
            "prompt": prompt_text(rows[i]["prompt"]),
            "completion": texts[i],
            "answer": rows[i]["answer"],
            "reward": rewards[i],
            "solved": solved[i],
            "feedback": results[i].failure or results[i].evaluation.feedback_text(),
        }
        for i in range(min(num_samples, n))
    ]
    return EvalResult(
        task=task.name,
        level=levels.pop() if len(levels) == 1 else None,
        n=n,
        mean_reward=sum(rewards) / n if n else 0.0,
        success_rate=sum(solved) / n if n else 0.0,
        failure_rate=failures / n if n else 0.0,
        seed=seed,
        rewards=rewards,
        samples=samples,
    )


# Generation ------------------------------------------------------------------------


def generate_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    *,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> list[str]:
    """One completion per conversational prompt: chat template, left padding, `generate`.

    Greedy unless `do_sample`; sampling is seeded without touching the caller's RNG. The
    model runs in eval mode and gets its training mode back afterwards.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import GenerationConfig

    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(
            f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens} and {batch_size}"
        )
    if do_sample and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    # Stop at the tokenizer's eos and at whatever the checkpoint itself lists as eos
    # (Qwen instruct models list <|im_end|> and <|endoftext|>).
    eos_ids = _as_list(tokenizer.eos_token_id) + _as_list(model.generation_config.eos_token_id)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_p=None,
        top_k=None,
        eos_token_id=sorted(set(eos_ids)),
        pad_token_id=pad_id,
    )
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    device = next(model.parameters()).device
    was_training, padding_side = model.training, tokenizer.padding_side
    completions: list[str] = []
    model.eval()
    tokenizer.padding_side = "left"  # generation appends on the right
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            batches = range(0, len(texts), batch_size)
            for start in tqdm(batches, desc="evaluating", disable=not progress, leave=False):
                # The template already holds the special tokens a chat model expects.
                batch = tokenizer(
                    texts[start : start + batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                ).to(device)
                with torch.no_grad():
                    output = model.generate(**batch, generation_config=config)
                new_tokens = output[:, batch["input_ids"].shape[1] :]
                completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = padding_side
    return completions


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def evaluate_first_attempts(
    model: Any,
    tokenizer: Any,
    task: Task,
    level: int,
    n: int,
    *,
    seed: int | None = None,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    weights: Mapping[str, float] | None = None,
    environment_weight: float = 0.0,
    trained: Collection[str] = (),
    progress: bool = True,
    num_samples: int = 4,
    max_turns: int | None = None,
) -> EvalResult:
    """Mean reward and success rate of the model's single answers to `n` held-out prompts.

    `seed` None takes `held_out_seed(level)`. `trained`: prompt keys the run trained on
    (`held_out.trained_prompts`), skipped where the level has others. No reflection, no
    retry: what a user sees. An agent task's first attempt is a whole episode
    (`pipeline.evaluate.episodes`): `max_new_tokens` is its token budget after the prompt,
    tool replies included, and `max_turns` its rounds of tool calls (None: the task's
    largest turn limit). `weights` and `environment_weight`: as `score_completions`.
    """
    task.check_level(level)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    seed = held_out_seed(level) if seed is None else seed
    rows, overlap = held_out_rows(task, level, n, seed, trained)
    sampling = dict(batch_size=batch_size, do_sample=do_sample, temperature=temperature, seed=seed)
    if is_agent_task(task):  # whole episodes; max_new_tokens is each one's budget after the prompt
        from pipeline.evaluate.episodes import play_episodes

        completions = play_episodes(
            model,
            tokenizer,
            task,
            rows,
            max_completion_length=max_new_tokens,
            max_turns=max_turns,
            progress=progress,
            **sampling,
        )
    else:
        completions = generate_completions(
            model,
            tokenizer,
            [row["prompt"] for row in rows],
            max_new_tokens=max_new_tokens,
            progress=progress,
            **sampling,
        )
    result = score_completions(
        task,
        rows,
        completions,
        weights=weights,
        environment_weight=environment_weight,
        seed=seed,
        num_samples=num_samples,
    )
    result.trained = overlap
    return result


# Loading ---------------------------------------------------------------------------


def resolve_checkpoint(path_or_id: str) -> str:
    """The model folder `path_or_id` stands for: itself when it holds a model or an adapter,
    else its newest complete trainer checkpoint (`checkpoint-N` in it or in its
    `checkpoints/`, as in an interrupted stage; `pipeline.layout.checkpoint_is_complete`),
    naming any newer one it passed over; hub ids come back unchanged."""
    from pipeline.layout import newest_complete_checkpoint

    path = Path(path_or_id)
    if not path.is_dir():
        return path_or_id
    if _holds_model(path):
        return str(path)
    checkpoint, passed_over = newest_complete_checkpoint(path, path / CHECKPOINTS_DIR)
    for cut in passed_over:
        print(f"note: passing over {cut}: its save did not finish", file=sys.stderr)
    if checkpoint is not None:
        return str(checkpoint)
    if passed_over:
        raise ValueError(
            f"{path_or_id} holds no complete checkpoint: the save of {passed_over[0].name} did "
            "not finish; evaluate an earlier stage or the warm-up, or resume the run"
        )
    raise ValueError(
        f"{path_or_id} holds no model: expected config.json (full model), adapter_config.json "
        "(PEFT adapter) or checkpoint-N subfolders (also under checkpoints/) holding one"
    )


def _holds_model(path: Path) -> bool:
    return (path / "config.json").exists() or (path / "adapter_config.json").exists()


def load_for_evaluation(
    path_or_id: str, backend: str | None = None, load_in_4bit: bool | None = None
) -> tuple[Any, Any]:
    """Load a full model folder, a PEFT adapter folder, a run's stage folder or a hub id.

    `backend` None keeps the process's active backend (or `ERL_BACKEND`, default auto);
    it is activated before anything loads, because Unsloth must be imported first.
    `load_in_4bit` None loads the base in 4-bit when the adapter folder records that it was
    trained on one (`pipeline.models.quantization.BASE_QUANTIZATION_FILE`); True also loads a
    plain model or hub id in 4-bit, as the base of a 4-bit run was.
    Returns (model, tokenizer) with left padding, on the GPU when there is one.
    """
    activate_backend(backend)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.models.quantization import (
        base_model_kwargs,
        disable_cpu_weight_packing,
        recorded_4bit,
    )

    folder = resolve_checkpoint(path_or_id)
    if load_in_4bit is None:
        load_in_4bit = recorded_4bit(folder)
    kwargs: dict[str, Any] = {"trust_remote_code": False, **base_model_kwargs(load_in_4bit)}
    if torch.cuda.is_available():
        # device_map rather than .to(): a 4-bit base cannot be moved after loading.
        kwargs["device_map"] = "cuda"
    adapter = Path(folder, "adapter_config.json")
    if adapter.exists():
        from peft import AutoPeftModelForCausalLM, PeftConfig

        model = AutoPeftModelForCausalLM.from_pretrained(folder, **kwargs)
        # Trainers save the tokenizer beside the adapter; a bare adapter uses the base's.
        has_tokenizer = Path(folder, "tokenizer_config.json").exists()
        tokenizer_source = (
            folder if has_tokenizer else PeftConfig.from_pretrained(folder).base_model_name_or_path
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        tokenizer_source = folder
    if load_in_4bit:
        disable_cpu_weight_packing(model)  # evaluate the layout that was trained
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.eval()
    logger.info("loaded %s for evaluation%s", folder, " (4-bit base)" if load_in_4bit else "")
    return model, tokenizer
