"""What a comparison reports: every method's held-out figures with 95% intervals, every
paired difference, steps and tokens to promotion; comparison.json and comparison.png.

Held-out success is read at equal steps (the fewest steps any run trained) and at equal
generated tokens (the fewest tokens any run generated), each run's curve read between its
evaluations (`stats.value_at`). Differences are paired by seed: the same rows, in the same
order, from the same starting checkpoint.
"""

from __future__ import annotations

import math
import statistics
from itertools import combinations
from pathlib import Path
from typing import Any

from curriculum.atomic import atomic_write_json
from pipeline.compare.stats import Interval, interval, paired, value_at

MEASURES = {
    "success_equal_steps": "held-out success at equal steps",
    "success_equal_tokens": "held-out success at equal generated tokens",
    "reward_equal_steps": "held-out mean reward at equal steps",
    "reward_equal_tokens": "held-out mean reward at equal generated tokens",
    "r1_final": "first-attempt reward r1, last tenth of the steps",
}


def _curve(run: dict, x: str, y: str) -> list[tuple[float, float]]:
    return [(e[x], e[y]) for e in run["evals"]]


def final_r1(run: dict) -> float:
    """The mean r1 over the last tenth of a run's steps (at least one step)."""
    values = [s["r1"] for s in run["steps"] if s["r1"] is not None]
    tail = values[-max(1, len(values) // 10) :]
    return statistics.fmean(tail) if tail else math.nan


def figures(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Per method and measure the per-seed values, at equal steps and tokens; the paired
    differences; steps and tokens to promotion. `runs`: method -> its finished runs."""
    every = [r for rs in runs.values() for r in rs if r["steps"]]
    if not every:
        raise ValueError("no run of the comparison trained a step")
    steps = min(r["steps"][-1]["step"] for r in every)
    tokens = min(r["steps"][-1]["tokens"] for r in every)
    values = {}
    for method, method_runs in runs.items():
        values[method] = {
            "seeds": [r["seed"] for r in method_runs],
            "success_equal_steps": [value_at(_curve(r, "step", "success"), steps) for r in method_runs],
            "success_equal_tokens": [value_at(_curve(r, "tokens", "success"), tokens) for r in method_runs],
            "reward_equal_steps": [value_at(_curve(r, "step", "mean_reward"), steps) for r in method_runs],
            "reward_equal_tokens": [value_at(_curve(r, "tokens", "mean_reward"), tokens) for r in method_runs],
            "r1_final": [final_r1(r) for r in method_runs],
        }  # fmt: skip
    differences = []
    for first, second in combinations(runs, 2):
        a, b = second, first  # later minus earlier: erl - grpo for --methods grpo,erl
        common = sorted(set(values[a]["seeds"]) & set(values[b]["seeds"]))
        for measure in MEASURES:
            pick = {
                m: [v for s, v in zip(values[m]["seeds"], values[m][measure]) if s in common]
                for m in (a, b)
            }
            diffs, ci = paired(pick[a], pick[b])
            differences.append(
                {"a": a, "b": b, "measure": measure, "seeds": common, "diffs": diffs}
                | _interval(ci)
            )
    promotion = {}
    for method, method_runs in runs.items():
        reached = [r["promotion"] for r in method_runs if r["promotion"]]
        promotion[method] = {
            "reached": len(reached),
            "runs": len(method_runs),
            "steps": _interval(interval([p["step"] for p in reached])),
            "tokens": _interval(interval([p["tokens"] for p in reached])),
        }
    return {
        "equal_steps": steps,
        "equal_tokens": tokens,
        "values": {
            m: {
                k: v if k == "seeds" else {"values": v} | _interval(interval(v))
                for k, v in f.items()
            }
            for m, f in values.items()
        },  # fmt: skip
        "differences": differences,
        "promotion": promotion,
    }


def _interval(ci: Interval) -> dict[str, float | int | None]:
    def number(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {"mean": number(ci.mean), "low": number(ci.low), "high": number(ci.high), "n": ci.n}


def _fmt(entry: dict, digits: int = 3) -> str:
    def one(x):
        return "n/a" if x is None else f"{x:.{digits}f}"

    return f"{one(entry['mean'])} [{one(entry['low'])}, {one(entry['high'])}]"


def _signed(entry: dict) -> str:
    def one(x):
        return "n/a" if x is None else f"{x:+.3f}"

    return f"{one(entry['mean'])} [{one(entry['low'])}, {one(entry['high'])}] (n {entry['n']})"


def print_report(result: dict[str, Any], settings: dict[str, Any], failed: list[dict]) -> None:
    """The figures, as the command prints them."""
    f = result
    held = settings["held_out"]
    print(
        f"\n{', '.join(settings['methods'])} x {settings['seeds']} seeds on {held['task']}; "
        f"budget {settings['budget_text']}; held-out: level {held['level']}, {held['prompts']} "
        f"prompts, greedy first attempts (start: success {settings['start_success']:.3f})"
    )
    width = max(len(m) for m in f["values"])
    where = {
        "success_equal_steps": f"({f['equal_steps']} steps)",
        "success_equal_tokens": f"({f['equal_tokens']} tokens)",
        "reward_equal_steps": f"({f['equal_steps']} steps)",
        "reward_equal_tokens": f"({f['equal_tokens']} tokens)",
        "r1_final": "",
    }
    for measure, words in MEASURES.items():
        print(f"{words} {where[measure]}, mean [95% interval] and per seed:".replace(" ,", ","))
        for method, values in f["values"].items():
            entry = values[measure]
            seeds = ", ".join(f"{v:.3f}" for v in entry["values"])
            print(f"  {method:{width}s}  {_fmt(entry)}  [{seeds}]")
    print("paired differences (same seed, rows and start), mean [95% interval]:")
    for d in f["differences"]:
        print(f"  {d['a']} - {d['b']}, {MEASURES[d['measure']]}: {_signed(d)}")
    print("to promotion (the controller's rule on the first stage), mean [95% interval]:")
    for method, p in f["promotion"].items():
        line = f"  {method:{width}s}  {p['reached']}/{p['runs']} runs promoted"
        if p["reached"]:
            line += f"; steps {_fmt(p['steps'], 1)}; tokens {_fmt(p['tokens'], 0)}"
        print(line)
    for run in failed:
        print(f"failed: {run['method']} seed {run['seed']}: {run['error']}")


def write_json(path: Path, result: dict, settings: dict, runs: list[dict]) -> None:
    """comparison.json: the settings, every figure and every run's record (atomically)."""
    atomic_write_json(path, {"settings": settings, "figures": result, "runs": runs})


def plot(path: Path, runs: dict[str, list[dict]], title: str) -> None:
    """comparison.png: held-out success and first-attempt reward against generated tokens,
    one colour per method, each seed faint and the mean over seeds bold."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pipeline.run.plots import save_figure

    fig = Figure(figsize=(12, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    panels = fig.subplots(1, 2)
    for index, (method, method_runs) in enumerate(runs.items()):
        color = f"C{index}"
        for axis, curves in zip(panels, (_success_curves(method_runs), _r1_curves(method_runs))):
            for xs, ys in curves:
                axis.plot(xs, ys, color=color, alpha=0.25, linewidth=1)
            end = min((xs[-1] for xs, _ in curves if xs), default=0)
            grid = [end * i / 49 for i in range(50)]
            mean = [
                statistics.fmean(value_at(list(zip(xs, ys)), x) for xs, ys in curves if xs)
                for x in grid
            ]
            if end:
                axis.plot(grid, mean, color=color, linewidth=2.5, label=method)
    for axis, label in zip(
        panels, ("held-out success (greedy first attempt)", "first-attempt reward r1")
    ):
        axis.set_xlabel("generated tokens (training)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{title}: each seed faint, the mean over seeds bold")
    fig.tight_layout()
    save_figure(fig, path)


def _success_curves(runs: list[dict]) -> list[tuple[list[float], list[float]]]:
    return [([e["tokens"] for e in r["evals"]], [e["success"] for e in r["evals"]]) for r in runs]


def _r1_curves(runs: list[dict], smooth: int = 5) -> list[tuple[list[float], list[float]]]:
    """Each run's r1 per step against its tokens, a moving mean over `smooth` steps."""
    curves = []
    for run in runs:
        points = [(s["tokens"], s["r1"]) for s in run["steps"] if s["r1"] is not None]
        ys = [
            statistics.fmean(y for _, y in points[max(0, i - smooth + 1) : i + 1])
            for i in range(len(points))
        ]
        curves.append(([x for x, _ in points], ys))
    return curves
