"""The learning bench's arms: its settings, one schedule for every arm, cache keys, training.

Every arm of a comparison trains from one warm checkpoint on the same rows in the same
order, with the same optimizer and learning-rate schedule (`common_args`: the schedule's
shape and horizon, `--steps`, are every arm's; an arm stopped early with `--stop` keeps the
schedule and is cut off). Only the peak learning rate is the arm's own: each arm runs at
its best rate from a sweep (`Settings.learning_rate`). `tests/test_learning_bench.py`
builds every arm's config and steps the schedulers to check it. A run's cache key hashes
everything its result depends on (`run_key`), and the warm checkpoint's key hashes its
data and its SFT config.

A new arm is one line in `ARMS`, `ABLATIONS` or `VARIANTS`: the trainer, its options, and
`lr_from`, the swept arm whose learning rate it takes until it is swept itself. What is
still being tried and is no ERLConfig option reaches the trainer through its hooks: the
memory's own options (`memory=`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.models.backend import activate_backend

activate_backend("transformers")  # a CPU bench: TRL's SDPO trainer is not Unsloth's

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from learning_steps import STEPS  # noqa: E402  (bench/, the script's own folder)
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from curriculum.controller import CurriculumConfig, promotion_reached  # noqa: E402
from curriculum.tasks import get_task  # noqa: E402
from pipeline import ERLConfig  # noqa: E402
from pipeline.erl.memory import PAPER_POLICY, ReflectionMemory  # noqa: E402
from pipeline.erl.step import retry_advantages  # noqa: E402
from pipeline.evaluate.first_attempts import (  # noqa: E402
    evaluate_first_attempts,
    generate_completions,
    score_completions,
)
from pipeline.run.methods import CountingERLTrainer  # noqa: E402
from rewards import Scorer, build_feedback_func, build_reward_funcs  # noqa: E402

BENCH_SCHEMA = 4
"""Part of every cache key: bump it on any change to how a run trains or what it records."""

# Short templates: the tiny model reads these; the defaults are written for real LLMs.
REFLECTION_TEMPLATE = (
    "{prompt}\nAttempt: {attempt}\nFeedback: {feedback}\nReward: {reward:.1f}\n"
    "Lessons:\n{memory}\nFix:"
)
RETRY_TEMPLATE = "{prompt}\nHint: {reflection}"
# The retry reads its own attempt's feedback too, first, then the lesson, as one hint (each
# is a text the warm-up shows as a hint).
RETRY_FEEDBACK_TEMPLATE = "{prompt}\nHint: {feedback} {reflection}"
REWARDS = {  # --reward
    "binary": {"correctness": 1.0},  # the sparse right/wrong reward
    "partial": {"correctness": 0.8, "milestones": 0.2},  # closeness as partial credit
}
FEEDBACK = {  # --style: what the feedback reports (it may name more signals than the reward)
    "distance": {"correctness": 1.0, "milestones": 1.0},  # "too low ... off by 3"
    "reveal": {"correctness": 1.0},  # with reveal_answer: "The correct answer is 8."
    "rule": {"correctness": 1.0},  # hidden_rule: "The answer 7 is wrong: it is 2 too low."
    "code": {"correctness": 1.0},  # hidden_code: "The answer 5 2 7 is wrong: Q means 3, ..."
}
# The families whose rule or code a rule seed picks (`--rules LEVEL:RULE_SEED`), each with a
# held-out split the evaluation lists whole (`task.split_rows`).
RULE_TASKS = ("hidden_rule", "hidden_code")


@dataclass(frozen=True)
class Arm:
    """One way to train: ERLTrainer with `overrides`, or TRL's SDPOTrainer given `context`."""

    trainer: str = "erl"  # "erl" | "sdpo"
    overrides: tuple = ()  # ERLConfig (or SDPOConfig) options, as sorted (name, value) pairs
    matched: bool = False  # --matched_generations completions per prompt, same prompts/step
    # SDPO's privileged context: "feedback" (each rollout's own feedback, the text ERL reads
    # for it), "rule" (the rule itself, the same for every row: a bound) or "" (none).
    context: str = ""
    lr_from: str = ""  # the swept arm whose learning rate this one takes (until swept itself)
    # ERLTrainer's `memory=` hook: ReflectionMemory options beyond the config's (sorted pairs).
    memory: tuple = ()
    # The arm's own first attempts per prompt, at the same prompts per step (0: --generations,
    # or --matched_generations for a matched arm): ERL at the paper's budget runs 4.
    generations: int = 0
    # An ERL step of learning_steps.STEPS in place of the product's (""): an ablation.
    step: str = ""


def arm(
    trainer: str = "erl",
    matched: bool = False,
    context: str = "",
    lr_from: str = "",
    memory: dict | None = None,
    generations: int = 0,
    step: str = "",
    **overrides,
) -> Arm:
    """An `Arm`; keyword options go to its trainer's config."""
    return Arm(
        trainer,
        tuple(sorted(overrides.items())),
        matched,
        context,
        lr_from,
        tuple(sorted((memory or {}).items())),
        generations,
        step,
    )


# The ERL arms' step as the bench has run it since issue 26: per-attempt reflection, with the
# paper's memory (PAPER_POLICY, in train_one). Issue 32 made one reflection per group and the
# lessons-only memory the product's defaults; the bench keeps its arms as measured (`erl` is
# ERL as its paper runs it) and runs the new defaults as `erl_defaults`.
BENCH_REFLECTIONS_PER_GROUP = 0
GRPO_GATE = {"reward_threshold": -1.0}  # every reward is >= -0.5: the gate stays closed
# SDPO as this bench runs it, exactly: TRL 1.15's SDPOTrainer at its SDPOConfig defaults (EMA
# teacher at rate 0.05, importance-sampling clip 2, no reprompt on a rollout's own success),
# environment feedback used only where no sibling succeeded, and full-logit distillation
# (the tiny model's vocabulary is small enough for exact logits) with TRL's
# `distillation_alpha` 0.5: TRL's interpolated divergence, which at 0.5 is the Jensen-Shannon
# divergence between student and teacher. It is not the reverse KL that TRL calls the
# official SDPO setting (alpha 1.0), nor the SDPO authors' top-k logits with a tail bucket.
SDPO = dict(
    distillation_mode="full_logits",
    distillation_alpha=0.5,
    include_environment_feedback=True,
    environment_feedback_only_without_solution=True,
)
ARMS = {
    "grpo": arm(**GRPO_GATE),  # ERLTrainer with the gate closed trains exactly like GRPO
    "grpo_matched": arm(matched=True, **GRPO_GATE),  # as many tokens per step as ERL
    "erl": arm(),
    # ERL at the budget its paper runs it (microsoft/experiential_rl's train scripts): 4 first
    # attempts per prompt where its GRPO runs 10, every failed one reflecting and retrying,
    # so that a step generates about what GRPO's does. Here against GRPO's 8 and 16.
    "erl_paper": arm(generations=4),
    # TRL's SDPOTrainer; its teacher is the model reprompted with a successful sibling or,
    # where none succeeded, the feedback on that very rollout. Mixed: half policy gradient.
    "sdpo_mixed": arm("sdpo", context="feedback", distillation_weight=0.5, **SDPO),
    "sdpo_pure": arm("sdpo", context="feedback", distillation_weight=1.0, **SDPO),
    # ERL with no reflection (issue 43): each failed attempt retries with its own raw
    # feedback, and successful retries are internalized. Is a reflection worth its tokens?
    "raw_feedback_retry": arm(enable_reflection=False, lr_from="erl"),
}
ABLATIONS = {
    "erl_no_memory": arm(enable_memory=False, lr_from="erl"),
    "erl_no_internalization": arm(enable_internalization=False, lr_from="erl"),
    "erl_global": arm(memory_scope="global", lr_from="erl"),
    "erl_same_prompt": arm(memory_scope="same_prompt", lr_from="erl"),
    "erl_similar": arm(memory_scope="similar", lr_from="erl"),
}
VARIANTS = {  # further arms: docs/log.md has what each measured
    # A second sample of the original prompt: the retry template drops the reflection (still
    # generated, one token long, and trained with the retry's advantage). It was called
    # erl_no_reflection once.
    "erl_second_sample": arm(
        retry_system_prompt="{prompt}", reflection_max_completion_length=1, lr_from="erl"
    ),
    "erl_coef3": arm(internalization_coef=3.0, lr_from="erl"),
    "erl_nomem_coef10": arm(enable_memory=False, internalization_coef=10.0, lr_from="erl"),
    # SDPO's floor (successful siblings only) and a bound (the rule as every row's context)
    "sdpo_sibling": arm(
        "sdpo",
        distillation_weight=0.5,
        lr_from="sdpo_mixed",
        **SDPO | {"include_environment_feedback": False},
    ),
    "sdpo_rule": arm("sdpo", context="rule", distillation_weight=0.5, lr_from="sdpo_mixed", **SDPO),
}
# What the memory keeps and how many failed attempts reflect (issues 27 and 32), through
# the trainer's `memory=` hook and ERLConfig.reflections_per_group. Each changes one thing
# against `erl`. (erl_per_group, one failed attempt a group reflecting and retrying, left
# with the select_reflecting= hook in issue 40; what it measured is in docs/results.md.)
LESSON_ARMS = {
    # no degenerate entry; each entry's record of its readers ranks and evicts
    "erl_lessons": arm(memory=dict(lessons_only=True, confirmations=True), lr_from="erl"),
    # One reflection per group that every failed attempt of the group retries with (issue
    # 32), credited with its retries' mean.
    "erl_shared": arm(reflections_per_group=1),
    # ERLTrainer at the product's defaults, stated here (a test checks they are the
    # defaults): one reflection per group and the lessons-only memory with records (issue
    # 32), the retry reading its own attempt's feedback beside the lesson (issue 48).
    "erl_defaults": arm(
        reflections_per_group=1,
        memory=dict(lessons_only=True, confirmations=True),
        retry_system_prompt=RETRY_FEEDBACK_TEMPLATE,
    ),
}
# What made the defaults before issue 48 (`erl_lesson_retry`: the retry read the group's
# lesson alone) miss where a lesson can be copied: each arm changes ONE thing of those toward
# raw_feedback_retry. (A reflection per failed attempt, another change, is erl_lessons
# above.) The first change, the retry reading its own feedback too, is now `erl_defaults`.
LESSONS_MEMORY = dict(lessons_only=True, confirmations=True)


def defaults_with(memory: dict | None = LESSONS_MEMORY, **change) -> Arm:
    """The defaults before issue 48 (one reflection per group, the lessons-only memory, the
    retry reading the lesson alone; erl_defaults' learning rate) with one `change`: a
    config option, its memory's, or its step."""
    return arm(reflections_per_group=1, memory=memory, lr_from="erl_defaults", **change)


CODE_ABLATIONS = {
    # the defaults before issue 48, as measured (docs/log.md: 0 of 8 tuning runs learned)
    "erl_lesson_retry": defaults_with(),
    # the reflections written and read, but no row of theirs in the loss
    "erl_lesson_retry_no_reflection_rows": defaults_with(step="no_reflection_rows"),
    "erl_lesson_retry_no_memory": defaults_with(memory=None, enable_memory=False),
    # internalization_coef as seed 000 defines it: relative to the RL loss
    "erl_lesson_retry_int_loss": defaults_with(step="loss_weighted_internalization"),
    # the ERL paper's code: every retry internalized, advantage max(r2, 0)
    "erl_lesson_retry_raft": defaults_with(step="raft_internalization"),
}
# Internalization at full weight (issue 48, on the rebuilt warm checkpoint): there the retry
# from the raw feedback succeeded 0.36 of the time and internalized 23 rows a step for 300
# steps, yet its first attempts never took the code, while SFT on answers alone (gate b)
# learns it. The product weighs internalized rows by their share of the batch's tokens (about
# 15%); seed 000 weighs their own mean cross-entropy against the RL loss.
INTERNALIZATION_ARMS = {
    "raw_feedback_retry_int_loss": arm(
        enable_reflection=False, lr_from="erl", step="loss_weighted_internalization"
    ),
    # ... and the retries' rows out of the loss: what is left beside GRPO is SFT on the
    # successful retries
    "raw_feedback_retry_int_only": arm(
        enable_reflection=False, lr_from="erl", step="internalization_only"
    ),
    "erl_defaults_int_loss": arm(
        reflections_per_group=1,
        memory=LESSONS_MEMORY,
        retry_system_prompt=RETRY_FEEDBACK_TEMPLATE,
        lr_from="erl_defaults",
        step="loss_weighted_internalization",
    ),
}
ALL_ARMS = {
    **ARMS,
    **ABLATIONS,
    **VARIANTS,
    **LESSON_ARMS,
    **CODE_ABLATIONS,
    **INTERNALIZATION_ARMS,
}
BASELINES = ("grpo", "grpo_matched")
"""The GRPO arms: the verdict compares every other ERLTrainer arm with the better of them."""


def arm_generations(name: str, s) -> int:
    """First attempts per prompt of arm `name` (its prompts per step are every arm's)."""
    spec = ALL_ARMS[name]
    return spec.generations or (s.matched_generations if spec.matched else s.generations)


def is_sdpo(name: str) -> bool:
    """Whether arm `name` trains with TRL's SDPOTrainer."""
    return ALL_ARMS[name].trainer == "sdpo"


def parse_rates(text: str) -> dict[str, float]:
    """`--lr`: "5e-4" (every arm) or "grpo=5e-4,erl=1e-3,..." (a bare rate is the default
    of arms not named). ValueError naming the item that is not a rate."""
    rates = {}
    for item in filter(None, str(text).split(",")):
        name, _, value = item.rpartition("=")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--lr {text!r}: {item!r} is not RATE or ARM=RATE") from None
        if name.strip() and name.strip() not in ALL_ARMS:
            raise ValueError(f"--lr {text!r}: unknown arm {name.strip()!r}")
    return rates


@dataclass(frozen=True)
class Settings:
    """Every option a run's result depends on (all of it goes into the cache key)."""

    task: str
    level: int
    rule_seed: int
    style: str
    reward: str
    steps: int  # every arm's max_steps: the horizon of the one schedule
    lr: str  # the arms' peak learning rates (parse_rates): one, or each arm's best from a sweep
    lr_scheduler: str
    lr_warmup_steps: int
    batch: int  # first attempts per step
    generations: int
    matched_generations: int
    max_tokens: int
    reflection_tokens: int
    memory_scope: str  # the erl arm's (and the ablations')
    warmup_steps: int
    warmup_lr: float
    feedback_examples: int
    feedback_levels: str
    reference_examples: int
    warmup_memory: str
    hidden: int  # the tiny model's size (base "tiny")
    layers: int
    max_operand: int  # hidden_rule's operands run 0..max_operand (0: the level's own)
    eval_n: int
    eval_every: int
    stop: str = ""  # "arm=step,...": stop those arms early, on the same schedule
    base: str = "tiny"  # "tiny" (built here, `hidden` x `layers`), "smollm2" or a model folder
    copy_steps: int = 0  # hidden_code: SFT steps on copies and lookups alone, before the warm-up
    # hidden_code: the warm-up's unhinted questions answered with random digits (-1: a third
    # of `feedback_examples`, as issue 43 built it)
    code_prior: int = -1
    # The curriculum's promotion as a stop: a run ends at the first step its rolling r1 over
    # `promote_window` first attempts reaches `promote` (0: every run trains to `steps`).
    # Its held-out success there stands for every later step, as a promoted stage's would.
    promote: float = 0.0
    promote_window: int = 256

    @property
    def prompts_per_step(self) -> int:
        return self.batch // self.generations

    @property
    def rule(self) -> str:
        """The rule's label, 'level:rule_seed' (what `--rules` lists)."""
        return f"{self.level}:{self.rule_seed}"

    def learning_rate(self, name: str) -> float:
        """Arm `name`'s peak learning rate: its own, its `lr_from` arm's, or the default."""
        rates = parse_rates(self.lr)
        for key in (name, ALL_ARMS[name].lr_from):
            if key and key in rates:
                return rates[key]
        if "" in rates:
            return rates[""]
        raise ValueError(
            f"--lr {self.lr!r} gives arm {name!r} no learning rate: add {name}=RATE "
            f"(sweep it first: --sweep RATE,RATE,RATE --methods grpo,{name})"
        )

    def stop_at(self, name: str) -> int:
        """The step at which arm `name` stops (the horizon unless --stop says earlier)."""
        for item in filter(None, self.stop.split(",")):
            arm_name, step = item.split("=")
            if arm_name == name:
                return min(int(step), self.steps)
        return self.steps


# The task and its rewards -------------------------------------------------------------------


def make_task(s: Settings, **config):
    """The task of settings `s` (hidden_rule: its rule and operands; hidden_code: its code)."""
    if s.task == "hidden_rule":
        return get_task("hidden_rule", rule_seed=s.rule_seed, max_operand=s.max_operand, **config)
    if s.task == "hidden_code":
        return get_task("hidden_code", rule_seed=s.rule_seed, **config)
    return get_task(s.task, reveal_answer=s.style == "reveal", **config)


def states_the_rule(task, level: int, reflection: str) -> bool:
    """hidden_rule: the reflection is the rule's statement. hidden_code: it states at least
    one letter's digit and every digit it states is the code's (a lesson names only the
    letters its prompt uses)."""
    if task.name != "hidden_code":
        return reflection == task.rule_text(level)
    stated = re.findall(r"\b([A-Z])=(\d)\b", reflection)
    code = task.code(level)
    return bool(stated) and all(code.get(letter) == digit for letter, digit in stated)


def make_funcs(task, s: Settings):
    """(reward_funcs, weights, feedback_func): the run's reward and the feedback ERL reads."""
    scorer = Scorer(task)
    reward_funcs, weights = build_reward_funcs(task, REWARDS[s.reward], scorer=scorer)
    return reward_funcs, weights, build_feedback_func(task, FEEDBACK[s.style], scorer=scorer)


def train_rows(task, s: Settings, seed: int) -> list[dict]:
    """The rows of one seed, the same for every arm, drawn below the held-out seeds."""
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    n, base = s.steps * s.prompts_per_step, 100_000 * (seed + 1)
    if not 0 <= seed or base + n > HELD_OUT_SEED_BASE:
        raise ValueError(
            f"seed {seed}: its {n} training rows would reach the held-out seeds "
            f"({HELD_OUT_SEED_BASE}); use seeds 0..{HELD_OUT_SEED_BASE // 100_000 - 2}"
        )
    return task.generate(s.level, n, seed=base)


# The device ---------------------------------------------------------------------------------


def device_args(cuda: bool | None = None, bf16_supported: bool | None = None) -> dict[str, Any]:
    """The trainers' device and precision: a CUDA GPU where one is present, in bf16 where it
    runs bf16 and else fp16 (a T4), and otherwise the CPU in float32. The weights stay
    float32 either way (mixed precision). `cuda`/`bf16_supported` default to what this
    machine has; a test passes them to check the GPU's settings on a CPU."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if not cuda:
        return dict(use_cpu=True, bf16=False, fp16=False)
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported()
    return dict(use_cpu=False, bf16=bf16_supported, fp16=not bf16_supported)


def bench_device() -> torch.device:
    """Where the bench's own sampling and evaluation run: the trainers' device."""
    return torch.device("cpu" if device_args()["use_cpu"] else "cuda")


def load_model(folder) -> torch.nn.Module:
    """A checkpoint in float32 on the bench's device (gates, evaluation, training)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.to(bench_device())


# One schedule and optimizer for every arm -------------------------------------------------

SCHEDULE_FIELDS = (
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "max_steps",
    "optim",
    "optim_args",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "gradient_accumulation_steps",
    "temperature",
)
"""The options a test compares across the arms of a comparison (and then steps); the peak
`learning_rate` is each arm's own."""


def common_args(s: Settings, output_dir: str, seed: int, learning_rate: float) -> dict[str, Any]:
    """What every arm's config holds alike: the schedule, the optimizer, the sampling, the
    device; and the arm's peak `learning_rate`. Set explicitly, so that no arm inherits
    another default (ERLConfig and SDPOConfig have different learning-rate defaults)."""
    return dict(
        output_dir=output_dir,
        max_steps=s.steps,
        learning_rate=learning_rate,
        lr_scheduler_type=s.lr_scheduler,
        warmup_steps=s.lr_warmup_steps,
        optim="adamw_torch_fused",  # the transformers default the earlier runs had
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        gradient_accumulation_steps=1,
        temperature=1.0,
        max_completion_length=s.max_tokens,
        **device_args(),
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=seed,
        disable_tqdm=True,
    )


def arm_config(name: str, s: Settings, output_dir: str, seed: int, reward_weights=None):
    """The trainer config arm `name` trains with (ERLConfig, or SDPOConfig for SDPO)."""
    spec = ALL_ARMS[name]
    generations = arm_generations(name, s)
    settings = common_args(s, output_dir, seed, s.learning_rate(name)) | dict(
        per_device_train_batch_size=s.prompts_per_step * generations,
        num_generations=generations,
        reward_weights=reward_weights,
    )
    if spec.trainer == "sdpo":
        from trl.experimental.sdpo import SDPOConfig

        return SDPOConfig(**settings, success_reward_threshold=1.0, **dict(spec.overrides))
    settings |= dict(
        # What `erl` and its variants have run since issue 26, before issue 32 changed the
        # defaults: every gated attempt reflects (erl_shared and erl_defaults override it).
        reflections_per_group=BENCH_REFLECTIONS_PER_GROUP,
        reflection_max_completion_length=s.reflection_tokens,
        reflection_system_prompt=REFLECTION_TEMPLATE,
        retry_system_prompt=RETRY_TEMPLATE,
        memory_scope=s.memory_scope,
    )
    return ERLConfig(**(settings | dict(spec.overrides)))


# Cache keys ---------------------------------------------------------------------------------

PATH_FIELDS = ("output_dir", "logging_dir")


def digest(value: Any) -> str:
    """A short SHA-1 of `value` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def config_fingerprint(config) -> dict[str, Any]:
    """Every option of a resolved trainer config except where it writes."""
    return {k: v for k, v in config.to_dict().items() if k not in PATH_FIELDS}


def run_key(
    name: str, seed: int, s: Settings, warm_key: str, config, rows, extra: dict | None = None
) -> str:
    """The cache key of one run: the bench schema, the settings, the arm's fully resolved
    config (schedule, optimizer, templates, ERL/SDPO options, reward weights), the reward and
    feedback specs, the task's config, the warm checkpoint, the training rows, the library
    versions and `extra` (SDPO's contexts, a learned reward model)."""
    task = make_task(s)
    # This arm's stop and learning rate, not the others': another arm's rate decides nothing
    # here (`--lr erl=2e-4` keeps the GRPO runs cached). A single rate reads as `--lr` did.
    settings = asdict(s) | {"stop": s.stop_at(name), "lr": f"{s.learning_rate(name):g}"}
    return digest(
        {
            "schema": BENCH_SCHEMA,
            "arm": [name, asdict(ALL_ARMS[name])],
            "seed": seed,
            "settings": settings,
            "config": config_fingerprint(config),
            "reward": REWARDS[s.reward],
            "feedback": FEEDBACK[s.style],
            "task": [task.name, asdict(task.config)],
            "warm": warm_key,
            "rows": digest(rows),
            "versions": [trl.__version__, transformers.__version__, torch.__version__],
            "extra": extra or {},
        }
    )


# Training -----------------------------------------------------------------------------------


def counting_sdpo():
    """The product's SDPO trainer (`pipeline.sdpo.trainer.FeedbackSDPOTrainer`): TRL's
    SDPOTrainer that counts its generated tokens, keeps its first attempts' rewards, as
    CountingERLTrainer does, and, given `rollout_feedback=feedback_func`, gives the teacher each
    rollout's own feedback (imported on first use: trl.experimental warns on import)."""
    from pipeline.sdpo.trainer import FeedbackSDPOTrainer

    return FeedbackSDPOTrainer


class ProcessedTokens:
    """Counts every token a forward pass reads, prompts included: a generation's prefill and
    each token it decodes, every training forward (the policy's, on each row it trains:
    first attempts, reflections, retries, internalization rows) and SDPO's teacher forward
    on its reprompts. Padding is not counted. The equal-compute axis (issue 32): "generated
    tokens" misses ERL's long reflection and retry prompts and SDPO's teacher pass."""

    def __init__(self, *models: torch.nn.Module) -> None:
        self.total = 0
        self.counting = True
        seen = set()
        for model in models:
            if id(model) not in seen:
                seen.add(id(model))
                model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        if not self.counting:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"][..., 0]
        mask = kwargs.get("attention_mask")
        # With a KV cache the mask spans the whole sequence; the new tokens are its last columns.
        read = mask[:, -ids.shape[1] :].sum() if mask is not None else ids.numel()
        self.total += int(read)


def forward_models(trainer) -> list[torch.nn.Module]:
    """The models a trainer runs forward passes of: the policy, and SDPO's teacher where it
    is a separate module (TRL 1.15's `teacher_model`; the live teacher is the policy)."""
    from trl.experimental.sdpo import SDPOTrainer  # on use: trl.experimental warns on import

    models = [trainer.model]
    if isinstance(trainer, SDPOTrainer):
        models.append(trainer.teacher_model)
    return models


RETRY_LOG: list[dict] = []


def recording_retry_advantages(groups, r1, r2, valid, scale):
    """ERL's retry advantages, recording which rows they reward (diagnostics): the
    trainer's `retry_advantages` hook."""
    advantages = retry_advantages(groups, r1, r2, valid, scale)
    RETRY_LOG.append(
        {"r1": r1.tolist(), "r2": r2.tolist(), "valid": list(valid), "adv": list(advantages)}
    )
    return advantages


def reaches(rewards: list[float], threshold: float, window: int) -> bool:
    """The curriculum controller's promotion rule (`promotion_reached`, no minimum of
    steps): the mean of the last `window` scored first-attempt rewards is at least
    `threshold`, and there are that many."""
    config = CurriculumConfig(promote_threshold=threshold, promote_window=window, min_stage_steps=0)
    return promotion_reached(rewards, 0, config)


class Recorder(TrainerCallback):
    """Per step: r1, generated and processed tokens, wall seconds (evaluation excluded), the
    ERL/SDPO logs; held-out success every `eval_every` steps; stops the run at `stop`."""

    def __init__(
        self, trainer, evaluate, eval_every: int, stop: int, label: str, promote=(0.0, 1)
    ) -> None:
        self.trainer, self.evaluate, self.eval_every = trainer, evaluate, eval_every
        self.processed = ProcessedTokens(*forward_models(trainer))
        self.stop, self.label = stop, label
        self.promote, self.promote_window = promote
        self.rewards: list[float] = []  # every scored first attempt's r1, for the promotion
        self.steps: list[dict] = []
        self.evals: list[dict] = []
        self.paused = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.start - self.paused
        rewards = [r for r, _ in self.trainer.pop_first_attempts()]
        record = {
            "step": state.global_step,
            "r1": rewards,
            "tokens": self.trainer.generated_tokens,
            "processed": self.processed.total,
        }
        self.steps.append(record | {"seconds": seconds})
        self.rewards += [r for r in rewards if r == r]
        last = state.global_step >= self.stop or self.promoted()
        if state.global_step % self.eval_every == 0 or last:
            paused = time.perf_counter()
            self.processed.counting = False  # the evaluation is no training compute
            success = self.evaluate(self.trainer.model)
            self.processed.counting = True
            self.evals.append(
                {
                    "step": state.global_step,
                    "tokens": record["tokens"],
                    "processed": record["processed"],
                    **success,
                }
            )
            self.paused += time.perf_counter() - paused
            recent = [r for rec in self.steps[-self.eval_every :] for r in rec["r1"] if r == r]
            print(
                f"  {self.label} step {state.global_step}: r1 {statistics.fmean(recent):.3f}, "
                f"held-out {success['success']:.3f}, {record['tokens']} tokens, {seconds:.0f} s",
                flush=True,
            )
        if last:
            control.should_training_stop = True

    def promoted(self) -> bool:
        """Whether the run is promoted (`--promote`): the report's `crossing` rule."""
        return bool(self.promote) and reaches(self.rewards, self.promote, self.promote_window)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and self.steps:
            keep = ("erl/", "self_distillation/")
            self.steps[-1].update({k: v for k, v in logs.items() if k.startswith(keep)})


def held_out(task, tokenizer, s: Settings):
    """The evaluation: greedy first attempts, no reflection. hidden_rule and hidden_code:
    every held-out operand pair or letter combination (and, to tell transfer from
    memorisation, as many training ones, a fixed sample); other tasks: `eval_n` prompts from
    the held-out seeds."""
    if s.task in RULE_TASKS:
        splits = {"success": task.split_rows(s.level, "held_out")}
        train = task.split_rows(s.level, "train")
        splits["train_success"] = random.Random(0).sample(
            train, min(len(train), len(splits["success"]))
        )

        def evaluate(model) -> dict[str, float]:
            out = {}
            for key, rows in splits.items():
                texts = generate_completions(
                    model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=s.max_tokens,
                    batch_size=128, progress=False,
                )  # fmt: skip
                out[key] = score_completions(task, rows, texts).success_rate
            return out

        return evaluate

    def evaluate(model) -> dict[str, float]:
        result = evaluate_first_attempts(
            model, tokenizer, task, s.level, s.eval_n, max_new_tokens=s.max_tokens, progress=False
        )
        return {"success": result.success_rate}

    return evaluate


def train_one(
    name: str,
    seed: int,
    warm: Path,
    s: Settings,
    work: Path,
    funcs=None,
) -> dict:
    """Train arm `name` for one seed from the warm checkpoint; returns its record.

    `funcs`: (reward_funcs, weights, feedback_func) to train on instead of the task's (a
    learned reward model); the evaluation still checks the task's correctness."""
    torch.manual_seed(seed)
    spec = ALL_ARMS[name]
    task = make_task(s)
    reward_funcs, weights, feedback_func = funcs or make_funcs(task, s)
    model = load_model(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    rows = train_rows(task, s, seed)
    args = arm_config(name, s, str(work / f"{name}-{seed}"), seed, reward_weights=weights)
    if spec.trainer == "sdpo":
        if spec.context == "rule":
            rows = [r | {"privileged_context": task.rule_text(s.level)} for r in rows]
        trainer = counting_sdpo()(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows),
            reward_funcs=reward_funcs,
            processing_class=tokenizer,
            rollout_feedback=feedback_func if spec.context == "feedback" else None,
        )
    else:
        trainer = CountingERLTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows),
            reward_funcs=reward_funcs,
            feedback_func=feedback_func,
            retry_advantages=recording_retry_advantages,
            memory=ReflectionMemory.from_config(args, **(PAPER_POLICY | dict(spec.memory))),
            processing_class=tokenizer,
        )
        if spec.step:  # an ablation's step, over the trainer's own memory and credit
            trainer.erl_step = STEPS[spec.step](args, trainer.memory, recording_retry_advantages)
    recorder = Recorder(
        trainer,
        held_out(task, tokenizer, s),
        s.eval_every,
        s.stop_at(name),
        f"{name}/{seed}",
        promote=(s.promote, s.promote_window),
    )
    trainer.add_callback(recorder)
    trainer.remove_callback(PrinterCallback)  # the Recorder prints a line per evaluation
    RETRY_LOG.clear()
    trainer.train()
    memory = [e.reflection for e in getattr(trainer, "memory", [])]
    return {
        "method": name,
        "seed": seed,
        "steps": recorder.steps,
        "evals": recorder.evals,
        "retries": list(RETRY_LOG),
        "memory_tail": memory[-3:],
        # the final memory, strongest first (the global rulebook's order), with its records
        "memory": [
            {
                "prompt": e.prompt,
                "reflection": e.reflection,
                "reads": e.reads,
                "successes": e.successes,
            }  # fmt: skip
            for e in (trainer.memory.rulebook() if hasattr(trainer, "memory") else [])
        ],
    }
