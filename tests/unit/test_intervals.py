"""Intervals over seeds: a non-negative quantity's never goes below 0 (where the t interval of the
same values does), a signed one's is scipy's t interval, and under three seeds there is none."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from cachepilot_sim.experiment.intervals import (
    MIN_SEEDS,
    nonnegative_interval,
    t_interval,
    too_few,
)


def test_skewed_nonnegative_values_keep_a_physical_interval() -> None:
    values = [0.0, 0.1, 9.0]  # one seed far off: the t interval goes below 0
    t_low, _ = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
    assert t_low < 0
    i = nonnegative_interval(values)
    assert 0.0 <= i.low <= i.mean <= i.high <= 9.0


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=MIN_SEEDS, max_size=12))
def test_nonnegative_interval_lies_within_the_values(values: list[float]) -> None:
    i = nonnegative_interval(values)
    assert min(values) - 1e-9 <= i.low <= i.high <= max(values) + 1e-9


def test_nonnegative_interval_is_reproducible() -> None:
    assert nonnegative_interval([1.0, 2.0, 5.0, 3.0]) == nonnegative_interval([1.0, 2.0, 5.0, 3.0])


def test_signed_interval_is_scipys_t_interval() -> None:
    diffs = [-1.0, 0.5, 2.0, 0.1]
    low, high = stats.t.interval(0.95, 3, loc=np.mean(diffs), scale=stats.sem(diffs))
    i = t_interval(diffs)
    assert (i.low, i.high) == (pytest.approx(low), pytest.approx(high))


@pytest.mark.parametrize("n", [1, 2])
def test_under_three_seeds_the_text_says_so_in_words(n: int) -> None:
    for i in (t_interval([1.0, 2.0][:n]), nonnegative_interval([1.0, 2.0][:n])):
        assert math.isnan(i.low) and not i.known
        assert i.text() == too_few(n) and "too small for an interval" in i.text()


def test_the_sweep_table_gives_a_physical_interval_or_says_n() -> None:
    import polars as pl

    from cachepilot_sim.experiment.runset import CONFIG, group_stats
    from cachepilot_sim.experiment.sweep_report import _fmt

    frame = pl.DataFrame({CONFIG: ["a"] * 3 + ["b"] * 2, "x": [0.0, 0.1, 9.0, 1.0, 2.0]})
    stats = group_stats(frame, [CONFIG], ["x"]).rows_by_key(CONFIG, named=True)
    a, b = stats["a"][0], stats["b"][0]
    assert a["x_mean"] - a["x_ci"] < 0 <= a["x_low"]  # the t half-width would cross 0
    assert _fmt(a["x_mean"], a["x_low"], a["x_high"], 3).startswith("3.033 [")
    assert _fmt(b["x_mean"], b["x_low"], b["x_high"], 2) == "1.5 (n=2)"
