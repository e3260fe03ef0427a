"""The learning bench's analysis: curves, steps and tokens to the threshold, paired per-seed
differences against GRPO, ERL's diagnostics, the plot and the `name: value` lines."""

from __future__ import annotations

import math
import statistics
from pathlib import Path


def crossing(run: dict, threshold: float, window: int) -> dict | None:
    """Step, tokens and seconds at which the rolling r1 mean first reaches the threshold
    (the curriculum controller's promotion rule)."""
    rewards: list[float] = []
    for record in run["steps"]:
        rewards += [r for r in record["r1"] if r == r]
        recent = rewards[-window:]
        if len(recent) >= window and sum(recent) / len(recent) >= threshold:
            return {k: record[k] for k in ("step", "tokens", "seconds")}
    return None


def success_at(run: dict, key: str, value: float, field: str = "success") -> float:
    """Held-out success at `value` steps or tokens, interpolated between evaluations."""
    points = [(0, run["start"][field])] + [(e[key], e[field]) for e in run["evals"]]
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


def mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    mean, sd = mean_sd(values)
    return f"mean {mean:.3f} sd {sd:.3f} min {min(values):.3f} max {max(values):.3f}"


def paired(baseline: list[float], other: list[float]) -> dict[str, float | bool]:
    """Per-seed differences baseline - other (positive: `other` needed fewer), their mean
    and sd, and whether the mean gap exceeds 2 sd of the differences."""
    diffs = [a - b for a, b in zip(baseline, other)]
    mean, sd = mean_sd(diffs)
    return {"diffs": diffs, "mean": mean, "sd": sd, "exceeds": bool(mean > 2 * sd and mean > 0)}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


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
        "sdpo_distillation_loss": mean_of("self_distillation/distillation_loss"),
    }


def plot(results: dict[str, list[dict]], threshold: float, every: int, title: str, path: Path):
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
    fig.suptitle(f"{title}: mean over seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(results: dict[str, list[dict]], opts, s, out: Path, title: str) -> dict:
    """Print the tables and the headline lines; returns the headline figures."""
    every = max(1, s.steps // 10)
    print(f"\nr1 (mean over seeds, over {every}-step blocks) against steps / tokens / s:")
    for method, runs in results.items():
        curves = [r1_curve(run, every) for run in runs]
        n = min(len(c) for c in curves)
        cells = []
        for i in range(n):
            tokens = statistics.fmean(c[i][1] for c in curves)
            seconds = statistics.fmean(c[i][2] for c in curves)
            r1 = statistics.fmean(c[i][3] for c in curves)
            cells.append(f"{curves[0][i][0]}/{tokens / 1000:.0f}k/{seconds:.0f}s:{r1:.2f}")
        print(f"  {method:24s} " + "  ".join(cells))

    cross = {
        m: [crossing(r, opts.threshold, opts.window) for r in runs] for m, runs in results.items()
    }
    print(
        f"\nto the threshold (rolling r1 over {opts.window} first attempts >= {opts.threshold}); "
        "a run that never reaches it counts its total steps, tokens and seconds (a bound):"
    )
    reached = {}
    for method, runs in results.items():
        reached[method] = {
            key: [c[key] if c else run["steps"][-1][key] for c, run in zip(cross[method], runs)]
            for key in ("step", "tokens", "seconds")
        }
        got = sum(c is not None for c in cross[method])
        print(f"  {method:24s} reached in {got}/{len(runs)} seeds")
        for key, vals in reached[method].items():
            print(f"    {key:8s} per seed {[round(v, 1) for v in vals]}  {spread(vals)}")

    grpo_tokens = median([run["steps"][-1]["tokens"] for run in results["grpo"]])
    start = results["grpo"][0]["start"]
    fields = [f for f in ("success", "train_success") if f in start]
    print(f"\nheld-out first-attempt success (greedy; {fields}), start {start}:")
    equal = {}
    for method, runs in results.items():
        equal[method] = {
            f: (
                [success_at(run, "step", s.stop_at(method), f) for run in runs],
                [success_at(run, "tokens", grpo_tokens, f) for run in runs],
            )
            for f in fields
        }
        for f in fields:
            at_steps, at_tokens = equal[method][f]
            print(f"  {method:24s} {f} at {s.stop_at(method)} steps: per seed "
                  f"{[round(v, 3) for v in at_steps]}  {spread(at_steps)}")  # fmt: skip
            print(f"  {method:24s} {f} at {grpo_tokens:.0f} tokens (GRPO's total): per seed "
                  f"{[round(v, 3) for v in at_tokens]}  {spread(at_tokens)}")  # fmt: skip

    print("\npaired per-seed differences (baseline - arm; positive: the arm needed fewer, or, "
          "for held-out success, arm - baseline), mean ± sd, gap > 2 sd:")  # fmt: skip
    pairs = {}
    for base in ("grpo", "grpo_matched", "sdpo"):
        if base not in results:
            continue
        for method in results:
            if method == base or method.startswith("grpo") or (base == "sdpo" and method != "erl"):
                continue
            seeds = min(len(results[base]), len(results[method]))
            row = {
                key: paired(reached[base][key][:seeds], reached[method][key][:seeds])
                for key in ("step", "tokens")
            }
            if not all(cross[method][:seeds]):  # a bound on the arm's side: no claim
                for key in ("step", "tokens"):
                    row[key]["exceeds"] = False
            row["held_out_equal_steps"] = paired(
                equal[method]["success"][0][:seeds], equal[base]["success"][0][:seeds]
            )
            row["held_out_equal_tokens"] = paired(
                equal[method]["success"][1][:seeds], equal[base]["success"][1][:seeds]
            )
            pairs[(base, method)] = row
            for key, p in row.items():
                print(f"  {method} vs {base} {key}: per seed {[round(d, 3) for d in p['diffs']]} "
                      f"mean {p['mean']:.3f} ± {p['sd']:.3f} exceeds 2 sd: {p['exceeds']}")  # fmt: skip

    print("\ndiagnostics (all seeds): r2 against r1, internalization, SDPO's reprompts:")
    for method, runs in results.items():
        if method.startswith("grpo"):
            continue
        diag = retry_diagnostics(runs)
        print(f"  {method}: " + ", ".join(f"{k} {v:.3f}" for k, v in diag.items() if v == v))
        tails = [run.get("memory_tail") for run in runs if run.get("memory_tail")]
        if tails:
            print(f"    memory tail (seed 0): {tails[0]}")

    plot(results, opts.threshold, every, title, out / "learning_curves.png")
    print(f"\ncurves: {out / 'learning_curves.png'}")

    def ratio(method: str, key: str, base: str = "grpo") -> float:
        """Median arm / median baseline to the threshold; nan unless every seed of the arm
        reached it (a baseline seed that never did counts its total: a bound)."""
        if method not in results or base not in results or not all(cross[method]):
            return math.nan
        return median(reached[method][key]) / max(median(reached[base][key]), 1e-9)

    print()
    for method in results:
        got = sum(c is not None for c in cross[method])
        print(f"steps_to_threshold[{method}]: {median(reached[method]['step']):.0f}")
        print(f"tokens_to_threshold[{method}]: {median(reached[method]['tokens']):.0f}")
        print(f"seconds_to_threshold[{method}]: {median(reached[method]['seconds']):.1f}")
        print(f"seeds_reaching_threshold[{method}]: {got}/{len(cross[method])}")
        print(f"heldout_success_equal_steps[{method}]: {median(equal[method]['success'][0]):.3f}")
        print(f"heldout_success_equal_tokens[{method}]: {median(equal[method]['success'][1]):.3f}")
    print(f"heldout_success_start: {start['success']:.3f}")
    for method in results:
        print(f"heldout_success_equal_steps_min[{method}]: {min(equal[method]['success'][0]):.3f}")
    print(f"grpo_ratio_is_a_bound: {str(not all(cross['grpo'])).lower()}")
    for method in results:
        if method.startswith("grpo") or method in ("erl", "sdpo"):
            continue
        print(f"erl_grpo_steps_ratio[{method}]: {ratio(method, 'step'):.3f}")
        print(f"erl_grpo_tokens_ratio[{method}]: {ratio(method, 'tokens'):.3f}")
    if "grpo_matched" in results and "erl" in results:
        print(f"erl_grpo_matched_steps_ratio: {ratio('erl', 'step', 'grpo_matched'):.3f}")
        print(f"erl_grpo_matched_tokens_ratio: {ratio('erl', 'tokens', 'grpo_matched'):.3f}")
        beats = pairs[("grpo_matched", "erl")]["step"]["exceeds"]
        print(f"erl_grpo_matched_gap_exceeds_seed_spread: {str(beats).lower()}")
    headline = {}
    for method in ("erl", "sdpo"):
        if method not in results:
            continue
        headline[method] = {
            "steps_ratio": ratio(method, "step"),
            "tokens_ratio": ratio(method, "tokens"),
            "gap": bool(pairs[("grpo", method)]["step"]["exceeds"]),
        }
    if "erl" in headline and "sdpo" in headline:
        e = headline["erl"]
        at_least_sdpo = median(reached["erl"]["step"]) <= median(
            reached["sdpo"]["step"]
        ) and median(equal["erl"]["success"][0]) >= median(equal["sdpo"]["success"][0])
        goal = e["steps_ratio"] <= 0.6 and e["tokens_ratio"] <= 1.0 and e["gap"] and at_least_sdpo
        print(f"erl_at_least_as_good_as_sdpo: {str(at_least_sdpo).lower()}")
        print(f"goal_met: {str(bool(goal)).lower()}")
    for method, h in headline.items():  # the last lines: ERL's, then SDPO's
        print(f"{method}_grpo_steps_ratio: {h['steps_ratio']:.3f}")
        print(f"{method}_grpo_tokens_ratio: {h['tokens_ratio']:.3f}")
        print(f"{method}_gap_exceeds_seed_spread: {str(h['gap']).lower()}")
    return headline
