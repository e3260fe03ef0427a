"""The learning bench's analysis: curves, steps and tokens to the threshold, held-out success
at equal steps and at equal tokens, paired per-seed differences with 95% t-intervals per
rule and pooled over the rules, the verdict, ERL's diagnostics, the plot and the
`name: value` lines; and the learning-rate sweep's table.

Arms fall in three groups: the GRPO arms (`learning_arms.BASELINES`), the SDPO arms, and
the candidates (ERL and every other ERLTrainer arm, such as an ablation or a new option).
Each candidate is compared with the better GRPO arm and the better SDPO arm (better: the
higher pooled mean on that measure), so that no candidate wins against a weaker peer.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from learning_arms import BASELINES, is_sdpo, make_task, reaches, states_the_rule

from pipeline.compare.stats import Interval, interval, paired, value_at
from pipeline.erl.memory import lesson_problem

MEASURES = {
    "equal_steps": "at equal steps",
    "equal_tokens": "at equal generated tokens (GRPO's total)",
    # every token a forward pass reads, prompts included (learning_arms.ProcessedTokens)
    "equal_processed": "at equal processed tokens (GRPO's total)",
}
COST = {"tokens": "generated tokens", "processed": "processed tokens"}


def crossing(run: dict, threshold: float, window: int) -> dict | None:
    """Step, tokens and seconds at which the rolling r1 mean first reaches the threshold
    (the curriculum controller's promotion rule)."""
    rewards: list[float] = []
    for record in run["steps"]:
        rewards += [r for r in record["r1"] if r == r]
        if reaches(rewards, threshold, window):
            return {k: record[k] for k in ("step", "tokens", "processed", "seconds")}
    return None


def success_at(run: dict, key: str, value: float, field: str = "success") -> float:
    """Held-out success at `value` steps or tokens, interpolated between evaluations (the
    last evaluation's where the run ends before `value`)."""
    return value_at([(0, run["start"][field])] + [(e[key], e[field]) for e in run["evals"]], value)


def r1_curve(run: dict, every: int) -> list[tuple[int, int, float, float]]:
    """(step, tokens, seconds, mean r1 over the last `every` steps) every `every` steps."""
    out = []
    for i in range(every - 1, len(run["steps"]), every):
        chunk = [r for rec in run["steps"][i - every + 1 : i + 1] for r in rec["r1"] if r == r]
        rec = run["steps"][i]
        out.append((rec["step"], rec["tokens"], rec["seconds"], sum(chunk) / max(len(chunk), 1)))
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def held_out(runs: dict[str, list[dict]], s) -> dict[str, dict[str, list[float]]]:
    """Arm -> measure -> held-out success per seed: at the arm's last step (equal steps),
    at GRPO's median generated-token total (equal tokens) and at its median processed-token
    total (equal processed tokens)."""
    totals = {key: median([run["steps"][-1][key] for run in runs["grpo"]]) for key in COST}
    return {
        arm: {
            "equal_steps": [success_at(r, "step", s.stop_at(arm)) for r in arm_runs],
            "equal_tokens": [success_at(r, "tokens", totals["tokens"]) for r in arm_runs],
            "equal_processed": [success_at(r, "processed", totals["processed"]) for r in arm_runs],
        }
        for arm, arm_runs in runs.items()
    }


def per_step(runs: list[dict], key: str) -> float:
    """Mean generated (or processed) tokens a step, over seeds."""
    return statistics.fmean(run["steps"][-1][key] / run["steps"][-1]["step"] for run in runs)


def retry_diagnostics(runs: list[dict]) -> dict[str, float]:
    """Do retries beat first attempts (r2 against r1), and what enters the loss?"""
    r1, r2, n_success = [], [], 0
    for run in runs:
        for batch in run["retries"]:
            for a, b, ok in zip(batch["r1"], batch["r2"], batch["valid"]):
                if ok:
                    r1.append(a)
                    r2.append(b)
                    n_success += b >= 1.0
    steps = [rec for run in runs for rec in run["steps"]]

    def mean_of(key: str) -> float:
        values = [rec[key] for rec in steps if key in rec]
        return statistics.fmean(values) if values else math.nan

    return {
        "retries": float(len(r1)),
        "gated_r1_mean": statistics.fmean(r1) if r1 else math.nan,
        "r2_mean": statistics.fmean(r2) if r2 else math.nan,
        "retry_success_rate": n_success / len(r1) if r1 else math.nan,
        "internalized_rows_per_step": mean_of("erl/internalization_rows"),
        "internalization_loss": mean_of("erl/internalization_loss"),
        "sdpo_reprompted_fraction": mean_of("self_distillation/reprompt_sample_fraction"),
        "sdpo_feedback_used_fraction": mean_of("self_distillation/feedback_used_fraction"),
        "sdpo_distillation_loss": mean_of("self_distillation/distillation_loss"),
    }


def _seeds(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def print_rule(label: str, runs: dict[str, list[dict]], s, opts) -> dict:
    """One rule's tables; returns its per-seed figures (held-out, steps, tokens)."""
    task = make_task(s)  # hidden_rule states its rule; arithmetic has none
    name = task.rule_text(s.level) if hasattr(task, "rule_text") else f"{s.task} level {s.level}"
    print(f"\n=== rule {label}: {name} ===")
    every = max(1, s.steps // 10)
    print(f"r1 (mean over seeds, over {every}-step blocks) as step/tokens/seconds:r1:")
    for arm, arm_runs in runs.items():
        curves = [r1_curve(run, every) for run in arm_runs]
        cells = []
        for i in range(min(len(c) for c in curves)):
            tokens, seconds, r1 = (statistics.fmean(c[i][k] for c in curves) for k in (1, 2, 3))
            cells.append(f"{curves[0][i][0]}/{tokens / 1000:.0f}k/{seconds:.0f}s:{r1:.2f}")
        print(f"  {arm:24s} " + "  ".join(cells))

    print(f"to the threshold (rolling r1 over {opts.window} first attempts >= "
          f"{opts.threshold}); a run that never reaches it counts its total (a bound):")  # fmt: skip
    reached = {}
    for arm, arm_runs in runs.items():
        cross = [crossing(r, opts.threshold, opts.window) for r in arm_runs]
        reached[arm] = {
            key: [c[key] if c else r["steps"][-1][key] for c, r in zip(cross, arm_runs)]
            for key in ("step", "tokens", "processed")
        } | {"all": all(cross), "count": sum(c is not None for c in cross)}
        print(f"  {arm:24s} reached in {reached[arm]['count']}/{len(arm_runs)} seeds; steps "
              f"{reached[arm]['step']}; tokens {reached[arm]['tokens']}; processed "
              f"{reached[arm]['processed']}")  # fmt: skip

    figures = held_out(runs, s)
    start = runs["grpo"][0]["start"]
    size = (f"{len(task.split_rows(s.level, 'held_out'))} prompts" if hasattr(task, "split_rows")
            else f"{s.eval_n} prompts")  # fmt: skip
    print(f"held-out greedy success ({size}; start {start['success']:.3f}), per seed, mean "
          "and 95% CI:")  # fmt: skip
    for arm, by in figures.items():
        for measure, values in by.items():
            print(f"  {arm:24s} {MEASURES[measure]:32s} {_seeds(values)}  {interval(values)}")
    if "train_success" in start:
        for arm, arm_runs in runs.items():
            train = [success_at(r, "step", s.stop_at(arm), "train_success") for r in arm_runs]
            print(f"  {arm:24s} training pairs at equal steps {_seeds(train)}")

    print("diagnostics (all seeds): r2 against r1, internalization, SDPO's reprompts:")
    for arm, arm_runs in runs.items():
        if arm in BASELINES:
            continue
        diag = retry_diagnostics(arm_runs)
        print(f"  {arm}: " + ", ".join(f"{k} {v:.3f}" for k, v in diag.items() if v == v))
        for run in arm_runs:
            if run.get("memory_tail"):
                print(f"    seed {run['seed']} memory tail: {run['memory_tail']}")
    return {"held_out": figures, "reached": reached, "start": start}


def memory_figures(run: dict, states) -> dict[str, float] | None:
    """What a run's final memory holds: its entries, how many are no lesson (memory.py's
    `lesson_problem`: empty, an answer, a copy of the prompt, a repeated term), and the
    share that state the true rule (`states(text)`, as the probe counts it). None for a
    run that recorded no memory (an older cache entry, or an arm without one)."""
    entries = run.get("memory")
    if not entries:
        return None if entries is None else {"entries": 0, "degenerate": 0, "rule_share": 0.0}
    degenerate = sum(lesson_problem(e["reflection"], e["prompt"]) is not None for e in entries)
    stating = sum(states(e["reflection"].strip()) for e in entries)
    return {"entries": len(entries), "degenerate": degenerate, "rule_share": stating / len(entries)}


def print_memory(label: str, runs: dict[str, list[dict]], s) -> dict[str, list[dict]]:
    """Per ERL arm and seed: the final memory's entries, degenerate entries and the share
    stating the rule (the global rulebook's, strongest first); returns them per arm."""
    task = make_task(s)
    if not hasattr(task, "rule_text"):  # arithmetic: each lesson is a fact, no rule to state
        return {}
    rule = task.rule_text(s.level)
    shown = {}
    for arm, arm_runs in runs.items():
        figures = [
            memory_figures(run, lambda text: states_the_rule(task, s.level, text))
            for run in arm_runs
        ]
        if not any(figures):
            continue
        shown[arm] = [f for f in figures if f]
        cells = [
            f"{f['entries']}/{f['degenerate']}/{f['rule_share']:.2f}" if f else "-" for f in figures
        ]
        print(f"  {arm:24s} rule {label} memory entries/degenerate/share stating {rule!r}, "
              f"per seed: {' '.join(cells)}")  # fmt: skip
    return shown


def pooled_reached(per_rule: dict, arm: str, ref: str, key: str):
    """The steps (or tokens) to the threshold of `arm` and of `ref`, per seed pooled over
    the rules, and whether some run of either never reached it (then its total stands in
    for its crossing, and any comparison is a bound)."""
    mine = [v for f in per_rule.values() for v in f["reached"][arm][key]]
    theirs = [v for f in per_rule.values() for v in f["reached"][ref][key]]
    censored = not all(f["reached"][x]["all"] for f in per_rule.values() for x in (arm, ref))
    return mine, theirs, censored


def ratio_to_grpo(per_rule: dict, arm: str, key: str) -> tuple[list[float], Interval, bool]:
    """`arm`'s steps (or tokens) to the threshold over GRPO's, per seed pooled over the
    rules, with the 95% interval of their mean, and whether the ratio is a bound."""
    mine, theirs, censored = pooled_reached(per_rule, arm, "grpo", key)
    ratios = [a / b for a, b in zip(mine, theirs)]
    return ratios, interval(ratios), censored


def references(arms: list[str], arm: str) -> list[str]:
    """What `arm` is compared with: every GRPO arm, and every SDPO arm unless it is one."""
    refs = [a for a in arms if a in BASELINES]
    return refs + ([a for a in arms if is_sdpo(a)] if not is_sdpo(arm) else [])


def best(arms: list[str], pooled: dict[str, list[float]]) -> str | None:
    """The arm with the higher pooled mean among `arms` (None if none ran)."""
    return max(arms, key=lambda a: statistics.fmean(pooled[a])) if arms else None


def report(results: dict[str, dict], settings: dict, opts, out: Path, title: str) -> dict:
    """Print every rule's tables, the paired comparisons per rule and pooled, the
    verdict and the headline lines; returns the verdict as {arm: {name: bool}}."""
    per_rule = {
        label: print_rule(label, runs, settings[label], opts) for label, runs in results.items()
    }
    arms = list(next(iter(results.values())))
    pooled = {
        m: {a: [v for f in per_rule.values() for v in f["held_out"][a][m]] for a in arms}
        for m in MEASURES
    }

    print("\npaired per-seed differences, arm - reference (held-out success; for steps and "
          "tokens to the threshold, reference - arm), mean and 95% CI, per rule and pooled:")  # fmt: skip
    for arm in [a for a in arms if a != "grpo"]:  # grpo is every other arm's reference
        for ref in references(arms, arm):
            if ref == arm:
                continue
            for measure in MEASURES:
                for label, f in per_rule.items():
                    diffs, ci = paired(f["held_out"][arm][measure], f["held_out"][ref][measure])
                    print(f"  {arm} - {ref} {measure} rule {label}: {_seeds(diffs)}  {ci}")
                _, ci = paired(pooled[measure][arm], pooled[measure][ref])
                print(f"  {arm} - {ref} {measure} pooled: {ci}")
            for key in ("step", "tokens", "processed"):
                a, r, censored = pooled_reached(per_rule, arm, ref, key)
                _, ci = paired(r, a)
                print(f"  {ref} - {arm} {key.rstrip('s')}s to the threshold pooled: {ci}"
                      + (" (a bound: some runs never reached it)" if censored else ""))  # fmt: skip

    against_references(arms, pooled)
    print("\nfinal memories (entries/degenerate/share stating the rule) and each candidate's "
          "steps and generated tokens to the threshold over GRPO's (pooled, mean and 95% CI):")  # fmt: skip
    for label, runs in results.items():
        for arm, figures in print_memory(label, runs, settings[label]).items():
            print(f"memory_degenerate_entries[{arm}, {label}]: "
                  f"{sum(f['degenerate'] for f in figures)}")  # fmt: skip
            share = statistics.fmean(f["rule_share"] for f in figures)
            print(f"memory_rule_share[{arm}, {label}]: {share:.3f}")
    for arm in [a for a in arms if a not in BASELINES and not is_sdpo(a)]:
        for key, name in (("step", "steps"), ("tokens", "tokens"), ("processed", "processed")):
            ratios, ci, censored = ratio_to_grpo(per_rule, arm, key)
            bound = " (a bound: some runs never reached it)" if censored else ""
            print(f"{arm}_grpo_{name}_ratio: {ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]"
                  f"{bound}")  # fmt: skip

    print("\ntokens a step over GRPO's (mean over rules and seeds):")
    for arm in arms:
        for key, words in COST.items():
            ratios = [
                per_step(runs[arm], key) / per_step(runs["grpo"], key) for runs in results.values()
            ]
            print(f"{arm}_{key}_per_step_over_grpo: {statistics.fmean(ratios):.2f}  ({words})")
    plot(results, opts.threshold, title, out / "learning_curves.png")
    print(f"\ncurves: {out / 'learning_curves.png'}\n")
    for arm in arms:
        reached = [f["reached"][arm] for f in per_rule.values()]
        print(f"steps_to_threshold[{arm}]: {median([v for r in reached for v in r['step']]):.0f}")
        print(
            f"tokens_to_threshold[{arm}]: {median([v for r in reached for v in r['tokens']]):.0f}"
        )
        print(f"seeds_reaching_threshold[{arm}]: {sum(r['count'] for r in reached)}/"
              f"{len(pooled['equal_steps'][arm])}")  # fmt: skip
        for measure in MEASURES:
            print(f"heldout_success_{measure}[{arm}]: {median(pooled[measure][arm]):.3f}")
            print(f"heldout_mean_{measure}[{arm}]: {interval(pooled[measure][arm])}")
    starts = [f["start"]["success"] for f in per_rule.values()]
    print(f"heldout_success_start: {statistics.fmean(starts):.3f}")
    return verdict(arms, pooled)


VARIANT_REFERENCES = ("erl", "erl_defaults")
"""What each ERL variant is paired against: `erl` (the ERL paper's step), and `erl_defaults`
(the product's defaults, which a variant must beat to replace them)."""


def against_references(arms: list[str], pooled: dict[str, dict[str, list[float]]]) -> None:
    """Every other ERLTrainer arm minus `erl` (and minus `erl_defaults`), paired by seed and
    pooled over the rules: what decides whether an option becomes a default (issue 32:
    "no worse per step")."""
    variants = [a for a in arms if a not in BASELINES and not is_sdpo(a)]
    for ref in [r for r in VARIANT_REFERENCES if r in arms]:
        print(f"\nERL variants against {ref} (pooled, paired by seed, mean and 95% CI):")
        # erl - erl_defaults would only negate erl_defaults - erl, printed above
        for arm in [a for a in variants if a != ref and (ref == "erl" or a != "erl")]:
            for measure in MEASURES:
                _, ci = paired(pooled[measure][arm], pooled[measure][ref])
                print(f"{arm}_minus_{ref}_{measure}: {ci.mean:+.3f} [{ci.low:+.3f}, "
                      f"{ci.high:+.3f}]")  # fmt: skip


def verdict(arms: list[str], pooled: dict[str, dict[str, list[float]]]) -> dict:
    """The last lines: for ERL and every other candidate arm, whether it beats the better
    GRPO arm and the better SDPO arm (an SDPO arm: the better GRPO arm) at equal steps, at
    equal generated tokens and at equal processed tokens: the pooled 95% interval of its
    paired difference lies above 0."""
    out = {}
    grpo_arms = [a for a in arms if a in BASELINES]
    sdpo_arms = [a for a in arms if is_sdpo(a)]
    for arm in [a for a in arms if a not in BASELINES]:
        out[arm] = {}
        for measure, words in MEASURES.items():
            for family, group in (("grpo", grpo_arms), ("sdpo", sdpo_arms)):
                ref = best(group, pooled[measure])
                if ref is None or (family == "sdpo" and is_sdpo(arm)):
                    continue
                _, ci = paired(pooled[measure][arm], pooled[measure][ref])
                beats = ci.low > 0
                out[arm][f"beats_{family}_{measure}"] = beats
                print(f"verdict[{arm}]: {words}, {arm} - {ref} (the better {family.upper()} "
                      f"arm) = {_plain(ci)}: {_words(ci)}")  # fmt: skip
                print(f"{arm}_beats_{family}_{measure}: {str(beats).lower()}")
    return out


def _plain(ci: Interval) -> str:
    return f"{ci.mean:+.3f}, 95% CI [{ci.low:+.3f}, {ci.high:+.3f}], {ci.n} paired seeds"


def _words(ci: Interval) -> str:
    return {
        "above 0": "it beats it",
        "below 0": "it is worse",
        "spans 0": "no difference shown (the interval spans 0)",
    }[ci.verdict]


def sweep_report(results: dict[str, dict], settings: dict, opts) -> dict[str, float]:
    """The learning-rate sweep: per arm and rate, held-out success at equal steps per
    seed and its mean over the tuning rules and seeds; each arm's best rate (ties: the
    higher r1 over the last tenth of the steps) and the `--lr` value that runs them."""
    table: dict[str, dict[float, tuple[list[float], list[float]]]] = {}
    for label, runs in results.items():
        s = settings[label]
        figures = held_out(runs, s)
        every = max(1, s.steps // 10)
        for arm, arm_runs in runs.items():
            rate = s.learning_rate(arm)
            late = [r1_curve(run, every)[-1][3] for run in arm_runs]
            held, r1 = table.setdefault(arm, {}).setdefault(rate, ([], []))
            held += figures[arm]["equal_steps"]
            r1 += late
    print(f"\nlearning-rate sweep: rules {opts.tuning_rules}, seeds {opts.sweep_seeds}; "
          "held-out success at equal steps per run (rules x seeds), mean; r1 late:")  # fmt: skip
    chosen = {}
    for arm, by_rate in table.items():
        for rate, (held, r1) in sorted(by_rate.items()):
            print(f"  {arm:16s} lr {rate:<8g} {_seeds(held)}  mean {statistics.fmean(held):.3f}"
                  f"  r1 late {statistics.fmean(r1):.3f}")  # fmt: skip
        chosen[arm] = max(
            by_rate,
            key=lambda r: (statistics.fmean(by_rate[r][0]), statistics.fmean(by_rate[r][1])),
        )
    for arm, rate in chosen.items():
        print(f"best_lr[{arm}]: {rate:g}")
    print("best_lr: " + ",".join(f"{arm}={rate:g}" for arm, rate in chosen.items()))
    return chosen


def plot(results: dict[str, dict], threshold: float, title: str, path: Path) -> None:
    """r1 against steps, tokens and seconds: one row of panels per rule, mean over seeds
    and a min..max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(len(results), 3, figsize=(15, 4.2 * len(results)), squeeze=False)
    for axes, (label, runs) in zip(grid, results.items()):
        for arm, arm_runs in runs.items():
            every = max(1, len(arm_runs[0]["steps"]) // 10)
            curves = [r1_curve(run, every) for run in arm_runs]
            n = min(len(c) for c in curves)
            for axis, col, name in zip(axes, (0, 1, 2), ("steps", "generated tokens", "seconds")):
                xs = [statistics.fmean(c[i][col] for c in curves) for i in range(n)]
                ys = [statistics.fmean(c[i][3] for c in curves) for i in range(n)]
                lo = [min(c[i][3] for c in curves) for i in range(n)]
                hi = [max(c[i][3] for c in curves) for i in range(n)]
                (line,) = axis.plot(xs, ys, label=arm)
                axis.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
                axis.set_xlabel(name)
        for axis in axes:
            axis.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
            axis.set_ylabel(f"rule {label}: r1")
        axes[0].legend()
    fig.suptitle(f"{title}: mean over seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
