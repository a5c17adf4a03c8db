"""95 % intervals over seeds that say what they can: a signed quantity (a difference to the
baseline) gets Student's t interval; a non-negative one (a latency, a ratio of restore times)
gets a percentile bootstrap interval of its mean, which lies inside [min, max] of the seeds and so
never below zero, where a t interval on two or three seeds can (`[-4.713, 7.169]`). Under
MIN_SEEDS seeds neither is an interval worth printing, and the text says so in words.

The bootstrap draws from a Generator seeded here (BOOTSTRAP_SEED), so the same values give the same
interval on every rerun; this is reporting, not the simulated model, whose RNG it never touches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_SEEDS = 3  # fewer seeds: no interval, said in words
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261206


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over `n` seeds with its 95 % interval (NaN bounds: n too small or no values)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def known(self) -> bool:
        return not math.isnan(self.low)

    def text(self, fmt: str = "{:.3f}") -> str:
        """`[low, high]`, or why there is none, in words."""
        if self.n == 0:
            return "no values"
        if not self.known:
            return too_few(self.n)
        return f"[{fmt.format(self.low)}, {fmt.format(self.high)}]"


def too_few(n: int) -> str:
    return f"n={n}: too small for an interval (needs {MIN_SEEDS} seeds)"


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    return arr[np.isfinite(arr)]


def t_interval(values: Sequence[float] | np.ndarray) -> Interval:
    """Mean and Student t interval of a signed quantity (a paired difference)."""
    v = _clean(values)
    if v.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(np.mean(v))
    if v.size < MIN_SEEDS:
        return Interval(mean, math.nan, math.nan, int(v.size))
    sem = float(stats.sem(v))
    if sem == 0.0:
        return Interval(mean, mean, mean, int(v.size))
    low, high = stats.t.interval(CONFIDENCE, v.size - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), int(v.size))


def nonnegative_interval(values: Sequence[float] | np.ndarray) -> Interval:
    """Mean and percentile bootstrap interval of a quantity that cannot be negative: the bounds
    are means of resamples, so min(values) <= low <= high <= max(values)."""
    v = _clean(values)
    if v.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(np.mean(v))
    if v.size < MIN_SEEDS:
        return Interval(mean, math.nan, math.nan, int(v.size))
    if float(np.ptp(v)) == 0.0:
        return Interval(mean, mean, mean, int(v.size))
    res = stats.bootstrap(
        (v,),
        np.mean,
        confidence_level=CONFIDENCE,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    ci = res.confidence_interval
    return Interval(mean, float(ci.low), float(ci.high), int(v.size))
