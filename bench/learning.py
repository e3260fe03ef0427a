"""Does ERL learn faster than GRPO? Both trained from one warmed-up checkpoint, same data.

    python bench/learning.py                          # 3 seeds x {grpo, erl}
    python bench/learning.py --seeds 1 --steps 30     # a quick look
    python bench/learning.py --ablations              # + no memory, no internalization,
                                                      #   retry without reflection
    python bench/learning.py --methods grpo --reward_model runs/rm   # a learned reward
                                                      #   model as the only training signal
    python bench/learning.py --warmup_memory same_prompt   # a warm-up whose memory shows
                                                      #   the same prompt's fixes

Design (picked by measuring; docs/log.md has the numbers):

- model: the project's tiny model, warmed up once with SFT on feedback-reading rows only
  (pipeline/erl/feedback_warmup.py) at `--feedback_levels` (default 2): the ERL reflection
  prompt for a wrong attempt with the real feedback -> a reflection that states the fix,
  and the retry prompt with that reflection -> the right answer. The warm-up never shows
  a first attempt at the trained level, so its first attempts mostly fail;
- feedback (`--style`): "reveal" (the task's reveal_answer feedback: "... The correct
  answer is 8.") or "distance" (the milestones feedback: "... too low ... off by 3.");
- task: arithmetic at `--level` (default 1: a + b) with a binary reward (correctness: 1
  right, 0 wrong, -0.5 unparseable);
- GRPO is ERLTrainer with the gate closed (threshold below every reward), which trains
  exactly like GRPOTrainer (tests/test_erl_trainer.py); ERL opens the gate at 1.0. GRPO
  steps are cheap, so it runs `--grpo_steps` to show where it reaches the threshold;
- the promotion threshold is the curriculum controller's rule: rolling mean of r1 over
  the last `--window` first attempts >= `--threshold`.

Prints r1 against steps, generated tokens (first attempts + reflections + retries) and
wall seconds; steps, tokens and seconds to the threshold; held-out first-attempt success
(greedy) at equal steps and at equal generated tokens; mean and spread over
seeds; ERL's diagnostics (r2 against r1, internalized rows, which retries the advantages
reward); a PNG of the curves; and last one `name: value` line per headline figure
(medians over seeds). Runs are cached under --out, so adding --ablations reuses them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.models.backend import activate_backend

activate_backend()

import torch  # noqa: E402
from datasets import Dataset, concatenate_datasets  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

import pipeline.erl.trainer as erl_trainer  # noqa: E402
from curriculum.tasks import get_task  # noqa: E402
from pipeline import ERLConfig, ERLTrainer, build_tiny_model  # noqa: E402
from pipeline.erl.feedback_warmup import feedback_rows  # noqa: E402
from pipeline.erl.memory import MEMORY_SCOPES  # noqa: E402
from pipeline.erl.prompts import memory_text, reflection_prompt, retry_prompt  # noqa: E402
from pipeline.evaluate.first_attempts import evaluate_first_attempts, generate_completions  # noqa: E402
from pipeline.reward_model.signals import (  # noqa: E402
    INFO_FILE,
    add_learned_signals,
    check_reward_model_specs,
)
from pipeline.run.warmup import reference_dataset, sft_warmup  # noqa: E402
from rewards import Scorer, build_feedback_func, build_reward_funcs  # noqa: E402

# Short templates: the tiny model reads these; the defaults are written for real LLMs.
REFLECTION_TEMPLATE = (
    "{prompt}\nAttempt: {attempt}\nFeedback: {feedback}\nReward: {reward:.1f}\n"
    "Lessons:\n{memory}\nFix:"
)
RETRY_TEMPLATE = "{prompt}\nHint: {reflection}"
REWARD = {"correctness": 1.0}  # binary: the sparse right/wrong reward
FEEDBACK = {  # what the feedback reports (it may name more signals than the reward)
    "distance": {"correctness": 1.0, "milestones": 1.0},  # "too low ... off by 3"
    "reveal": {"correctness": 1.0},  # with reveal_answer: "The correct answer is 8."
}
METHODS = {
    "grpo": {"reward_threshold": -1.0},  # every reward is >= -0.5: the gate stays closed
    "erl": {},
}
ABLATIONS = {
    "erl_no_memory": {"enable_memory": False},
    "erl_no_internalization": {"enable_internalization": False},
    # A second sample of the original prompt: the retry template drops the reflection
    # (still generated, one token long, and trained with the retry's advantage).
    "erl_no_reflection": {"retry_system_prompt": "{prompt}", "reflection_max_completion_length": 1},
}
# Changes to ERL the numbers may point at (run with --methods grpo,erl,<name>).
VARIANTS = {
    "erl_improvement": {"retry_advantage": "improvement"},  # r2 - r1 for every retry
    # The merged batch has ~3x GRPO's tokens and DAPO divides by all of them, so the
    # internalization rows (and y1's GRPO signal) weigh ~3x less than in a GRPO batch.
    "erl_coef3": {"internalization_coef": 3.0},
    # Memory off (its lessons from other prompts derailed the reflections: retry success
    # fell from 0.20 to ~0.03 as it filled) and internalization weighted up to an SFT-like
    # strength: ~11 internalized rows of ~1,600 trained tokens per step.
    "erl_nomem_coef10": {"enable_memory": False, "internalization_coef": 10.0},
    # The options built for those two findings, alone and together (docs/log.md, issue 9).
    "erl_merged": {"loss_normalization": "merged", "memory_scope": "similar"},
    "erl_per_part": {"loss_normalization": "per_part", "memory_scope": "similar"},
    "erl_same_prompt": {"loss_normalization": "merged", "memory_scope": "same_prompt"},
    "erl_per_part_same_prompt": {"loss_normalization": "per_part", "memory_scope": "same_prompt"},
    # With --warmup_memory same_prompt, ~30 successful retries per step are internalized:
    # weighted up to an SFT-like strength.
    "erl_same_prompt_coef10": {"memory_scope": "same_prompt", "internalization_coef": 10.0},
    # Reflections and retries only supply the memory and the internalized answers: the
    # loss sees the first attempts (undiluted) and internalization.
    "erl_untrained_retries": {"train_retries": False},
    "erl_untrained_retries_coef10": {"train_retries": False, "internalization_coef": 10.0},
}


@dataclass(frozen=True)
class Settings:
    """Everything a run's result depends on (its hash names the cached result)."""

    style: str
    level: int
    steps: int
    grpo_steps: int
    batch: int
    generations: int
    lr: float
    max_tokens: int
    reflection_tokens: int
    warmup_steps: int
    warmup_lr: float
    feedback_examples: int
    feedback_levels: str
    reference_examples: int
    eval_n: int
    eval_every: int
    hidden: int
    layers: int
    warmup_memory: str = "similar"

    def key(self, extra: dict | None = None) -> str:
        fields = asdict(self)
        if fields["warmup_memory"] == "similar":  # the first warm-up's: keep its cached names
            del fields["warmup_memory"]
        text = json.dumps({**fields, **(extra or {})}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:10]


# Warm-up ---------------------------------------------------------------------------------


def make_task(style: str):
    return get_task("arithmetic", reveal_answer=style == "reveal")


def make_funcs(task, style: str):
    scorer = Scorer(task)
    reward_funcs, weights = build_reward_funcs(task, REWARD, scorer=scorer)
    return reward_funcs, weights, build_feedback_func(task, FEEDBACK[style], scorer=scorer)


def base_args(output_dir: str, seed: int, s: Settings, **overrides) -> ERLConfig:
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=s.batch,
        num_generations=s.generations,
        max_completion_length=s.max_tokens,
        reflection_max_completion_length=s.reflection_tokens,
        max_steps=s.steps,
        learning_rate=s.lr,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=seed,
        disable_tqdm=True,
        reflection_system_prompt=REFLECTION_TEMPLATE,
        retry_system_prompt=RETRY_TEMPLATE,
    )
    settings.update(overrides)
    return ERLConfig(**settings)


def warm_checkpoint(s: Settings, cache: Path) -> Path:
    """The shared starting checkpoint: built and warmed up once per warm-up setting."""
    keys = ("style", "warmup_steps", "warmup_lr", "feedback_examples", "feedback_levels")
    keys += ("reference_examples", "hidden", "layers", "max_tokens", "warmup_memory")
    folder = cache / f"warm-{s.key({k: None for k in asdict(s) if k not in keys})}"
    if (folder / "config.json").exists():
        return folder
    base = build_tiny_model(
        str(cache / f"tiny-{s.hidden}x{s.layers}"), hidden_size=s.hidden, num_hidden_layers=s.layers
    )
    model = AutoModelForCausalLM.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    task = make_task(s.style)
    reward_funcs, weights, feedback_func = make_funcs(task, s.style)
    parts = []
    if s.reference_examples:
        parts.append(reference_dataset(task, 1, s.reference_examples, seed=900_000))
    levels = [int(x) for x in s.feedback_levels.split(",") if x]
    for level in levels:
        rows = task.generate(
            level, s.feedback_examples // len(levels), seed=800_000 + level * 10_000
        )
        parts.append(
            Dataset.from_list(
                feedback_rows(
                    task,
                    rows,
                    feedback_func,
                    reward_funcs,
                    weights,
                    reflection_template=REFLECTION_TEMPLATE,
                    retry_template=RETRY_TEMPLATE,
                    style=s.style,
                    seed=level,
                    memory_scope=s.warmup_memory,
                )
            )
        )
    dataset = concatenate_datasets(parts).shuffle(seed=0)
    staging = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache))
    start = time.perf_counter()
    sft_warmup(
        model,
        tokenizer,
        task,
        1,
        steps=s.warmup_steps,
        examples=len(dataset),
        batch_size=64,
        learning_rate=s.warmup_lr,
        args=base_args(str(staging / "trainer"), 0, s),
        output_dir=str(staging / "trainer"),
        dataset=dataset,
    )
    print(
        f"warm-up: {s.warmup_steps} SFT steps on {len(dataset)} rows in {time.perf_counter() - start:.0f} s"
    )
    shutil.rmtree(staging / "trainer", ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, folder)  # atomic: a killed warm-up leaves no half checkpoint
    return folder


def probe_feedback_skill(warm: Path, s: Settings, n: int = 256) -> dict[str, float]:
    """Before any RL: sampled first attempts on level-2 prompts; for the wrong ones, a
    sampled reflection and retry (as ERL does) against a fresh second sample."""
    task = make_task(s.style)
    reward_funcs, weights, feedback_func = make_funcs(task, s.style)
    model = AutoModelForCausalLM.from_pretrained(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    rows = task.generate(s.level, n, seed=500_000)

    def sample(prompts, tokens, seed):
        return generate_completions(
            model, tokenizer, prompts, max_new_tokens=tokens, do_sample=True, seed=seed,
            batch_size=64, progress=False,
        )  # fmt: skip

    def solved(rows_, texts):
        return [task.evaluate(r, t).solved for r, t in zip(rows_, texts)]

    first = sample([r["prompt"] for r in rows], s.max_tokens, 1)
    wrong = [i for i, ok in enumerate(solved(rows, first)) if not ok]
    w_rows = [rows[i] for i in wrong]
    columns = {k: [r[k] for r in w_rows] for k in ("task", "level", "answer", "meta")}
    completions = [[{"role": "assistant", "content": first[i]}] for i in wrong]
    feedback = feedback_func(completions=completions, **columns)
    rewards = reward_funcs[0](completions=completions, **columns)
    reflections = sample(
        [
            reflection_prompt(
                r["prompt"],
                REFLECTION_TEMPLATE,
                attempt=first[i],
                feedback=f,
                reward=float(x),
                memory=memory_text([]),
            )
            for r, i, f, x in zip(w_rows, wrong, feedback, rewards)
        ],
        s.reflection_tokens,
        2,
    )
    retries = sample(
        [retry_prompt(r["prompt"], RETRY_TEMPLATE, t.strip()) for r, t in zip(w_rows, reflections)],
        s.max_tokens,
        3,
    )
    resamples = sample([r["prompt"] for r in w_rows], s.max_tokens, 4)
    for i in range(min(3, len(w_rows))):
        print(
            f"  probe: {w_rows[i]['prompt'][-1]['content']} = {w_rows[i]['answer']} | y1 {first[wrong[i]]!r}"
            f" | fb {feedback[i]!r} | refl {reflections[i]!r} | y2 {retries[i]!r}"
        )
    return {
        "first_attempt_success": 1 - len(wrong) / n,
        "retry_success_after_reflection": statistics.fmean(solved(w_rows, retries))
        if w_rows
        else math.nan,
        "resample_success": statistics.fmean(solved(w_rows, resamples)) if w_rows else math.nan,
    }


# Training --------------------------------------------------------------------------------


class CountingERL(ERLTrainer):
    """ERLTrainer that counts the tokens it generates (first attempts, reflections, retries)."""

    generated_tokens = 0

    def _generate_single_turn(self, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        if self.model.training:  # not the held-out evaluation
            self.generated_tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs


RETRY_LOG: list[dict] = []


def _recording_retry_advantages(groups, r1, r2, valid, scale, **kwargs):
    """Wraps the trainer's retry advantages to record which rows they reward (diagnostics)."""
    advantages = _ORIGINAL_RETRY_ADVANTAGES(groups, r1, r2, valid, scale, **kwargs)
    RETRY_LOG.append(
        {"r1": r1.tolist(), "r2": r2.tolist(), "valid": list(valid), "adv": list(advantages)}
    )
    return advantages


_ORIGINAL_RETRY_ADVANTAGES = erl_trainer._retry_advantages
erl_trainer._retry_advantages = _recording_retry_advantages


class Recorder(TrainerCallback):
    """Per step: r1, generated tokens, wall seconds (held-out evaluation excluded), ERL logs."""

    def __init__(self, trainer, evaluate, eval_every: int, label: str) -> None:
        self.trainer, self.evaluate, self.eval_every = trainer, evaluate, eval_every
        self.label = label
        self.steps: list[dict] = []
        self.evals: list[dict] = []
        self.paused = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.start - self.paused
        rewards = [r for r, _ in self.trainer.pop_first_attempts()]
        record = {"step": state.global_step, "r1": rewards, "tokens": self.trainer.generated_tokens}
        self.steps.append(record | {"seconds": seconds})
        if state.global_step % self.eval_every == 0 or state.global_step == args.max_steps:
            paused = time.perf_counter()
            success = self.evaluate(self.trainer.model)
            self.evals.append(
                {"step": state.global_step, "tokens": record["tokens"], "success": success}
            )
            self.paused += time.perf_counter() - paused
            recent = [r for rec in self.steps[-self.eval_every :] for r in rec["r1"] if r == r]
            print(
                f"  {self.label} step {state.global_step}: r1 {statistics.fmean(recent):.3f}, "
                f"held-out {success:.3f}, {record['tokens']} tokens, {seconds:.0f} s",
                flush=True,
            )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and self.steps and "erl/gated_fraction" in logs:
            self.steps[-1].update({k: v for k, v in logs.items() if k.startswith("erl/")})


def method_steps(method: str, s: Settings) -> int:
    return s.grpo_steps if method == "grpo" else s.steps


def held_out(task, tokenizer, s: Settings):
    def evaluate(model) -> float:
        result = evaluate_first_attempts(
            model, tokenizer, task, s.level, s.eval_n, max_new_tokens=s.max_tokens, progress=False
        )
        return result.success_rate

    return evaluate


def reward_model_id(path: str) -> str:
    """What names a learned reward model in the run cache: its folder and its training
    record (reward_model.json changes whenever the model is retrained there)."""
    folder = Path(path)
    info = folder / INFO_FILE
    if not (folder / "config.json").exists() and not (folder / "adapter_config.json").exists():
        raise SystemExit(
            f"--reward_model {path}: no reward model there (no config.json or "
            "adapter_config.json); train one with `python -m pipeline.reward_model`"
        )
    if not info.exists():
        raise SystemExit(
            f"--reward_model {path}: no {INFO_FILE} (its calibration); train it with "
            "`python -m pipeline.reward_model`"
        )
    digest = hashlib.sha1(info.read_bytes()).hexdigest()[:10]
    return f"{folder.resolve()}#{digest}"


def learned_funcs(task, style: str, reward_model: str):
    """The learned reward model as the only weighted signal, as configs/tiny_reward_model.yaml
    runs it: the correctness program stays with weight 0 (TRL still logs it) and its
    feedback stays out, so the policy never hears the programmatic verdict."""
    reward_funcs, weights, feedback_func = make_funcs(task, style)
    specs = check_reward_model_specs({"correct": {"path": reward_model, "weight": 1.0}})
    return add_learned_signals(
        specs,
        {},
        reward_funcs,
        [0.0] * len(weights),
        feedback_func,
        device="cpu",
        program_feedback=False,
    )


def train_one(
    method: str, seed: int, warm: Path, s: Settings, work: Path, reward_model: str = ""
) -> dict:
    """Train one method for one seed from the warm checkpoint; returns its record.

    `reward_model`: a folder from `python -m pipeline.reward_model` to train on instead of
    the correctness program (the held-out evaluation still checks correctness)."""
    torch.manual_seed(seed)
    task = make_task(s.style)
    if reward_model:
        reward_funcs, weights, feedback_func = learned_funcs(task, s.style, reward_model)
    else:
        reward_funcs, weights, feedback_func = make_funcs(task, s.style)
    model = AutoModelForCausalLM.from_pretrained(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    # Same data for every method of a seed; seeds stay below the held-out ones (10**6).
    # GRPO steps are cheap: it gets more of them, to measure where it reaches the threshold.
    # One dataset (sized for the longest run) and one seed give every method the same rows
    # in the same order.
    longest = max(s.steps, s.grpo_steps)
    dataset = Dataset.from_list(
        task.generate(s.level, longest * s.batch // s.generations, seed=100_000 * (seed + 1))
    )
    overrides = {**METHODS, **ABLATIONS, **VARIANTS}[method]
    args = base_args(
        str(work / f"{method}-{seed}"),
        seed,
        s,
        reward_weights=weights,
        max_steps=method_steps(method, s),
        **overrides,
    )
    trainer = CountingERL(
        model=model,
        args=args,
        train_dataset=dataset,
        reward_funcs=reward_funcs,
        feedback_func=feedback_func,
        processing_class=tokenizer,
    )
    recorder = Recorder(trainer, held_out(task, tokenizer, s), s.eval_every, f"{method}/{seed}")
    trainer.add_callback(recorder)
    trainer.remove_callback(PrinterCallback)  # the Recorder prints a line per evaluation
    RETRY_LOG.clear()
    trainer.train()
    return {
        "method": method,
        "seed": seed,
        "steps": recorder.steps,
        "evals": recorder.evals,
        "retries": list(RETRY_LOG),
    }


# Analysis --------------------------------------------------------------------------------


def crossing(run: dict, threshold: float, window: int) -> dict | None:
    """Step, tokens and seconds at which the rolling r1 mean first reaches the threshold."""
    rewards: list[float] = []
    for record in run["steps"]:
        rewards += [r for r in record["r1"] if r == r]
        recent = rewards[-window:]
        if len(recent) >= window and sum(recent) / len(recent) >= threshold:
            return {k: record[k] for k in ("step", "tokens", "seconds")}
    return None


def success_at(run: dict, key: str, value: float) -> float:
    """Held-out success at `value` steps or tokens, interpolated between evaluations."""
    points = [(0, run["start_success"])] + [(e[key], e["success"]) for e in run["evals"]]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= value <= x1:
            return y0 + (y1 - y0) * (value - x0) / max(x1 - x0, 1e-9)
    return points[-1][1]


def r1_curve(run: dict, every: int) -> list[tuple[int, int, float, float]]:
    """(step, tokens, seconds, mean r1 over the last `every` steps) every `every` steps."""
    out = []
    for i in range(every - 1, len(run["steps"]), every):
        chunk = [r for rec in run["steps"][i - every + 1 : i + 1] for r in rec["r1"] if r == r]
        rec = run["steps"][i]
        out.append((rec["step"], rec["tokens"], rec["seconds"], sum(chunk) / max(len(chunk), 1)))
    return out


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"mean {mean:.3f} sd {sd:.3f} min {min(values):.3f} max {max(values):.3f}"


def retry_diagnostics(runs: list[dict]) -> dict[str, float]:
    """Do retries beat first attempts, and do the advantages reward the successful ones?"""
    r1, r2, success_pos, success_zero, fail_neg, n_success, n_fail = [], [], 0, 0, 0, 0, 0
    for run in runs:
        for batch in run["retries"]:
            for a, b, ok, adv in zip(batch["r1"], batch["r2"], batch["valid"], batch["adv"]):
                if not ok:
                    continue
                r1.append(a)
                r2.append(b)
                if b >= 1.0:
                    n_success += 1
                    success_pos += adv > 1e-9
                    success_zero += abs(adv) <= 1e-9
                else:
                    n_fail += 1
                    fail_neg += adv < -1e-9
    internalized = [
        rec.get("erl/internalization_rows", 0.0) for run in runs for rec in run["steps"]
    ]
    # Trained tokens per part on gated steps (logged with loss_normalization="per_part").
    part_tokens = {
        part: [
            rec[f"erl/tokens_{part}"]
            for run in runs
            for rec in run["steps"]
            if f"erl/tokens_{part}" in rec
        ]
        for part in ("first", "retry", "internalization")
    }
    return {
        **{f"tokens_{p}_per_gated_step": statistics.fmean(v) for p, v in part_tokens.items() if v},
        "retries": float(len(r1)),
        "gated_r1_mean": statistics.fmean(r1) if r1 else math.nan,
        "r2_mean": statistics.fmean(r2) if r2 else math.nan,
        "retry_success_rate": n_success / len(r1) if r1 else math.nan,
        "successful_retries_with_positive_advantage": success_pos / max(n_success, 1),
        "successful_retries_with_zero_advantage": success_zero / max(n_success, 1),
        "failed_retries_with_negative_advantage": fail_neg / max(n_fail, 1),
        "internalized_rows_per_step": statistics.fmean(internalized) if internalized else 0.0,
    }


def plot(
    results: dict[str, list[dict]], threshold: float, every: int, level: int, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for method, runs in results.items():
        curves = [r1_curve(run, every) for run in runs]
        n = min(len(c) for c in curves)
        for axis, col, label in zip(axes, (0, 1, 2), ("steps", "generated tokens", "seconds")):
            xs = [statistics.fmean(c[i][col] for c in curves) for i in range(n)]
            ys = [statistics.fmean(c[i][3] for c in curves) for i in range(n)]
            lo = [min(c[i][3] for c in curves) for i in range(n)]
            hi = [max(c[i][3] for c in curves) for i in range(n)]
            (line,) = axis.plot(xs, ys, label=method)
            axis.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
            axis.set_xlabel(label)
    for axis in axes:
        axis.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
        axis.set_ylabel("r1 (first-attempt reward)")
    axes[0].legend()
    fig.suptitle(f"arithmetic level {level}, binary reward: mean over seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def report(results: dict[str, list[dict]], opts, s: Settings, out: Path) -> None:
    every = max(1, s.steps // 10)
    print(
        f"\nr1 (mean over {opts.seeds} seeds, over {every}-step blocks) against steps / tokens / s:"
    )
    for method, runs in results.items():
        curves = [r1_curve(run, every) for run in runs]
        n = min(len(c) for c in curves)
        cells = []
        for i in range(n):
            step = curves[0][i][0]
            tokens = statistics.fmean(c[i][1] for c in curves)
            seconds = statistics.fmean(c[i][2] for c in curves)
            r1 = statistics.fmean(c[i][3] for c in curves)
            cells.append(f"{step}/{tokens / 1000:.0f}k/{seconds:.0f}s:{r1:.2f}")
        print(f"  {method:24s} " + "  ".join(cells))

    cross = {
        m: [crossing(run, opts.threshold, opts.window) for run in runs]
        for m, runs in results.items()
    }
    print(
        f"\nto the threshold (rolling r1 over {opts.window} first attempts >= {opts.threshold}); "
        "a run that never reaches it counts as its total steps, tokens and seconds (a bound):"
    )
    reached = {}
    for method, runs in results.items():
        values = {}
        for key in ("step", "tokens", "seconds"):
            values[key] = [
                c[key] if c else run["steps"][-1][key] for c, run in zip(cross[method], runs)
            ]
        reached[method] = values
        got = sum(c is not None for c in cross[method])
        print(f"  {method:24s} reached in {got}/{len(runs)} seeds")
        for key, vals in values.items():
            print(f"    {key:8s} per seed {[round(v, 1) for v in vals]}  {spread(vals)}")

    grpo_tokens = median([run["steps"][-1]["tokens"] for run in results["grpo"]])
    start = results["grpo"][0]["start_success"]  # the warm checkpoint's
    print(f"\nheld-out first-attempt success (greedy, {s.eval_n} level-{s.level} prompts):")
    print(f"  start (warm checkpoint): {start:.3f}")
    equal = {}
    for method, runs in results.items():
        at_steps = [success_at(run, "step", s.steps) for run in runs]
        at_tokens = [success_at(run, "tokens", grpo_tokens) for run in runs]
        equal[method] = (at_steps, at_tokens)
        print(f"  {method:24s} at {s.steps} steps: {spread(at_steps)}")
        print(f"  {method:24s} at {grpo_tokens:.0f} tokens (GRPO's total): {spread(at_tokens)}")

    print("\nERL diagnostics (all seeds):")
    for method, runs in results.items():
        if method == "grpo":
            continue
        diag = retry_diagnostics(runs)
        print(f"  {method}: " + ", ".join(f"{k} {v:.3f}" for k, v in diag.items()))

    plot(results, opts.threshold, every, s.level, out / "learning_curves.png")
    print(f"\ncurves: {out / 'learning_curves.png'}")

    def ratio(method: str, key: str) -> float:
        """Median ERL / median GRPO to the threshold; nan unless every ERL seed reached it
        (a GRPO seed that never reached it counts its total, so the ratio is then a bound)."""
        if not all(cross[method]):
            return math.nan
        return median(reached[method][key]) / max(median(reached["grpo"][key]), 1e-9)

    print()
    for method in results:
        got = sum(c is not None for c in cross[method])
        print(f"steps_to_threshold[{method}]: {median(reached[method]['step']):.0f}")
        print(f"tokens_to_threshold[{method}]: {median(reached[method]['tokens']):.0f}")
        print(f"seconds_to_threshold[{method}]: {median(reached[method]['seconds']):.1f}")
        print(f"seeds_reaching_threshold[{method}]: {got}/{len(cross[method])}")
        print(f"heldout_success_equal_steps[{method}]: {median(equal[method][0]):.3f}")
        print(f"heldout_success_equal_tokens[{method}]: {median(equal[method][1]):.3f}")
    print(f"heldout_success_start: {start:.3f}")
    for method in results:
        print(f"heldout_success_equal_steps_min[{method}]: {min(equal[method][0]):.3f}")
    print(f"grpo_ratio_is_a_bound: {str(not all(cross['grpo'])).lower()}")
    for method in results:
        if method != "grpo":
            suffix = "" if method == "erl" else f"[{method}]"
            print(f"erl_grpo_steps_ratio{suffix}: {ratio(method, 'step'):.3f}")
            print(f"erl_grpo_tokens_ratio{suffix}: {ratio(method, 'tokens'):.3f}")
            print(f"erl_grpo_seconds_ratio{suffix}: {ratio(method, 'seconds'):.3f}")
    if "erl" in results:
        # The gap beats the spread when every ERL seed reached the threshold in fewer
        # steps than every GRPO seed.
        beats = all(cross["erl"]) and max(reached["erl"]["step"]) < min(reached["grpo"]["step"])
        print(f"erl_gap_exceeds_seed_spread: {str(beats).lower()}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--level", type=int, default=1, help="arithmetic level trained on")
    parser.add_argument("--steps", type=int, default=100, help="training steps per ERL run")
    parser.add_argument(
        "--grpo_steps", type=int, default=300, help="training steps per GRPO run (0: --steps)"
    )
    parser.add_argument("--ablations", action="store_true", help="also the three ERL ablations")
    parser.add_argument("--methods", default="", help="comma list instead of grpo,erl[,ablations]")
    parser.add_argument("--style", choices=sorted(FEEDBACK), default="reveal")
    # 0.15: what GRPO reaches within 300 steps here (neither method nears the curriculum's 0.6).
    parser.add_argument("--threshold", type=float, default=0.15, help="promotion threshold on r1")
    # 640 = 10 steps: with 8 samples per prompt, 128 attempts (16 prompts) cross 0.15 by chance.
    parser.add_argument(
        "--window", type=int, default=640, help="first attempts in the rolling mean"
    )
    parser.add_argument("--batch", type=int, default=64, help="completions per step")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max_tokens", type=int, default=12)
    parser.add_argument("--reflection_tokens", type=int, default=12)
    parser.add_argument("--warmup_steps", type=int, default=400)
    parser.add_argument("--warmup_lr", type=float, default=3e-3)
    parser.add_argument("--feedback_examples", type=int, default=6000)
    parser.add_argument("--feedback_levels", default="2")
    parser.add_argument("--reference_examples", type=int, default=0)
    parser.add_argument(
        "--warmup_memory",
        choices=MEMORY_SCOPES,
        default="similar",
        help="the memory the warm-up's reflection prompts show (feedback_rows' memory_scope)",
    )
    parser.add_argument("--eval_n", type=int, default=128)
    parser.add_argument("--eval_every", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out", default=".cache/bench-learning")
    parser.add_argument(
        "--probe", action="store_true", help="only measure the warm checkpoint's feedback reading"
    )
    parser.add_argument(
        "--warm_only",
        action="store_true",
        help="only build (or find) the warm checkpoint and print its folder, e.g. to collect "
        "on-policy ratings from it for --reward_model",
    )
    parser.add_argument("--fresh", action="store_true", help="ignore cached runs")
    parser.add_argument(
        "--reward_model",
        default="",
        help="train every method on this learned reward model (a `python -m "
        "pipeline.reward_model` folder) instead of the correctness program; held-out "
        "success is still the task's correctness",
    )
    opts = parser.parse_args()
    methods = opts.methods.split(",") if opts.methods else list(METHODS)
    if opts.ablations and not opts.methods:
        methods += list(ABLATIONS)
    known = {**METHODS, **ABLATIONS, **VARIANTS}
    unknown = [m for m in methods if m not in known]
    if unknown or "grpo" not in methods:
        # GRPO is the reference every figure of the report is compared with.
        parser.error(
            f"--methods {opts.methods!r}: "
            + (f"unknown {unknown}; choose from {sorted(known)}" if unknown else "include grpo")
        )

    torch.set_num_threads(1)  # fair and stable on a shared machine
    s = Settings(
        opts.style, opts.level, opts.steps, opts.grpo_steps or opts.steps, opts.batch, opts.generations, opts.lr, opts.max_tokens,
        opts.reflection_tokens, opts.warmup_steps, opts.warmup_lr, opts.feedback_examples,
        opts.feedback_levels, opts.reference_examples, opts.eval_n, opts.eval_every,
        opts.hidden, opts.layers, opts.warmup_memory,
    )  # fmt: skip
    # Checked before the warm-up (minutes) so a bad path fails at once. The reward model joins
    # the runs' cache key only when given, so runs on the program's reward keep their names.
    extra = {"reward_model": reward_model_id(opts.reward_model)} if opts.reward_model else None
    if opts.reward_model:
        # r1 and the threshold are then the learned score, not correctness.
        print(f"reward: the learned model {extra['reward_model']} (r1 is its score)")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    warm = warm_checkpoint(s, out)
    if opts.warm_only:
        print(f"warm_checkpoint: {warm}")
        return
    if opts.probe:
        for name, value in probe_feedback_skill(warm, s).items():
            print(f"probe_{name}: {value:.3f}")
        return
    task = make_task(s.style)
    start_success = held_out(task, AutoTokenizer.from_pretrained(warm), s)(
        AutoModelForCausalLM.from_pretrained(warm)
    )
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as work:
        for seed in range(opts.seeds):
            for method in methods:
                path = out / "runs" / f"{method}-s{seed}-{s.key(extra)}.json"
                if path.exists() and not opts.fresh:
                    run = json.loads(path.read_text())
                else:
                    start = time.perf_counter()
                    run = train_one(method, seed, warm, s, Path(work), opts.reward_model)
                    print(f"{method} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(run))
                    tmp.replace(path)
                run["start_success"] = start_success
                results.setdefault(method, []).append(run)
    report(results, opts, s, out)


if __name__ == "__main__":
    main()
