"""The run's console: the warnings that matter, on synthetic metric streams (no model)."""

from __future__ import annotations

import math
import re

from pipeline.run.config import verbose
from pipeline.run.console import (
    FALLBACK,
    GATED,
    R1,
    R2,
    RewardWatch,
    memory_summary,
    stage_postfix,
)


def feed(watch: RewardWatch, steps: list[dict]) -> list[str]:
    return [message for logs in steps for message in watch.update(logs)]


def test_a_high_fallback_rate_warns_once_and_a_low_one_never():
    high = feed(RewardWatch(2, 0.6), [{FALLBACK: 0.2, R1: 0.1}] * 30)
    assert len(high) == 1
    assert high[0].startswith("[stage 2] warning: 20% of first attempts scored the fallback")
    assert feed(RewardWatch(2, 0.6), [{FALLBACK: 0.02, R1: 0.1}] * 30) == []
    # Two bad steps are not yet a rate worth a warning; the third is.
    watch = RewardWatch(1, 0.6)
    assert feed(watch, [{FALLBACK: 1.0}] * 2) == [] and len(watch.update({FALLBACK: 1.0})) == 1


def test_a_collapsing_r1_warns_but_noise_does_not():
    rising = [{R1: 0.1 + 0.03 * i} for i in range(20)]  # the last 10 average 0.535
    (collapse,) = feed(RewardWatch(3, 0.9), rising + [{R1: 0.2}] * 10)
    assert re.match(r"\[stage 3\] warning: r1 collapsed from 0\.5\d to 0\.2\d ", collapse)
    noisy = [{R1: 0.5 + (0.1 if i % 2 else -0.1)} for i in range(60)]
    assert not any("collapsed" in m for m in feed(RewardWatch(1, 0.9), noisy))


def test_a_plateau_below_promotion_warns_once_but_not_above_it():
    flat = [{R1: 0.3}] * 60
    messages = feed(RewardWatch(1, 0.6, plateau_steps=20), flat)
    assert len(messages) == 1 and "r1 has not improved for 20 steps" in messages[0]
    assert "promotion at 0.60" in messages[0]
    assert feed(RewardWatch(1, 0.2, plateau_steps=20), flat) == []  # above the threshold
    improving = [{R1: i / 100} for i in range(60)]
    assert feed(RewardWatch(1, 0.9, plateau_steps=20), improving) == []


def test_non_finite_values_are_ignored():
    assert feed(RewardWatch(1, 0.6), [{R1: math.nan, FALLBACK: math.inf}] * 40) == []


def test_the_stage_bar_shows_r1_r2_and_the_gated_share():
    assert stage_postfix({R1: 0.25, R2: 0.5, GATED: 0.375}) == {
        "r1": "0.250",
        "r2": "0.500",
        "gated": "38%",
    }
    # No gated row: r2 is not a number worth showing.
    assert stage_postfix({R1: 1.0, R2: math.nan, GATED: 0.0})["r2"] == "-"
    assert stage_postfix({"loss": 0.1}) == {}


def test_info_and_debug_log_levels_bring_the_metric_dictionaries_back():
    assert verbose("info") and verbose("debug")
    assert not any(verbose(level) for level in ("passive", "warning", "error", "critical"))


def test_the_stage_line_says_what_became_of_its_reflections():
    tally = {"reflections": 12, "stored": 2, "confirmed": 3, "empty": 1, "repetitive": 4}
    tally |= {"answer_format": 0}
    assert memory_summary(2, tally) == (
        "[stage 2] reflections: 12 written; memory: 2 stored, 3 confirmed; "
        "refused: 1 empty, 4 repetitive"
    )
    assert memory_summary(1, {"reflections": 3, "stored": 3}).endswith("; none refused")
    assert memory_summary(1, {}) is None  # no reflection: no line
