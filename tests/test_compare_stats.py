"""`pipeline.compare.stats`: the t quantiles against published tables, the paired
interval, and a curve's value between its measured points."""

from __future__ import annotations

import pytest

from pipeline.compare import stats


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 9, 2.2622),
     (0.975, 14, 2.1448), (0.975, 29, 2.0452), (0.975, 1000, 1.9623), (0.95, 7, 1.8946),
     (0.995, 3, 5.8409)],
)  # fmt: skip
def test_the_t_quantile_matches_the_published_table(p, df, table):
    assert stats.t_quantile(p, df) == pytest.approx(table, abs=5e-5)


def test_the_paired_interval_and_the_verdict_words():
    diffs, ci = stats.paired([0.5, 0.6, 0.7, 0.6, 0.6], [0.4, 0.4, 0.5, 0.5, 0.3])
    assert diffs == pytest.approx([0.1, 0.2, 0.2, 0.1, 0.3])
    half = 2.7764 * 0.083666 / 5**0.5  # t(0.975, 4) * sd / sqrt(n)
    assert (ci.mean, ci.low, ci.high) == pytest.approx((0.18, 0.18 - half, 0.18 + half), abs=1e-4)
    assert ci.verdict == "above 0"
    assert stats.paired([0.5, 0.3], [0.4, 0.4])[1].verdict == "spans 0"
    below = stats.paired([0.1, 0.2, 0.1, 0.2, 0.1], [0.3, 0.3, 0.4, 0.4, 0.3])
    assert below[1].verdict == "below 0"
    assert stats.interval([0.4]).low != stats.interval([0.4]).low  # nan: no interval from 1


def test_a_curve_is_read_linearly_between_its_points_and_flat_outside():
    points = [(0, 0.2), (100, 0.4), (300, 0.8)]
    assert stats.value_at(points, 50) == pytest.approx(0.3)
    assert stats.value_at(points, 200) == pytest.approx(0.6)
    assert stats.value_at(points, 300) == pytest.approx(0.8)
    assert stats.value_at(points, 1000) == 0.8  # a run that ended earlier keeps its value
    assert stats.value_at(points, -5) == 0.2
    with pytest.raises(ValueError):
        stats.value_at([], 1)
