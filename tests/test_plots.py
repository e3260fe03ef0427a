"""Reward-curve plots: real PNGs, stage lines and eval markers, whole and partial runs."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.layout import PLOT_FILE
from pipeline.run.plots import (
    BOUNDARY_GID,
    EVAL_GID,
    R1_KEY,
    R2_KEY,
    build_figure,
    plot_reward_curves,
    plot_run,
    read_metrics,
    read_run,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _history(first: int, last: int, r2_every: int = 2) -> list[dict]:
    """Logged steps first..last; r2 only on some steps, like a batch with no gated rows."""
    records = []
    for step in range(first, last + 1):
        record = {"step": step, R1_KEY: step / (last + 1), "loss": 0.1}
        if step % r2_every == 0:
            record[R2_KEY] = min(1.0, step / last)
        records.append(record)
    return records


def _line_data(fig, label: str) -> tuple[list[float], list[float]]:
    (line,) = [line for line in fig.axes[0].lines if line.get_label() == label]
    return list(line.get_xdata()), list(line.get_ydata())


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000  # an 800x450 chart with lines and text, not an empty canvas


def test_plot_reward_curves_writes_a_png_and_no_temp_files(tmp_path):
    path = tmp_path / "plots" / "curve.png"
    returned = plot_reward_curves(
        _history(1, 20),
        path,
        stage_boundaries=[(0, "stage 1"), (10, "stage 2")],
        eval_rewards=[(10, 0.5, "eval"), (20, 0.8, "eval")],
        title="demo",
    )
    assert returned == path
    _assert_png(path)
    assert [p.name for p in path.parent.iterdir()] == ["curve.png"]


def test_build_figure_draws_r1_r2_boundaries_and_eval_markers():
    history = _history(1, 10)
    history.append({"step": 11, R1_KEY: float("nan"), R2_KEY: None})  # skipped, not drawn
    history.append({R1_KEY: 0.9})  # no step: skipped
    boundaries = [(0, "stage 1"), (4, "stage 2"), (8, "stage 3")]
    fig = build_figure(history, stage_boundaries=boundaries, eval_rewards=[(4, 0.25, "e1")])
    ax = fig.axes[0]

    stage_lines = [line for line in ax.lines if line.get_gid() == BOUNDARY_GID]
    assert sorted(line.get_xdata()[0] for line in stage_lines) == [0, 4, 8]
    r1_steps, r1_values = _line_data(fig, "r1 (first attempt)")
    assert r1_steps == list(range(1, 11))
    assert r1_values == pytest.approx([s / 11 for s in range(1, 11)])
    r2_steps, _ = _line_data(fig, "r2 (retry)")
    assert r2_steps == [2, 4, 6, 8, 10]
    (marker,) = [line for line in ax.lines if line.get_gid() == EVAL_GID]
    assert list(marker.get_xdata()) == [4] and list(marker.get_ydata()) == [0.25]
    assert ax.get_legend() is not None
    assert ax.get_xlabel() and ax.get_ylabel()


def test_build_figure_without_metrics_says_so():
    fig = build_figure([])
    assert [t.get_text() for t in fig.axes[0].texts] == ["no metrics logged yet"]


def _write_run(root, stages, metrics):
    (root / "curriculum_state.json").write_text(json.dumps({"stages": stages}))
    for k, records in metrics.items():
        folder = root / f"stage_{k}"
        folder.mkdir(parents=True)
        if records is not None:
            text = "".join(json.dumps(r) + "\n" for r in records)
            (folder / "metrics.jsonl").write_text(text)


def _stage(k, level, steps, eval_reward, status="promoted"):
    return {
        "stage": k,
        "level": level,
        "status": status,
        "steps": steps,
        "r1_mean": 0.5,
        "eval_reward": eval_reward,
        "checkpoint": f"stage_{k}",
    }


def test_plot_run_draws_the_run_and_every_stage(tmp_path):
    stages = [_stage(1, 1, 12, 0.75), _stage(2, 2, 8, 0.5)]
    _write_run(tmp_path, stages, {1: _history(1, 12), 2: _history(13, 20)})

    written = plot_run(tmp_path)

    expected = [tmp_path / PLOT_FILE] + [tmp_path / f"stage_{k}" / PLOT_FILE for k in (1, 2)]
    assert written == expected
    for path in expected:
        _assert_png(path)
    curves = read_run(tmp_path)
    # Stage 2 starts where stage 1's logged steps end; evals sit at each stage's last step.
    assert curves.boundaries == [(0, "stage 1 · L1"), (12, "stage 2 · L2")]
    assert curves.evals == {1: (12, 0.75, "eval 0.75"), 2: (20, 0.5, "eval 0.50")}


def test_a_stage_is_drawn_with_its_eval_before_the_state_marks_it_finished(tmp_path):
    stages = [_stage(1, 1, 12, 0.75), _stage(2, 2, 0, None, status="running")]
    _write_run(tmp_path, stages, {1: _history(1, 12), 2: _history(13, 20)})
    stage_one = (tmp_path / "stage_1" / PLOT_FILE).exists()

    written = plot_run(tmp_path, stages=[2], eval_rewards={2: 0.25}, run_curve=False)

    assert written == [tmp_path / "stage_2" / PLOT_FILE]  # nothing else touched
    assert (tmp_path / "stage_1" / PLOT_FILE).exists() == stage_one
    assert not (tmp_path / PLOT_FILE).exists()
    _assert_png(written[0])
    assert read_run(tmp_path, {2: 0.25}).evals[2] == (20, 0.25, "eval 0.25")
    assert 2 not in read_run(tmp_path).evals


def test_plot_run_uses_state_step_counts_when_metrics_are_missing(tmp_path):
    stages = [_stage(1, 1, 30, 0.9), _stage(2, 2, 5, None, status="running")]
    _write_run(tmp_path, stages, {1: None, 2: None})  # stage folders, no metrics files

    written = plot_run(tmp_path)

    assert len(written) == 3 and all(p.exists() for p in written)
    curves = read_run(tmp_path)
    assert curves.boundaries == [(0, "stage 1 · L1"), (30, "stage 2 · L2")]
    assert curves.evals == {1: (30, 0.9, "eval 0.90")}


@pytest.mark.parametrize(
    "state_text",
    [None, "", "{not json", '{"stages": 3}', '{"stages": [{"level": 1}]}', "[]"],
    ids=["no-state", "empty", "broken", "bad-stages", "entry-without-stage", "list"],
)
def test_plot_run_never_raises_on_a_partial_run(tmp_path, state_text):
    if state_text is not None:
        (tmp_path / "curriculum_state.json").write_text(state_text)
    (tmp_path / "stage_1").mkdir()
    # A run killed mid-write: the last line is cut off.
    good = json.dumps({"step": 1, R1_KEY: 0.2, R2_KEY: 0.4})
    (tmp_path / "stage_1" / "metrics.jsonl").write_text(good + "\n" + '{"step": 2, "erl/r1')

    written = plot_run(tmp_path)

    assert [p.name for p in written] == [PLOT_FILE, PLOT_FILE]
    assert read_metrics(tmp_path / "stage_1" / "metrics.jsonl") == [json.loads(good)]


def test_plot_run_on_an_empty_folder_draws_an_empty_run_plot(tmp_path):
    assert plot_run(tmp_path) == [tmp_path / PLOT_FILE]
    _assert_png(tmp_path / PLOT_FILE)


def test_nan_metrics_are_skipped_not_plotted():
    fig = build_figure([{"step": 1, R1_KEY: math.inf}, {"step": 2, R1_KEY: 0.5}])
    assert _line_data(fig, "r1 (first attempt)") == ([2], [0.5])


def test_plot_run_draws_a_baseline_runs_r1_beside_its_own(tmp_path):
    """`baseline_run` (RunConfig): another run's r1, e.g. GRPO's, as a dashed line."""
    from pipeline.run.plots import BASELINE_GID

    run, grpo = tmp_path / "erl", tmp_path / "grpo"
    run.mkdir()
    grpo.mkdir()
    _write_run(run, [_stage(1, 1, 12, 0.75)], {1: _history(1, 12)})
    baseline = [{"step": s, R1_KEY: s / 40} for s in range(1, 21)]
    _write_run(grpo, [_stage(1, 1, 10, 0.2), _stage(2, 1, 10, 0.4)],
               {1: baseline[:10], 2: baseline[10:]})  # fmt: skip

    curves = read_run(grpo).metrics
    fig = build_figure(
        _history(1, 12), baseline=([r for k in sorted(curves) for r in curves[k]], "grpo")
    )
    steps, values = _line_data(fig, "r1 of grpo")
    assert steps == list(range(1, 21)) and values == pytest.approx([s / 40 for s in steps])
    assert [line.get_gid() for line in fig.axes[0].lines].count(BASELINE_GID) == 1
    _assert_png(plot_run(run, stages=[], baseline=grpo)[0])
    # A baseline that has logged nothing yet (or does not exist) draws no line.
    empty = build_figure(_history(1, 12), baseline=([], "none"))
    assert all(line.get_gid() != BASELINE_GID for line in empty.axes[0].lines)
    _assert_png(plot_run(run, stages=[], baseline=tmp_path / "missing")[0])
