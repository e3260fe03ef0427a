"""Reward-curve plots of a run: r1 and r2 over the run's steps, stages and eval rewards.

    plot_run("runs/demo")   # -> runs/demo/reward_curve.png, runs/demo/stage_<k>/reward_curve.png

`plot_run` reads the run's output folder:

    <output_dir>/curriculum_state.json      {"stages": [{"stage", "level", "steps",
                                             "eval_reward", ...}, ...]}
    <output_dir>/stage_<k>/metrics.jsonl    one JSON object per logged step:
                                            {"step": global_step, "erl/r1_mean": x,
                                             "erl/r2_mean": y, ...}

It draws whatever exists and never raises on a partial or crashed run. Figures are built
on matplotlib's Agg canvas (no display, no pyplot global state) and written atomically.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curriculum.atomic import atomic_write_bytes
from pipeline.layout import METRICS_FILE, RunLayout, read_run_config

logger = logging.getLogger(__name__)

R1_KEY, R2_KEY = "erl/r1_mean", "erl/r2_mean"
R1_KEYS = (R1_KEY, "reward", "self_distillation/reward_mean")
"""Where each method's trainer logs its first attempts' mean reward: ERLTrainer's own key
(its `reward` is r1 too), GRPOTrainer's `reward`, SDPOTrainer's diagnostics."""
BOUNDARY_GID, EVAL_GID, BASELINE_GID = "stage_boundary", "eval_reward", "baseline_r1"
"""Artist ids of the stage lines, eval markers and baseline line, so tests and tools can
find them."""

Boundary = tuple[float, str]
EvalPoint = tuple[float, float, str]


def _number(value: Any) -> float | None:
    """`value` as a finite float, or None (missing, NaN, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def first_attempt_reward(record: dict[str, Any]) -> float | None:
    """The first attempts' mean reward (r1) of a logged step, whichever method trained it."""
    return next((_number(record[k]) for k in R1_KEYS if k in record), None)


def _series(history: Iterable[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records that carry both a step and a finite `key` (R1_KEY:
    r1 under whichever key the method logs it)."""
    points = []
    for record in history:
        found = first_attempt_reward(record) if key == R1_KEY else record.get(key)
        step, value = _number(record.get("step")), _number(found)
        if step is not None and value is not None:
            points.append((step, value))
    points.sort()
    return [s for s, _ in points], [v for _, v in points]


def build_figure(
    history: Sequence[dict[str, Any]],
    *,
    stage_boundaries: Sequence[Boundary] | None = None,
    eval_rewards: Sequence[EvalPoint] | None = None,
    title: str | None = None,
    baseline: tuple[Sequence[dict[str, Any]], str] | None = None,
):
    """The reward-curve Figure: r1/r2 lines, a dashed line per stage boundary, eval markers,
    and, given `baseline` = (another run's history, its label), that run's r1 as a line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, label, color in (
        (R1_KEY, "r1 (first attempt)", "tab:blue"),
        (R2_KEY, "r2 (retry)", "tab:orange"),
    ):
        steps, values = _series(history, key)
        if steps:
            # Markers too, so that a stage with a single logged step still shows.
            ax.plot(
                steps, values, label=label, color=color, marker=".", markersize=3, linewidth=1.2
            )
    if baseline is not None:
        steps, values = _series(baseline[0], R1_KEY)
        if steps:
            ax.plot(
                steps, values, label=f"r1 of {baseline[1]}", color="dimgrey", linestyle="--",
                linewidth=1.2, gid=BASELINE_GID,
            )  # fmt: skip
    _draw_boundaries(ax, stage_boundaries or [])
    _draw_evals(ax, eval_rewards or [])
    if not ax.lines:
        ax.text(
            0.5,
            0.5,
            "no metrics logged yet",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="grey",
        )
    ax.set_xlabel("training step (run-global)")
    ax.set_ylabel("mean reward")
    ax.set_title(title or "reward curves")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _draw_boundaries(ax, boundaries: Sequence[Boundary]) -> None:
    """A dashed line and its label at each stage boundary."""
    for step, label in boundaries:
        ax.axvline(step, color="grey", linestyle="--", linewidth=0.8, gid=BOUNDARY_GID)
        ax.annotate(
            label,
            xy=(step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=8,
            color="dimgrey",
        )


def _draw_evals(ax, eval_rewards: Sequence[EvalPoint]) -> None:
    """A labelled marker at each evaluation with a number (others are skipped)."""
    points = [
        (s, v, lab)
        for s, v, lab in eval_rewards
        if _number(s) is not None and _number(v) is not None
    ]
    if not points:
        return
    ax.plot(
        [p[0] for p in points],
        [p[1] for p in points],
        linestyle="none",
        marker="D",
        color="tab:green",
        markersize=7,
        label="eval reward (first attempt)",
        gid=EVAL_GID,
    )
    for step, value, label in points:
        ax.annotate(
            label,
            xy=(step, value),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=8,
            color="tab:green",
        )


def save_figure(fig, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as PNG to `path` atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return atomic_write_bytes(path, buffer.getvalue())


def plot_reward_curves(
    history: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    stage_boundaries: Sequence[Boundary] | None = None,
    eval_rewards: Sequence[EvalPoint] | None = None,
    title: str | None = None,
    baseline: tuple[Sequence[dict[str, Any]], str] | None = None,
) -> Path:
    """Draw r1/r2 over steps with stage boundaries and eval markers to a PNG; returns its path.

    `history`: one dict per logged step with `step` and `erl/r1_mean` / `erl/r2_mean`
    (missing or NaN values are skipped). `stage_boundaries`: (step, label) pairs.
    `eval_rewards`: (step, value, label) triples. `baseline`: (history, label) of another
    run, whose r1 is drawn as a dashed line.
    """
    fig = build_figure(
        history,
        stage_boundaries=stage_boundaries,
        eval_rewards=eval_rewards,
        title=title,
        baseline=baseline,
    )
    return save_figure(fig, path)


# The run folder ---------------------------------------------------------------------


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a missing file is empty, a broken line is skipped
    (a run killed mid-write leaves a partial last line)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _read_stages(layout: RunLayout) -> dict[int, dict[str, Any]]:
    """Stage number -> its entry in curriculum_state.json ({} when missing or unreadable)."""
    path = layout.state
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return {int(entry["stage"]): entry for entry in raw["stages"] if isinstance(entry, dict)}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as err:
        logger.warning("cannot read %s (%s); plotting the metrics alone", path, err)
        return {}


def run_method(layout: RunLayout) -> str:
    """The method the run in `layout` trains (its run_config.json; erl before it had one)."""
    try:
        return str(read_run_config(layout.run_config).get("method", "erl"))
    except (OSError, ValueError, AttributeError):
        return "erl"


@dataclass
class RunCurves:
    """What `plot_run` draws: each stage's metrics, where stages start, eval rewards."""

    folders: dict[int, Path] = field(default_factory=dict)
    """Stage number -> its stage_<k> folder (those that exist)."""
    metrics: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Stage number -> its metrics.jsonl records (empty when the file is missing)."""
    levels: dict[int, Any] = field(default_factory=dict)
    boundaries: list[Boundary] = field(default_factory=list)
    """(first step, label) of every stage, in run-global steps."""
    evals: dict[int, EvalPoint] = field(default_factory=dict)
    """Stage number -> (last step, eval reward, label) for stages with an eval reward."""


def read_run(
    output_dir: str | os.PathLike[str], eval_rewards: dict[int, float] | None = None
) -> RunCurves:
    """Read the state file and the stages' metrics; whatever is missing is left out.
    `eval_rewards` (stage -> value) adds eval rewards the state file does not hold yet."""
    layout = RunLayout(output_dir)
    entries, folders = _read_stages(layout), layout.stages()
    for k, value in (eval_rewards or {}).items():
        entries[k] = {**entries.get(k, {}), "eval_reward": value}
    metrics = {k: read_metrics(folder / METRICS_FILE) for k, folder in folders.items()}
    curves = RunCurves(folders, metrics)
    # Stage k starts where stage k-1 ended (run-global steps) and ends at its last logged
    # step, or, without metrics, after the steps the state file counts for it.
    end = 0.0
    for k in sorted(set(entries) | set(folders)):
        entry = entries.get(k, {})
        records = curves.metrics.get(k, [])
        steps = [s for s in (_number(r.get("step")) for r in records) if s is not None]
        start, counted = end, _number(entry.get("steps"))
        if steps:
            end = max(steps)
        elif counted is not None:
            end = start + counted
        level = curves.levels[k] = entry.get("level")
        curves.boundaries.append(
            (start, f"stage {k}" + (f" · L{level}" if level is not None else ""))
        )
        value = _number(entry.get("eval_reward"))
        if value is not None:
            curves.evals[k] = (end, value, f"eval {value:.2f}")
    return curves


def plot_run(
    output_dir: str | os.PathLike[str],
    stages: Iterable[int] | None = None,
    *,
    eval_rewards: dict[int, float] | None = None,
    run_curve: bool = True,
    baseline: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """(Re)draw the run's reward_curve.png (unless `run_curve` is False) and one per
    existing stage folder (only those in `stages` when given, so that finished stages'
    files stay untouched); returns the paths written. `eval_rewards`: stage -> eval reward
    not yet in the state file (a stage is drawn before the state marks it finished).
    `baseline`: another run's output folder (a GRPO run of the same recipe, say), whose r1
    over its run-global steps is drawn on the run's curve; a folder without metrics yet
    draws nothing. Never raises on a partial run (missing state or metrics)."""
    layout = RunLayout(output_dir)
    curves = read_run(layout.root, eval_rewards)
    method = run_method(layout).upper()
    history = [record for k in sorted(curves.metrics) for record in curves.metrics[k]]
    other = None
    if baseline:
        others = read_run(baseline).metrics
        other = ([r for k in sorted(others) for r in others[k]], Path(baseline).resolve().name)
    written = []
    if run_curve:
        written.append(
            plot_reward_curves(
                history,
                layout.plot,
                stage_boundaries=curves.boundaries,
                eval_rewards=[curves.evals[k] for k in sorted(curves.evals)],
                title=f"{method} reward curves: {layout.root.resolve().name}",
                baseline=other,
            )
        )
    for k, records in sorted(curves.metrics.items()):
        if stages is not None and k not in stages:
            continue
        level = curves.levels.get(k)
        written.append(
            plot_reward_curves(
                records,
                layout.stage_plot(k),
                eval_rewards=[curves.evals[k]] if k in curves.evals else [],
                title=f"stage {k}"
                + (f" (level {level})" if level is not None else "")
                + f" · {method}",
            )
        )
    return written
