"""The statistics of a comparison: Student's t quantiles, 95% intervals, paired differences
and a curve's value between its measured points. `python -m pipeline.compare` and the
learning bench (bench/learning.py) both use these, and nothing else computes them.

No scipy here (the project does not depend on it), so the t distribution is computed from
its closed form for integer degrees of freedom (Abramowitz & Stegun 26.7.3 and 26.7.4):
with theta = atan(t / sqrt(df)), the probability P(|T| <= t) is a finite sum of powers of
cos(theta). The quantile inverts it by bisection. `tests/test_compare_stats.py` checks
the quantiles against published table values.

    >>> round(t_quantile(0.975, 4), 4)
    2.7764
    >>> print(interval([0.1, 0.2, 0.3]))
    +0.200 [-0.048, +0.448] (n 3)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def t_central_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` (a positive integer) degrees of freedom."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a positive integer, got {df!r}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2))
        term = total = 1.0
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        return sin * total
    # Odd: 2/pi * (theta + sin * (cos + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... up to cos^(df-2)))
    total = 0.0
    if df > 1:
        term = total = math.cos(theta)
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
    return 2 / math.pi * (theta + sin * total)


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must be in (0.5, 1), got {p!r}")
    mass = 2 * p - 1  # P(|T| <= q) for the p quantile q
    low, high = 0.0, 1.0
    while t_central_mass(high, df) < mass:
        high *= 2
    for _ in range(200):  # far below float resolution long before the end
        middle = (low + high) / 2
        if t_central_mass(middle, df) < mass:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """A sample's mean and its two-sided t interval (nan bounds for fewer than 2 values)."""

    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n {self.n})"

    @property
    def verdict(self) -> str:
        """'above 0', 'below 0' or 'spans 0' (also for an undefined interval)."""
        if self.low > 0:
            return "above 0"
        if self.high < 0:
            return "below 0"
        return "spans 0"


def interval(values: list[float], level: float = 0.95) -> Interval:
    """The mean of `values` and its `level` t interval: mean ± t * sd / sqrt(n)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = t_quantile((1 + level) / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired(arm: list[float], baseline: list[float]) -> tuple[list[float], Interval]:
    """Per-seed differences arm - baseline (same seed, same rows) and their 95% interval."""
    if len(arm) != len(baseline):
        raise ValueError(f"paired samples differ in size: {len(arm)} and {len(baseline)}")
    diffs = [a - b for a, b in zip(arm, baseline)]
    return diffs, interval(diffs)


def value_at(points: list[tuple[float, float]], x: float) -> float:
    """The curve through `points` ((x, y) pairs, x ascending) at `x`, linear between two
    measured points: held-out success at a number of steps or generated tokens that falls
    between two evaluations. Before the first point, its value; past the last, the last's
    (a run that ended earlier stays at its final value).

    >>> value_at([(0, 0.0), (10, 0.5), (20, 1.0)], 15)
    0.75
    """
    if not points:
        raise ValueError("no points to read a value from")
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)
    return points[-1][1]
