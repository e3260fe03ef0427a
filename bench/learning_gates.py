"""The learning bench's starting point and its gates: the warm checkpoint every arm starts
from, and the checks that must pass before a comparison counts.

- The warm-up (SFT, once per setting) teaches reading feedback, never the run's answers:
  arithmetic: `feedback_rows` at `--feedback_levels`; hidden_rule: plain a+b, the "+" reading
  of an unknown operation, `rule_rows` over many symbols and constants, and SDPO's teacher
  prompt with the same feedback, so that both ways of using feedback start able to read it.
- Gate a (`--probe`): before RL, a reflection + retry fixes clearly more failed first
  attempts than a fresh second sample (and SDPO's teacher prompt than the plain prompt).
- Gate b (capacity): SFT on the training prompts' right answers lifts the held-out prompts.
- Gate c (GRPO is not starved): its first attempts succeed often enough for a gradient.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from datasets import Dataset, concatenate_datasets
from feedback_warmup import feedback_rows, rule_rows
from learning_arms import (
    REFLECTION_TEMPLATE,
    RETRY_TEMPLATE,
    Settings,
    common_args,
    config_fingerprint,
    digest,
    make_funcs,
    make_task,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from curriculum.tasks import get_task
from pipeline import ERLConfig, build_tiny_model
from pipeline.erl.prompts import memory_text, reflection_prompt, retry_prompt
from pipeline.evaluate.first_attempts import generate_completions
from pipeline.run.warmup import reference_dataset, sft_warmup, warmup_config

WARM_SYMBOLS = ("@", "$", "&", "%", "~", "#")  # the run's '#' too: its rule never is
WARM_BATCH = 64
# The share of "+"-prior rows whose answer is a+b+j for a random j in 1..5: a prior that is
# not a point mass, so that first attempts at a+b+2 succeed a few percent of the time and
# GRPO is not starved (with a pure a+b prior they succeeded 0.2% of the time: docs/log.md).
PRIOR_NOISE = 0.2


def _sdpo_templates() -> dict[str, str]:
    """SDPO's default teacher templates (the ones the bench's SDPO arms run with)."""
    import dataclasses

    from trl.experimental.sdpo import SDPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(SDPOConfig)}
    return {k: fields[k] for k in ("reprompt_template", "solution_template", "feedback_template")}


def sdpo_teacher_prompt(prompt: list[dict], feedback: str = "", solution: str = "") -> list:
    """The prompt SDPO's teacher sees (SuccessfulRolloutTeacherContextBuilder, TRL 1.15):
    the system turn, then the user turn rewritten with a sibling's solution and feedback."""
    t = _sdpo_templates()
    text = t["reprompt_template"].format(
        prompt=prompt[-1]["content"],
        solution=t["solution_template"].format(successful_previous_attempt=solution)
        if solution
        else "",
        feedback=t["feedback_template"].format(feedback_raw=feedback) if feedback else "",
    )
    return [*prompt[:-1], {"role": "user", "content": text}]


# The warm-up data ---------------------------------------------------------------------------


def warm_dataset(s: Settings) -> Dataset:
    """The warm-up's SFT rows (prompt -> completion), deterministic for the settings."""
    task = make_task(s)
    reward_funcs, weights, feedback_func = make_funcs(task, s)
    parts = []
    if s.task == "hidden_rule":
        parts.append(_hidden_rule_rows(task, s, reward_funcs, weights, feedback_func))
    else:
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
                    )  # fmt: skip
                )
            )
    return concatenate_datasets(parts).shuffle(seed=0)


def _hidden_rule_rows(task, s: Settings, reward_funcs, weights, feedback_func) -> Dataset:
    """Level-1 feedback reading over many rules: `feedback_examples` (reflection, retry) pairs
    from `rule_rows`, half as many SDPO teacher rows, a third each of plain a+b and of the
    "+" reading of an unknown operation (the prior a real LLM brings: first attempts at
    `3#4` say 7, and the feedback's "2 too low" is then the constant). No row is a first
    attempt at the run's rule."""
    rng = random.Random(900_001)
    n = s.feedback_examples

    def decoy():  # a random symbol and rule (a+b+k, k in 1..5), one operand pair of all
        symbol = rng.choice(WARM_SYMBOLS)
        other = get_task("hidden_rule", symbol=symbol, rule_seed=rng.randrange(10**6), split="all")
        return other, other.generate(1, 1, seed=rng.randrange(10**6))[0]

    decoys = [decoy() for _ in range(n)]
    rows = rule_rows(
        task, [r for _, r in decoys], [t.rule_text(1) for t, _ in decoys], feedback_func,
        reward_funcs, weights, reflection_template=REFLECTION_TEMPLATE,
        retry_template=RETRY_TEMPLATE, seed=1, memory_scope=s.warmup_memory,
    )  # fmt: skip

    def answer(value) -> list[dict]:
        return [{"role": "assistant", "content": f"<answer>{value}</answer>"}]

    for _ in range(n // 2):  # SDPO's teacher: the feedback, a sibling's solution, or both
        other, row = decoy()
        meta = other.meta(row)
        attempt = f"<answer>{meta['a'] + meta['b']}</answer>"
        feedback = task.evaluate(row, attempt).feedback_text(["correctness"])
        kind = rng.randrange(3)
        prompt = sdpo_teacher_prompt(
            row["prompt"],
            feedback=feedback if kind != 1 else "",
            solution=other.reference(row) if kind != 0 else "",
        )
        rows.append({"prompt": prompt, "completion": answer(row["answer"])})
    for _ in range(n // 3):  # the "+" prior on unhinted prompts, mostly a+b
        other, row = decoy()
        offset = rng.randint(1, 5) if rng.random() < PRIOR_NOISE else 0
        reading = sum(other.meta(row)[k] for k in "ab") + offset
        rows.append({"prompt": row["prompt"], "completion": answer(reading)})
    plain = reference_dataset(get_task("arithmetic"), 1, n // 3, seed=900_000)
    return concatenate_datasets([Dataset.from_list(rows), plain])


# The warm checkpoint ------------------------------------------------------------------------


def base_model(s: Settings, cache: Path) -> str:
    return build_tiny_model(
        str(cache / f"tiny-{s.hidden}x{s.layers}"), hidden_size=s.hidden, num_hidden_layers=s.layers
    )


def _folder_digest(folder: str) -> str:
    """A digest of a model folder's files (config, weights, tokenizer)."""
    import hashlib

    h = hashlib.sha1()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(hashlib.sha1(path.read_bytes()).digest())
    return h.hexdigest()[:12]


def _warm_config(s: Settings, output_dir: str):
    args = ERLConfig(**common_args(s, output_dir, 0))
    config = warmup_config(
        steps=s.warmup_steps,
        batch_size=WARM_BATCH,
        learning_rate=s.warmup_lr,
        args=args,
        output_dir=output_dir,
    )
    return args, config


def warm_checkpoint(s: Settings, cache: Path) -> tuple[Path, str]:
    """The shared starting checkpoint and its key: a digest of the base model's files, the
    warm-up rows and the fully resolved SFT config. Built once per key."""
    from learning_arms import BENCH_SCHEMA

    base = base_model(s, cache)
    dataset = warm_dataset(s)
    _, config = _warm_config(s, "unused")
    key = digest(
        {
            "schema": BENCH_SCHEMA,
            "base": _folder_digest(base),
            "rows": digest(dataset.to_list()),
            "sft": config_fingerprint(config),
        }
    )
    folder = cache / f"warm-{key}"
    if (folder / "config.json").exists():
        return folder, key
    model = AutoModelForCausalLM.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    staging = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache))
    args, _ = _warm_config(s, str(staging / "trainer"))
    start = time.perf_counter()
    sft_warmup(
        model, tokenizer, make_task(s), 1, steps=s.warmup_steps, examples=len(dataset),
        batch_size=WARM_BATCH, learning_rate=s.warmup_lr, args=args,
        output_dir=str(staging / "trainer"), dataset=dataset,
    )  # fmt: skip
    print(
        f"warm-up: {s.warmup_steps} SFT steps on {len(dataset)} rows in "
        f"{time.perf_counter() - start:.0f} s"
    )
    shutil.rmtree(staging / "trainer", ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, folder)  # atomic: a killed warm-up leaves no half checkpoint
    return folder, key


def cached(path: Path, compute):
    """`compute()`'s JSON result, stored at `path` the first time."""
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(value))
    path.with_suffix(".tmp").replace(path)
    return value


# Gate a: reading the feedback ---------------------------------------------------------------


def _sample(model, tokenizer, prompts, tokens, seed, do_sample=True):
    return generate_completions(
        model, tokenizer, prompts, max_new_tokens=tokens, do_sample=do_sample, seed=seed,
        batch_size=64, progress=False,
    )  # fmt: skip


def probe(warm: Path, s: Settings, n: int = 400) -> dict[str, float]:
    """Before any RL: sampled first attempts on training prompts; for the wrong ones, a
    sampled reflection (memory empty, as at step 1) and retry, against a fresh second
    sample; for hidden_rule also SDPO's teacher prompt with the feedback, and the retry
    from the raw feedback (the no-reflection ablation's)."""
    task = make_task(s)
    reward_funcs, weights, feedback_func = make_funcs(task, s)
    model = AutoModelForCausalLM.from_pretrained(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    rows = task.generate(s.level, n, seed=500_000)

    def solved(rows_, texts):
        return [task.evaluate(r, t).solved for r, t in zip(rows_, texts)]

    def rate(rows_, texts):
        return statistics.fmean(solved(rows_, texts)) if rows_ else math.nan

    first = _sample(model, tokenizer, [r["prompt"] for r in rows], s.max_tokens, 1)
    wrong = [i for i, ok in enumerate(solved(rows, first)) if not ok]
    w_rows = [rows[i] for i in wrong]
    columns = {k: [r[k] for r in w_rows] for k in ("task", "level", "answer", "meta")}
    completions = [[{"role": "assistant", "content": first[i]}] for i in wrong]
    feedback = feedback_func(completions=completions, **columns) if w_rows else []
    rewards = [0.0] * len(w_rows)
    for func, weight in zip(reward_funcs, weights):
        values = func(completions=completions, **columns) if w_rows else []
        rewards = [r + weight * v for r, v in zip(rewards, values)]
    reflections = _sample(
        model, tokenizer,
        [
            reflection_prompt(r["prompt"], REFLECTION_TEMPLATE, attempt=first[i], feedback=f,
                              reward=float(x), memory=memory_text([]))
            for r, i, f, x in zip(w_rows, wrong, feedback, rewards)
        ],
        s.reflection_tokens, 2,
    )  # fmt: skip
    retry = [
        retry_prompt(r["prompt"], RETRY_TEMPLATE, t.strip()) for r, t in zip(w_rows, reflections)
    ]
    retries = _sample(model, tokenizer, retry, s.max_tokens, 3)
    resamples = _sample(model, tokenizer, [r["prompt"] for r in w_rows], s.max_tokens, 4)
    for i in range(min(3, len(w_rows))):
        print(
            f"  probe: {w_rows[i]['prompt'][-1]['content']} = {w_rows[i]['answer']} | y1 "
            f"{first[wrong[i]]!r} | fb {feedback[i]!r} | refl {reflections[i]!r} | y2 {retries[i]!r}"
        )
    out = {
        "first_attempt_success": 1 - len(wrong) / n,
        "retry_success_after_reflection": rate(w_rows, retries),
        "resample_success": rate(w_rows, resamples),
    }
    if s.task == "hidden_rule":
        raw = [retry_prompt(r["prompt"], RETRY_TEMPLATE, f) for r, f in zip(w_rows, feedback)]
        out["retry_success_from_raw_feedback"] = rate(
            w_rows, _sample(model, tokenizer, raw, s.max_tokens, 5)
        )
        teacher = [sdpo_teacher_prompt(r["prompt"], feedback=f) for r, f in zip(w_rows, feedback)]
        out["sdpo_teacher_success"] = rate(
            w_rows, _sample(model, tokenizer, teacher, s.max_tokens, 6)
        )
        rulebook = task.rule_text(s.level)
        hinted = [retry_prompt(r["prompt"], RETRY_TEMPLATE, rulebook) for r in w_rows]
        out["retry_success_with_the_rule"] = rate(
            w_rows, _sample(model, tokenizer, hinted, s.max_tokens, 7)
        )
        out["reflections_stating_the_rule"] = (
            statistics.fmean(t.strip() == rulebook for t in reflections)
            if reflections
            else math.nan
        )
    return out


def probe_passes(p: dict[str, float]) -> bool:
    """'Clearly more': at least twice the fresh sample's success and 0.1 above it."""
    fixed, fresh = p["retry_success_after_reflection"], p["resample_success"]
    return fixed >= max(2 * fresh, fresh + 0.1)


# Gate b: capacity ---------------------------------------------------------------------------


def capacity(warm: Path, s: Settings, cache: Path, steps: int = 200) -> dict[str, float]:
    """SFT from the warm checkpoint on the training prompts' right answers (references):
    held-out greedy success before and after, from the bench's own evaluation."""
    from learning_arms import held_out

    task = make_task(s)
    model = AutoModelForCausalLM.from_pretrained(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    evaluate = held_out(task, tokenizer, s)
    before = evaluate(model)
    dataset = reference_dataset(task, s.level, 4000, seed=700_000)  # training seeds only
    work = Path(tempfile.mkdtemp(prefix=".capacity-", dir=cache))
    args, _ = _warm_config(s, str(work))
    start = time.perf_counter()
    sft_warmup(
        model, tokenizer, task, s.level, steps=steps, examples=len(dataset),
        batch_size=WARM_BATCH, learning_rate=s.warmup_lr, args=args, output_dir=str(work),
        dataset=dataset,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    after = evaluate(model)
    out = {"held_out_before": before["success"], "held_out_after": after["success"]}
    if "train_success" in after:
        out |= {"train_before": before["train_success"], "train_after": after["train_success"]}
    return out | {"sft_steps": float(steps), "sft_seconds": seconds}


def capacity_passes(c: dict[str, float]) -> bool:
    """SFT lifts the held-out prompts: to at least 0.5, and by at least 0.25."""
    return c["held_out_after"] >= max(0.5, c["held_out_before"] + 0.25)


# SDPO's privileged context ------------------------------------------------------------------


def sdpo_contexts(warm: Path, s: Settings, kind: str, rows: list[dict]) -> dict[str, str]:
    """Prompt text -> SDPO's static `privileged_context` for the training `rows`. "feedback":
    the task's feedback on the warm checkpoint's greedy first attempt at that prompt (what
    ERL's first reflection reads, but fixed before training; empty where that attempt was
    right); "rule": the rule itself (an upper bound: what a working rulebook would hold)."""
    task = make_task(s)
    rows = list({r["prompt"][-1]["content"]: r for r in rows}.values())
    if kind == "rule":
        return {r["prompt"][-1]["content"]: task.rule_text(s.level) for r in rows}
    _, _, feedback_func = make_funcs(task, s)
    model = AutoModelForCausalLM.from_pretrained(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    greedy = _sample(model, tokenizer, [r["prompt"] for r in rows], s.max_tokens, 0, False)
    columns = {k: [r[k] for r in rows] for k in ("task", "level", "answer", "meta")}
    completions = [[{"role": "assistant", "content": t}] for t in greedy]
    feedback = feedback_func(completions=completions, **columns)
    return {
        r["prompt"][-1]["content"]: "" if task.evaluate(r, t).solved else f
        for r, t, f in zip(rows, greedy, feedback)
    }
