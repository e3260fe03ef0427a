"""The run's curriculum_state.json: atomic writes, the file contract, corruption, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curriculum.controller import CurriculumConfig, CurriculumController
from curriculum.state import CorruptStateError, CurriculumState
from pipeline.layout import STATE_FILE

# The file contract -----------------------------------------------------------------


def test_missing_file_gives_a_fresh_state_without_creating_it(tmp_path):
    state = CurriculumState.load(tmp_path / STATE_FILE)
    assert (state.stages, state.current_stage, state.finished, state.controller) == (
        [],
        0,
        False,
        {},
    )
    assert not (tmp_path / STATE_FILE).exists()


def test_round_trip_and_required_keys(tmp_path):
    path = tmp_path / STATE_FILE
    state = CurriculumState.load(path)
    state.start_stage(1, controller={"stage": 1})
    state.finish_stage(
        1,
        "promoted",
        steps=12,
        r1_mean=0.75,
        controller={"stage": 2},
        eval_reward=0.7,
        checkpoint="stage_1",
        action="advance",
        next_level=2,
    )
    state.start_stage(2)
    raw = json.loads(path.read_text())
    assert set(raw) >= {"stages", "current_stage", "finished", "controller"}
    assert raw["current_stage"] == 2 and raw["finished"] is False
    assert raw["controller"] == {"stage": 2}
    required = {"stage", "level", "status", "steps", "r1_mean", "eval_reward", "checkpoint"}
    assert all(set(entry) >= required for entry in raw["stages"])
    assert raw["stages"][0] | {"r2_mean": None} == {
        "stage": 1, "level": 1, "status": "promoted", "steps": 12, "r1_mean": 0.75,
        "eval_reward": 0.7, "checkpoint": "stage_1", "r2_mean": None, "action": "advance",
        "next_level": 2, "demoted": False,
    }  # fmt: skip
    assert raw["stages"][1]["status"] == "running"
    assert [state.is_stage_finished(k) for k in (1, 2, 3)] == [True, False, False]
    assert state.running_stage() is state.stage_entry(2)
    assert CurriculumState.load(path).to_dict() == state.to_dict()


def test_demotion_is_recorded(tmp_path):
    state = CurriculumState.load(tmp_path / STATE_FILE)
    state.start_stage(2)
    entry = state.finish_stage(1, "plateau", steps=5, r1_mean=0.1, controller={}, action="demote")
    assert entry.demoted


@pytest.mark.parametrize(
    "text",
    [
        '{"stages": [{"stage": 1, "lev',  # truncated mid-write by something else
        "[]",
        '{"stages": [], "finished": false}',
        '{"stages": [{"stage": 1}], "current_stage": 1, "finished": false}',
        '{"stages": [{"stage": 1, "level": 1, "status": "done", "steps": 0, "r1_mean": null,'
        ' "eval_reward": null, "checkpoint": null}], "current_stage": 1, "finished": false}',
    ],
)
def test_corrupt_file_error_names_the_file(tmp_path, text):
    path = tmp_path / STATE_FILE
    path.write_text(text)
    with pytest.raises(CorruptStateError, match=str(path)) as err:
        CurriculumState.load(path)
    assert isinstance(err.value, ValueError)


def test_misuse_is_reported(tmp_path):
    state = CurriculumState.load(tmp_path / STATE_FILE)
    with pytest.raises(ValueError, match="never started"):
        state.finish_stage(1, "promoted", steps=1, r1_mean=1.0, controller={})
    state.start_stage(1)
    with pytest.raises(RuntimeError, match="still running"):
        state.start_stage(2)
    with pytest.raises(ValueError, match="'running'"):
        state.finish_stage(1, "running", steps=1, r1_mean=1.0, controller={})
    with pytest.raises(ValueError, match="colour"):
        state.finish_stage(1, "promoted", steps=1, r1_mean=1.0, controller={}, colour="red")
    state.finish_stage(1, "promoted", steps=1, r1_mean=1.0, controller={}, run_finished=True)
    with pytest.raises(RuntimeError, match="already ended"):
        state.finish_stage(1, "plateau", steps=1, r1_mean=1.0, controller={})
    with pytest.raises(RuntimeError, match="finished"):
        state.start_stage(2)


# Resume semantics ------------------------------------------------------------------


class Crash(Exception):
    """Stands in for a kill: the run loop stops wherever it is."""


def rewards(level: int, step: int) -> list[float]:
    """A deterministic reward stream: higher levels take longer to learn."""
    return [min(1.0, step / (2.0 * level)), float("nan"), 0.5]


def run_curriculum(path: Path, trained: list[tuple[int, int]], crash_at: int | None = None):
    """The stage loop as the pipeline runs it, checkpointing the controller every step."""
    state = CurriculumState.load(path)
    config = CurriculumConfig(promote_window=6, min_stage_steps=2, max_stage_steps=6)
    if state.controller:
        controller = CurriculumController.from_state_dict(state.controller)
    else:
        controller = CurriculumController(config, num_levels=3)
    while not controller.finished:
        entry = state.start_stage(controller.level, controller.state_dict())
        assert not state.is_stage_finished(entry.stage) and entry.stage == controller.stage
        while not controller.should_stop_stage():
            step = controller.stage_steps + 1
            controller.record_step(step, rewards(controller.level, step))
            trained.append((controller.stage, step))
            state.controller = controller.state_dict()
            state.save()
            if len(trained) == crash_at:
                raise Crash
        decision = controller.end_stage()
        state.finish_stage(
            decision.stage, decision.status, steps=controller.history[-1].steps,
            r1_mean=decision.r1_mean, controller=controller.state_dict(),
            run_finished=decision.finished, checkpoint=f"stage_{decision.stage}",
            action=decision.action, next_level=decision.next_level,
        )  # fmt: skip
    return CurriculumState.load(path)


def test_resume_continues_the_running_stage_and_never_retrains_a_finished_one(tmp_path):
    uninterrupted: list[tuple[int, int]] = []
    expected = run_curriculum(tmp_path / "a" / STATE_FILE, uninterrupted)
    assert expected.finished and len(expected.stages) >= 3
    for crash_at in range(1, len(uninterrupted) + 1):
        path = tmp_path / f"crash{crash_at}" / STATE_FILE
        trained: list[tuple[int, int]] = []
        with pytest.raises(Crash):
            run_curriculum(path, trained, crash_at)
        crashed = CurriculumState.load(path)
        finished_before = {k for k in range(1, 10) if crashed.is_stage_finished(k)}
        assert len(finished_before) == len(crashed.stages) - 1  # all but the running one
        resumed = run_curriculum(path, trained)
        assert trained == uninterrupted  # every step exactly once, in order
        assert not finished_before & {stage for stage, _ in trained[crash_at:]}
        assert resumed.to_dict()["stages"] == expected.to_dict()["stages"]
