"""The curriculum controller on synthetic first-attempt reward streams (no model)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.controller import (
    CurriculumConfig,
    CurriculumController,
    StageRecord,
    decide,
    replay_levels,
)

NAN = float("nan")


def make(num_levels: int = 3, **overrides) -> CurriculumController:
    """A controller with small windows so that streams stay short."""
    base = dict(promote_window=4, min_stage_steps=0, max_stage_steps=5)
    return CurriculumController(CurriculumConfig(**{**base, **overrides}), num_levels)


def run_stage(controller: CurriculumController, reward: float):
    """Feed one reward per step until the stage wants to stop; return the decision."""
    step = 0
    while not controller.should_stop_stage():
        step += 1
        controller.record_step(step, [reward])
    return controller.end_stage()


# Promotion ---------------------------------------------------------------------------


def test_promotes_exactly_when_full_window_mean_reaches_threshold():
    controller = make(promote_window=5, max_stage_steps=50)
    stops = []
    for step, reward in enumerate([0.0, 0.0, 1.0, 1.0, 1.0], start=1):
        controller.record_step(step, [reward])
        stops.append(controller.should_stop_stage())
    # Steps 1-4: the window is not full. Step 5: 3/5 == 0.6 reaches the threshold (>=).
    assert stops == [False, False, False, False, True]
    assert controller.rolling_mean() == 0.6
    decision = controller.end_stage()
    assert decision.promoted and decision.status == "promoted"
    assert (decision.action, decision.next_level) == ("advance", 2)
    assert controller.level == 2 and controller.stage == 2 and controller.stage_steps == 0


def test_no_promotion_until_the_window_is_full():
    controller = make(promote_window=5, max_stage_steps=50)
    stops = []
    for step in range(1, 6):
        controller.record_step(step, [1.0])
        stops.append(controller.should_stop_stage())
    assert stops == [False, False, False, False, True]


def test_just_below_threshold_does_not_promote():
    controller = make(promote_window=5, max_stage_steps=50, promote_threshold=0.61)
    for step, reward in enumerate([0.0, 0.0, 1.0, 1.0, 1.0], start=1):
        controller.record_step(step, [reward])
    assert not controller.should_stop_stage()


def test_window_rolls_old_rewards_out():
    controller = make(promote_window=3, min_stage_steps=6, max_stage_steps=50)
    stream = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    stops = []
    for step, reward in enumerate(stream, start=1):
        controller.record_step(step, [reward])
        stops.append(controller.should_stop_stage())
    # At step 6 the stage mean is 0.5 but the window [0, 0, 0] is 0; at 8 it is [0, 1, 1].
    assert stops == [False] * 7 + [True]
    assert controller.rolling_mean() == pytest.approx(2 / 3)


def test_no_promotion_before_min_stage_steps():
    controller = make(promote_window=2, min_stage_steps=5, max_stage_steps=50)
    stops = []
    for step in range(1, 7):
        controller.record_step(step, [1.0, 1.0])
        stops.append(controller.should_stop_stage())
    assert stops == [False, False, False, False, True, True]


def test_max_steps_ends_stage_as_plateau():
    controller = make(max_stage_steps=3)
    for step in range(1, 4):
        assert not controller.should_stop_stage()
        controller.record_step(step, [0.2, 0.3])
    assert controller.should_stop_stage()
    decision = controller.end_stage()
    assert not decision.promoted and decision.status == "plateau"
    assert controller.history[0].steps == 3
    assert controller.history[0].r1_stage_mean == pytest.approx(0.25)


def test_promoting_the_last_level_finishes_the_run():
    controller = make(num_levels=2)
    assert run_stage(controller, 1.0).next_level == 2
    last = run_stage(controller, 1.0)
    assert last.promoted and last.action == "stop" and last.next_level is None and last.finished
    assert controller.finished
    with pytest.raises(RuntimeError):
        controller.record_step(99, [1.0])
    with pytest.raises(RuntimeError):
        controller.end_stage()


def test_max_level_caps_the_run_below_the_tasks_last_level():
    controller = make(num_levels=6, start_level=2, max_level=3)
    assert [run_stage(controller, 1.0).level for _ in range(2)] == [2, 3]
    assert controller.finished


def test_num_stages_budget_stops_the_run():
    controller = make(num_levels=6, num_stages=2)
    run_stage(controller, 1.0)
    decision = run_stage(controller, 1.0)
    assert decision.promoted and decision.finished and "num_stages" in decision.reason


# Plateau policies and demotion ---------------------------------------------------------


def test_repeat_policy_retries_k_times_then_stops():
    controller = make(plateau_policy="repeat", max_repeats=2)
    decisions = [run_stage(controller, 0.0) for _ in range(3)]
    assert [d.action for d in decisions] == ["repeat", "repeat", "stop"]
    assert [d.level for d in decisions] == [1, 1, 1]
    assert controller.finished and controller.repeats == 3


def test_repeat_then_promotion_advances_and_counts_failures_per_level():
    controller = make(plateau_policy="repeat", max_repeats=1)
    assert run_stage(controller, 0.0).action == "repeat"
    assert controller.repeats == 1
    assert run_stage(controller, 1.0).next_level == 2
    assert controller.repeats == 0  # level 2 has not failed yet
    assert run_stage(controller, 0.0).action == "repeat"
    assert run_stage(controller, 0.0).action == "stop"


def test_advance_policy_moves_on_and_stops_after_last_level():
    controller = make(plateau_policy="advance")
    decisions = [run_stage(controller, 0.0) for _ in range(3)]
    assert [(d.level, d.action, d.next_level) for d in decisions] == [
        (1, "advance", 2),
        (2, "advance", 3),
        (3, "stop", None),
    ]


def test_stop_policy_ends_the_run_at_the_first_plateau():
    controller = make(plateau_policy="stop")
    decision = run_stage(controller, 0.5)
    assert decision.action == "stop" and controller.finished


def test_demotion_goes_back_one_level_and_is_bounded_by_max_repeats():
    controller = make(demote_threshold=0.2, max_repeats=1, plateau_policy="repeat")
    assert run_stage(controller, 1.0).next_level == 2
    demoted = run_stage(controller, 0.1)
    assert (demoted.action, demoted.next_level, demoted.status) == ("demote", 1, "plateau")
    assert run_stage(controller, 1.0).next_level == 2
    # Level 2 failed a second time: its one retry is spent, so the policy ('repeat'
    # exhausted -> stop) decides instead of another demotion.
    assert run_stage(controller, 0.1).action == "stop"


def test_moderate_plateau_repeats_instead_of_demoting():
    controller = make(demote_threshold=0.2)
    run_stage(controller, 1.0)
    assert run_stage(controller, 0.4).action == "repeat"


def test_no_demotion_below_start_level():
    controller = make(num_levels=4, start_level=2, demote_threshold=0.2, plateau_policy="stop")
    decision = run_stage(controller, 0.0)
    assert decision.action == "stop"


# NaN rewards, replayed steps and replayed levels -------------------------------------


def test_nan_and_none_rewards_are_ignored():
    controller = make(promote_window=2, max_stage_steps=50)
    controller.record_step(1, [NAN, None, NAN])
    assert controller.rolling_mean() is None and controller.stage_steps == 1
    assert not controller.should_stop_stage()
    controller.record_step(2, [1.0, NAN, 0.0, math.inf])
    assert controller.rolling_mean() == 0.5
    assert json.loads(json.dumps(controller.state_dict(), allow_nan=False))


def test_a_step_already_recorded_is_not_counted_twice():
    controller = make(max_stage_steps=50)
    assert controller.record_step(1, [1.0])
    assert controller.record_step(2, [0.0])
    assert not controller.record_step(2, [1.0])
    assert not controller.record_step(1, [1.0])
    assert controller.stage_steps == 2 and controller.rolling_mean() == 0.5


def test_rewards_of_replayed_levels_do_not_count_toward_promotion():
    controller = make(promote_window=2, max_stage_steps=50)
    run_stage(controller, 1.0)
    controller.record_step(1, [1.0, 1.0, 0.0, 0.0], levels=[1, 1, 2, 2])
    assert controller.rolling_mean() == 0.0
    with pytest.raises(ValueError, match="levels"):
        controller.record_step(2, [1.0], levels=[2, 2])


def test_replay_mix_has_the_exact_fraction_and_favours_the_previous_level():
    levels = replay_levels(level=4, n=100, replay_fraction=0.3, seed=7)
    counts = Counter(levels)
    assert len(levels) == 100 and counts[4] == 70
    assert counts[3] > counts[2] > counts[1] > 0
    assert replay_levels(4, 100, 0.3, seed=7) == levels
    assert replay_levels(4, 100, 0.3, seed=8) != levels


def test_no_replay_at_the_start_level_or_with_zero_fraction():
    assert replay_levels(1, 50, 0.3, seed=0) == [1] * 50
    assert replay_levels(3, 50, 0.3, seed=0, start_level=3) == [3] * 50
    assert replay_levels(3, 50, 0.0, seed=0) == [3] * 50
    with pytest.raises(ValueError, match="replay_fraction"):
        replay_levels(3, 10, 1.0)


@given(
    start=st.integers(1, 4),
    above=st.integers(0, 5),
    n=st.integers(0, 300),
    fraction=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**16),
)
def test_replay_levels_properties(start, above, n, fraction, seed):
    level = start + above
    levels = replay_levels(level, n, fraction, seed, start_level=start)
    assert len(levels) == n
    assert all(start <= x <= level for x in levels)
    replayed = sum(1 for x in levels if x != level)
    if above:
        assert abs(replayed - n * fraction) <= 0.5 + 1e-9  # the nearest whole count
    else:
        assert replayed == 0
    assert levels == replay_levels(level, n, fraction, seed, start_level=start)


# Determinism and checkpointing -------------------------------------------------------


def test_decide_is_a_pure_function_of_the_history():
    controller = make(plateau_policy="repeat", max_repeats=1, demote_threshold=0.2)
    for reward in [1.0, 0.1, 1.0, 0.5, 1.0, 1.0]:
        if not controller.finished:
            run_stage(controller, reward)
    history = controller.history
    for i, record in enumerate(history):
        again = decide(history[: i + 1], controller.config, controller.max_level)
        assert (again.action, again.next_level) == (record.action, record.next_level)
    with pytest.raises(ValueError):
        decide([], controller.config, 3)


def test_history_records_are_json_serialisable_stage_records():
    controller = make()
    run_stage(controller, 1.0)
    state = json.loads(json.dumps(controller.state_dict()))
    assert StageRecord(**state["history"][0]) == controller.history[0]


def _drive(controller: CurriculumController, stream: list[list[float]], start: int) -> list:
    """Feed steps `stream[start:]`, ending stages when asked; the trace of what happened."""
    trace = []
    for i in range(start, len(stream)):
        if controller.finished:
            break
        controller.record_step(controller.stage_steps + 1, stream[i])
        trace.append((controller.rolling_mean(), controller.should_stop_stage()))
        if controller.should_stop_stage():
            trace.append(controller.end_stage())
    return trace


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(
        st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, NAN]), min_size=1, max_size=4),
        min_size=1,
        max_size=60,
    ),
    cut=st.integers(0, 60),
    policy=st.sampled_from(["repeat", "advance", "stop"]),
)
def test_state_dict_round_trip_mid_stage_gives_identical_decisions(stream, cut, policy):
    config = dict(promote_window=3, min_stage_steps=1, max_stage_steps=4)
    config.update(plateau_policy=policy, max_repeats=1, demote_threshold=0.2)
    cut = min(cut, len(stream))
    reference = make(num_levels=4, **config)
    expected = _drive(reference, stream, 0)

    first = make(num_levels=4, **config)
    before = _drive(first, stream[:cut], 0)
    saved = json.loads(json.dumps(first.state_dict(), allow_nan=False))
    resumed = CurriculumController.from_state_dict(saved)
    after = _drive(resumed, stream, cut)

    assert before + after == expected
    assert resumed.state_dict() == reference.state_dict()


def test_load_state_dict_rejects_a_level_outside_the_new_config():
    controller = make(num_levels=4)
    run_stage(controller, 1.0)
    run_stage(controller, 1.0)  # now at level 3
    smaller = CurriculumConfig(promote_window=4, min_stage_steps=0, max_stage_steps=5, max_level=2)
    with pytest.raises(ValueError, match="level 3"):
        CurriculumController.from_state_dict(controller.state_dict(), smaller)
    with pytest.raises(ValueError, match="malformed"):
        CurriculumController.from_state_dict({"config": {}, "num_levels": 3})


# Config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("start_level", 0),
        ("max_level", 0),
        ("num_stages", 0),
        ("promote_threshold", NAN),
        ("promote_window", 0),
        ("min_stage_steps", -1),
        ("max_stage_steps", 0),
        ("plateau_policy", "retry"),
        ("max_repeats", -1),
        ("demote_threshold", 0.6),
        ("replay_fraction", 1.0),
        ("promote_window", 2.5),
        ("start_level", True),
    ],
)
def test_config_validation_names_the_bad_field_and_value(name, value):
    with pytest.raises(ValueError) as err:
        CurriculumConfig(**{name: value}).validate()
    assert name in str(err.value) and repr(value) in str(err.value)
    assert "valid" in str(err.value)


def test_defaults_are_valid_and_levels_must_fit_the_task():
    CurriculumConfig().validate()
    with pytest.raises(ValueError, match="start_level=4"):
        CurriculumController(CurriculumConfig(start_level=4), num_levels=3)
    with pytest.raises(ValueError, match="max_level=5"):
        CurriculumController(CurriculumConfig(max_level=5), num_levels=3)


def test_config_parses_from_the_command_line():
    hf_argparser = pytest.importorskip("transformers.hf_argparser")
    parser = hf_argparser.HfArgumentParser(CurriculumConfig)
    (config,) = parser.parse_args_into_dataclasses(
        ["--plateau_policy", "advance", "--max_level", "3", "--demote_threshold", "0.1"]
    )
    assert (config.plateau_policy, config.max_level, config.demote_threshold) == ("advance", 3, 0.1)
    assert config.num_stages is None
    assert all(f.metadata.get("help") for f in fields(CurriculumConfig))


def test_config_fields_do_not_clash_with_grpo_config():
    trl = pytest.importorskip("trl")
    clash = {f.name for f in fields(CurriculumConfig)} & {f.name for f in fields(trl.GRPOConfig)}
    assert not clash
