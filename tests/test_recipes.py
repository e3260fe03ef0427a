"""Every recipe in configs/ parses: each key is a real option with a valid value."""

from __future__ import annotations

from pathlib import Path

import pytest

from curriculum.tasks import get_task
from pipeline.models.backend import activate_backend
from pipeline.run.config import parse_run_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("recipe", CONFIGS, ids=lambda p: p.name)
def test_recipe_parses_and_names_a_real_task(recipe, tmp_path):
    activate_backend()
    # bf16/fp16 need a GPU at GRPOConfig's post-init; the rest parses as written.
    run, model, curriculum, args = parse_run_config(
        [
            "--config",
            str(recipe),
            "--output_dir",
            str(tmp_path),
            "--bf16",
            "false",
            "--fp16",
            "false",
        ]
    )
    task = get_task(run.task, **run.task_config)
    assert curriculum.start_level in task.levels
    assert set(run.reward_signals) <= set(task.signals) | {"length"}


def test_the_recipes_the_docs_promise_exist():
    names = {p.name for p in CONFIGS}
    assert {"tiny.yaml", "qwen2.5-1.5b.yaml", "frozenlake.yaml", "sokoban.yaml"} <= names


@pytest.mark.slow
def test_the_demo_recipe_runs_as_shipped(tmp_path):
    """`make demo`'s command, configs/tiny.yaml unchanged but for the output folder and the
    tiny model's folder (tests/test_run.py runs it shortened): the warm-up and every stage
    finish, each stage folder and final/ hold a model, and a second call resumes it and
    reports it finished."""
    import json
    import os
    import subprocess
    import sys

    root = CONFIGS[0].parents[1]
    out, model = tmp_path / "run", tmp_path / "tiny-model"
    command = [sys.executable, "-m", "pipeline.run", "--config", "configs/tiny.yaml"]
    command += ["--output_dir", str(out), "--model_name_or_path", str(model)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True and state["stages"], state
    for entry in state["stages"]:
        assert entry["status"] in ("promoted", "plateau"), entry
        assert (out / entry["checkpoint"] / "model.safetensors").exists()
    assert (out / "final" / "model.safetensors").exists() and (out / "reward_curve.png").exists()
    stages = {
        p: p.stat().st_mtime_ns for s in state["stages"] for p in (out / s["checkpoint"]).iterdir()
    }
    again = subprocess.run(
        [*command, "--resume", "true"], cwd=root, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0 and "done: " in again.stderr + again.stdout, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in stages} == stages  # nothing retrained
