"""Does ERL learn faster than GRPO, and than TRL's SDPO? All arms from one warm checkpoint.

    python bench/learning.py                            # the reported configuration:
                                                        #   hidden_rule, 5 seeds, grpo,
                                                        #   grpo_matched, erl, sdpo + gates
    python bench/learning.py --ablations --seeds 3      # + no memory / internalization /
                                                        #   reflection, the memory scopes
    python bench/learning.py --probe                    # gate a only (the warm checkpoint)
    python bench/learning.py --task arithmetic --warmup_memory same_prompt   # the arithmetic
                                                        #   comparison (3 seeds, grpo, erl)
    python bench/learning.py --task arithmetic --methods grpo --steps 300 --reward_model runs/rm

`--task` picks a preset (every option below it overrides one value of it):

- hidden_rule (the default): `a#b` under a rule the prompt never states (level 1: a+b+k,
  `--rule_seed` picks k), shared by every prompt, so a lesson carries over; held-out
  prompts are operand pairs never trained on. Binary reward; the feedback names the
  error's direction and size ("it is 2 too low"). The regime of the ERL paper's gains.
- arithmetic: level-1 sums with a binary reward and the reveal feedback ("The correct answer
  is 8."): each lesson is a fact about one prompt, and the held-out prompts reuse the sums.

What every arm shares (learning_arms.py; a test checks it): the warm checkpoint, the rows
and their order, the optimizer and ONE learning-rate schedule over `--steps` (constant by
default for hidden_rule, linear to 0 at `--steps` for arithmetic); `--stop arm=N` cuts an
arm off early on that schedule. Arms: `grpo` (ERLTrainer with the gate closed, which trains
exactly like GRPOTrainer), `grpo_matched` (`--matched_generations` per prompt, so a step
generates about as much as ERL's), `erl`, and `sdpo` (TRL's SDPOTrainer; its teacher is the
model reprompted with each row's `privileged_context` = the feedback on the warm
checkpoint's greedy first attempt, `include_environment_feedback=True`, and with a
successful sibling). `--ablations` and the variants in learning_arms.py add more.

Before the comparison it prints three gates (learning_gates.py), each with pass/fail:
a) reflection + retry fix clearly more failed first attempts than a fresh second sample;
b) SFT on the training prompts' right answers lifts the held-out prompts (capacity);
c) GRPO is not starved: its first attempts succeed at least once per step on average.

Then: r1 against steps, generated tokens and seconds; steps, tokens and seconds to the
threshold (the controller's rule: rolling mean of r1 over `--window` first attempts >=
`--threshold`); held-out greedy success at equal steps and at equal tokens; every seed,
mean ± sd, paired per-seed differences against GRPO (and SDPO) and whether the gap exceeds
2 sd of them; r2 against r1 and internalization; a PNG of the curves; and last the
`name: value` lines, ending with erl_grpo_steps_ratio, erl_grpo_tokens_ratio,
erl_gap_exceeds_seed_spread and the same three for sdpo. Runs and gates are cached under
`--out` by a hash of everything their result depends on; seconds are taken under whatever
load the machine had (steps and tokens are not).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tempfile
import time
from pathlib import Path

import learning_arms as arms  # bench/, the script's own folder (it sets the backend)
import learning_gates as gates
import learning_report
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.erl.memory import MEMORY_SCOPES
from pipeline.reward_model.signals import INFO_FILE, add_learned_signals, check_reward_model_specs

PRESETS = {
    "hidden_rule": dict(
        methods="grpo,grpo_matched,erl,sdpo",
        seeds=5,
        level=1,
        rule_seed=0,
        style="rule",
        reward="binary",
        steps=60,
        lr=5e-4,
        lr_scheduler="constant",
        lr_warmup_steps=0,
        batch=64,
        generations=8,
        matched_generations=16,
        max_tokens=12,
        reflection_tokens=16,
        memory_scope="global",
        threshold=0.6,
        window=256,
        warmup_steps=800,
        warmup_lr=3e-3,
        feedback_examples=3000,
        feedback_levels="1",
        reference_examples=0,
        warmup_memory="global",
        eval_n=0,
        eval_every=5,
    ),
}
PRESETS["arithmetic"] = PRESETS["hidden_rule"] | dict(
    methods="grpo,erl",
    seeds=3,
    style="reveal",
    steps=100,
    lr_scheduler="linear",
    matched_generations=24,
    reflection_tokens=12,
    memory_scope="same_prompt",
    # 0.15: what GRPO reaches within 300 steps (neither nears the curriculum's 0.6);
    # 640 = 10 steps: with 8 samples per prompt, 128 attempts cross 0.15 by chance.
    threshold=0.15,
    window=640,
    warmup_steps=400,
    feedback_examples=6000,
    feedback_levels="2",
    warmup_memory="similar",
    eval_n=128,
    eval_every=20,
)


def parse_options(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(PRESETS), default="hidden_rule")
    add = parser.add_argument
    add("--methods", help="comma list of arms (learning_arms.py); must include grpo")
    add("--ablations", action="store_true", help="also the ERL ablations")
    add("--seeds", type=int)
    add("--level", type=int)
    add("--rule_seed", type=int, help="hidden_rule: picks the rule (0: a#b = a+b+2)")
    add("--style", choices=sorted(arms.FEEDBACK), help="the feedback ERL reads")
    add("--reward", choices=sorted(arms.REWARDS))
    add("--steps", type=int, help="every arm's max_steps: the one schedule's horizon")
    add("--stop", default="", help="stop arms early on the same schedule: 'erl=40,sdpo=40'")
    add("--lr", type=float)
    add("--lr_scheduler", choices=("constant", "linear", "cosine"))
    add("--lr_warmup_steps", type=int)
    add("--batch", type=int, help="first attempts per step")
    add("--generations", type=int, help="completions per prompt")
    add("--matched_generations", type=int, help="grpo_matched's completions per prompt")
    add("--max_tokens", type=int)
    add("--reflection_tokens", type=int)
    add("--memory_scope", choices=MEMORY_SCOPES, help="the erl arm's memory scope")
    add("--threshold", type=float, help="promotion threshold on r1 (analysis only)")
    add("--window", type=int, help="first attempts in the rolling mean (analysis only)")
    add("--warmup_steps", type=int)
    add("--warmup_lr", type=float)
    add("--feedback_examples", type=int)
    add("--feedback_levels")
    add("--reference_examples", type=int)
    add("--warmup_memory", choices=MEMORY_SCOPES, help="the memory the warm-up rows show")
    add("--eval_n", type=int, help="held-out prompts (arithmetic; hidden_rule uses every pair)")
    add("--eval_every", type=int)
    add("--hidden", type=int, default=64, help="the tiny model's hidden size")
    add("--layers", type=int, default=2, help="the tiny model's layers")
    add("--out", default=".cache/bench-learning")
    add("--probe", action="store_true", help="only gate a, on the warm checkpoint")
    add("--skip_gates", action="store_true", help="compare without printing the gates")
    add("--warm_only", action="store_true", help="only build the warm checkpoint; print it")
    add("--fresh", action="store_true", help="ignore cached runs")
    add(
        "--reward_model",
        default="",
        help="train every arm on this learned reward model (a `python -m pipeline.reward_model` "
        "folder) instead of the correctness program; held-out success is still correctness",
    )
    opts = parser.parse_args(argv)
    for name, value in PRESETS[opts.task].items():
        if getattr(opts, name) is None:
            setattr(opts, name, value)
    methods = opts.methods.split(",")
    if opts.ablations:
        methods += [m for m in arms.ABLATIONS if m not in methods]
    unknown = [m for m in methods if m not in arms.ALL_ARMS]
    if unknown or "grpo" not in methods:
        parser.error(
            f"--methods {opts.methods!r}: "
            + (
                f"unknown {unknown}; choose from {sorted(arms.ALL_ARMS)}"
                if unknown
                else "include grpo"
            )
        )
    opts.methods = methods
    fields = {f.name for f in dataclasses.fields(arms.Settings)}
    settings = arms.Settings(**{k: v for k, v in vars(opts).items() if k in fields})
    return opts, settings


# A learned reward model ---------------------------------------------------------------------


def reward_model_id(path: str) -> str:
    """What names a learned reward model in the run cache: its folder and its training
    record (reward_model.json changes whenever the model is retrained there)."""
    folder = Path(path)
    if not (folder / "config.json").exists() and not (folder / "adapter_config.json").exists():
        raise SystemExit(
            f"--reward_model {path}: no reward model there (no config.json or "
            "adapter_config.json); train one with `python -m pipeline.reward_model`"
        )
    if not (folder / INFO_FILE).exists():
        raise SystemExit(
            f"--reward_model {path}: no {INFO_FILE} (its calibration); train it with "
            "`python -m pipeline.reward_model`"
        )
    digest = hashlib.sha1((folder / INFO_FILE).read_bytes()).hexdigest()[:10]
    return f"{folder.resolve()}#{digest}"


def learned_funcs(task, s, reward_model: str):
    """The learned reward model as the only weighted signal, as configs/tiny_reward_model.yaml
    runs it: the correctness program stays with weight 0 (TRL still logs it) and its
    feedback stays out, so the policy never hears the programmatic verdict."""
    reward_funcs, weights, feedback_func = arms.make_funcs(task, s)
    specs = check_reward_model_specs({"correct": {"path": reward_model, "weight": 1.0}})
    return add_learned_signals(
        specs, {}, reward_funcs, [0.0] * len(weights), feedback_func, device="cpu",
        program_feedback=False,
    )  # fmt: skip


# The gates ----------------------------------------------------------------------------------


def print_gates(warm: Path, warm_key: str, s, out: Path) -> dict:
    """Gates a, b and c, cached per warm checkpoint (they do not depend on the arms)."""
    key = arms.digest([warm_key, dataclasses.asdict(s) | {"stop": ""}, arms.BENCH_SCHEMA])
    probe = gates.cached(out / "gates" / f"probe-{key}.json", lambda: gates.probe(warm, s))
    capacity = gates.cached(
        out / "gates" / f"capacity-{key}.json", lambda: gates.capacity(warm, s, out)
    )
    per_step = probe["first_attempt_success"] * s.batch
    print("\ngates (before RL, on the warm checkpoint):")
    print(f"  a) feedback reading: {probe}")
    print(f"     passes: {gates.probe_passes(probe)} (retry after reflection >= 2x a fresh "
          "sample and 0.1 above it)")  # fmt: skip
    print(f"  b) capacity: {capacity}")
    print(f"     passes: {gates.capacity_passes(capacity)} (held-out after SFT >= 0.5, and "
          ">= 0.25 above before)")  # fmt: skip
    print(f"  c) GRPO not starved: sampled first-attempt success {probe['first_attempt_success']:.4f}"
          f" = {per_step:.2f} successes per {s.batch}-completion step; passes: {per_step >= 1}")  # fmt: skip
    for name, value in probe.items():
        print(f"probe_{name}: {value:.3f}")
    return {"probe": probe, "capacity": capacity, "c": per_step}


def print_starvation(results: dict[str, list[dict]], steps: int = 10) -> None:
    """Gate c as measured: GRPO's first-attempt success over its first `steps` steps."""
    for method in ("grpo", "grpo_matched"):
        for run in results.get(method, []):
            r1 = [r for rec in run["steps"][:steps] for r in rec["r1"] if r == r]
            rate = sum(r >= 1.0 for r in r1) / max(len(r1), 1)
            print(f"  c) measured: {method} seed {run['seed']}: first-attempt success over "
                  f"steps 1-{steps} {rate:.4f} ({rate * len(r1) / steps:.1f} per step)")  # fmt: skip


# The runs -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    opts, s = parse_options(argv)
    torch.set_num_threads(1)  # fair and stable on a shared machine
    started, cpu_started = time.perf_counter(), time.process_time()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    task = arms.make_task(s)
    funcs, extra = None, {}
    if opts.reward_model:  # checked before the warm-up (minutes), so a bad path fails at once
        extra["reward_model"] = reward_model_id(opts.reward_model)
        funcs = learned_funcs(task, s, opts.reward_model)
        print(f"reward: the learned model {extra['reward_model']} (r1 is its score)")
    warm, warm_key = gates.warm_checkpoint(s, out)
    if opts.warm_only:
        print(f"warm_checkpoint: {warm}")
        return
    if opts.probe:
        for name, value in gates.probe(warm, s).items():
            print(f"probe_{name}: {value:.3f}")
        return
    if not opts.skip_gates:
        print_gates(warm, warm_key, s, out)
    evaluate = arms.held_out(task, AutoTokenizer.from_pretrained(warm), s)
    start = gates.cached(
        out / "gates" / f"start-{arms.digest([warm_key, dataclasses.asdict(s)])}.json",
        lambda: evaluate(AutoModelForCausalLM.from_pretrained(warm)),
    )
    all_rows = [r for seed in range(opts.seeds) for r in arms.train_rows(task, s, seed)]
    contexts = {}
    for kind in {arms.ALL_ARMS[m].context for m in opts.methods} - {""}:
        contexts[kind] = gates.sdpo_contexts(warm, s, kind, all_rows)
        example = next(iter(contexts[kind].items()))
        print(f"sdpo privileged_context ({kind}), e.g. {example}")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-learning-") as work:
        for seed in range(opts.seeds):
            rows = arms.train_rows(task, s, seed)
            for method in opts.methods:
                spec = arms.ALL_ARMS[method]
                config = arms.arm_config(method, s, "unused", seed, reward_weights=(funcs or arms.make_funcs(task, s))[1])  # fmt: skip
                run_extra = extra | ({"contexts": contexts[spec.context]} if spec.context else {})
                key = arms.run_key(method, seed, s, warm_key, config, rows, run_extra)
                path = out / "runs" / f"{method}-s{seed}-{key}.json"
                if path.exists() and not opts.fresh:
                    run = json.loads(path.read_text())
                else:
                    begin = time.perf_counter()
                    run = arms.train_one(
                        method, seed, warm, s, Path(work), funcs, contexts.get(spec.context)
                    )
                    print(f"{method} seed {seed}: {time.perf_counter() - begin:.0f} s", flush=True)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.with_suffix(".tmp").write_text(json.dumps(run))
                    path.with_suffix(".tmp").replace(path)
                run["start"] = start
                results.setdefault(method, []).append(run)
    if not opts.skip_gates:
        print_starvation(results)
    # With one torch thread the CPU time is about the wall time on an idle machine; both
    # count only what this invocation computed (cached runs and warm-ups cost nothing).
    print(f"\nbench_seconds: {time.perf_counter() - started:.0f}")
    print(f"bench_cpu_seconds: {time.process_time() - cpu_started:.0f}")
    title = f"{s.task} level {s.level}, {s.reward} reward"
    learning_report.report(results, opts, s, out, title)


if __name__ == "__main__":
    main()
