"""Held out means held out (issue 34): for every built-in family and level, a stage's
evaluation prompts are disjoint from the prompts the same run trained on; where a level has
too few distinct problems for that, the stage line says how many were trained on."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import family_config

from curriculum.controller import CurriculumConfig, CurriculumController
from curriculum.tasks import get_task, list_tasks
from curriculum.tasks.base import prompt_key
from pipeline.evaluate.first_attempts import EvalResult, held_out_seed
from pipeline.evaluate.held_out import (
    held_out_rows,
    stage_seed,
    trained_prompts,
)
from pipeline.run.stages import _summary, stage_dataset

# A run as configs/tiny.yaml sets it (prompts per stage lowered to keep the test quick;
# more training prompts only cover a small level sooner), one promoted stage per level.
RUN = {"prompts_per_stage": 1024, "seed": 0, "replay_fraction": 0.3, "start_level": 1}
EVAL_PROMPTS = 64
# The levels whose distinct problems the training prompts above exhaust, or nearly: their
# stage line counts the evaluation prompts that were trained on.
TOO_SMALL = {
    ("arithmetic", 1),
    ("frozenlake", 1),
    ("reasoning_gym", 1),
    ("sokoban", 1),
    # The agent versions draw the same maps.
    ("frozenlake_agent", 1),
    ("sokoban_agent", 1),
}


def family(name: str, data_dir: Path):
    return get_task(name, **family_config(name, data_dir))


@pytest.mark.parametrize("name", list_tasks())
def test_evaluation_prompts_are_disjoint_from_the_runs_training_prompts(name, data_dir):
    task = family(name, data_dir)
    stages = [(level, level) for level in task.levels]  # stage k trains level k
    for level in task.levels:
        trained = trained_prompts(task, level, stages, **RUN)
        rows, overlap = held_out_rows(task, level, EVAL_PROMPTS, held_out_seed(level), trained)
        shared = sum(prompt_key(row["prompt"]) in trained for row in rows)
        assert len(rows) == EVAL_PROMPTS and all(row["level"] == level for row in rows)
        if (name, level) in TOO_SMALL:
            assert overlap == shared > 0, (level, overlap)
        else:
            assert overlap == 0 and not shared, (level, overlap, len(shared))


def test_the_trained_prompts_are_the_stages_own(data_dir):
    """`trained_prompts` draws again exactly what the stages trained on: a stage at level 3
    replays levels 1 and 2, and its level-2 rows are in level 2's set."""
    task = family("countdown", data_dir)
    config = CurriculumConfig(start_level=1, replay_fraction=RUN["replay_fraction"])
    controller = CurriculumController(config, task.num_levels)
    controller.level = 3
    seed = stage_seed(RUN["seed"], 3)
    dataset = stage_dataset(task, controller, RUN["prompts_per_stage"], seed)
    for level in (1, 2, 3):
        drawn = {prompt_key(row["prompt"]) for row in dataset if row["level"] == level}
        assert drawn and drawn == trained_prompts(task, level, [(3, 3)], **RUN)


def test_the_stage_line_says_when_evaluation_prompts_were_trained_on():
    class Decision:
        promoted, r1_mean, action = True, 0.5, "advance"

    def line(trained: int) -> str:
        evaluation = EvalResult("arithmetic", 1, 64, 0.8, 0.7, 0.0, trained=trained)
        return _summary(1, 1, "erl", 10, Decision(), 0.4, evaluation)

    assert (
        line(0)
        == "[stage 1] level 1 | erl | 10 steps | r1 0.500 | r2 0.400 | eval 0.800 | promoted"
    )
    assert line(64).endswith("| eval 0.800 (64 of 64 prompts trained on) | promoted")
