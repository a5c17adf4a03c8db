"""Latency CDFs that lie on top of each other are drawn as differences to a baseline (issue 33,
item 6): each policy's quantile over LRU's, in per cent, under each CDF row; curves apart keep
the CDFs alone."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from cachepilot_sim.experiment.runset import CONFIG
from cachepilot_sim.plotting import policy_colour
from cachepilot_sim.tools.latency_figures import (
    LEVELS,
    OVERLAP_PCT,
    baseline_policy,
    latency_cdfs,
    quantiles,
)


def _requests(scale: dict[str, float], n: int = 400) -> pl.DataFrame:
    """`n` completed requests per policy, TTFT and TPOT the same draws times the policy's scale."""
    rng = np.random.default_rng(0)
    ttft = rng.lognormal(mean=11.0, sigma=0.8, size=n)  # us
    tpot = rng.lognormal(mean=9.5, sigma=0.3, size=n)
    rows = [
        pl.DataFrame(
            {
                CONFIG: "vram_gb=16",
                "policy": policy,
                "seed": np.arange(n) % 2,
                "outcome": "completed",
                "ttft_us": ttft * s,
                "tpot_us": tpot * s,
                "generated": 8,
            }
        )
        for policy, s in scale.items()
    ]
    return pl.concat(rows)


def test_overlapping_curves_get_a_difference_row_per_metric_in_per_cent_of_lru() -> None:
    fig, data = latency_cdfs(_requests({"perc": 1.02, "lru": 1.0, "sieve": 0.97}))
    assert len(fig.axes) == 4  # TTFT CDF, TTFT vs lru, TPOT CDF, TPOT vs lru
    cdf_ttft, diff_ttft, cdf_tpot, diff_tpot = fig.axes
    assert {cdf_ttft.get_xscale(), cdf_tpot.get_xscale()} == {"log"}
    assert {diff_ttft.get_xscale(), diff_tpot.get_xscale()} == {"logit"}
    assert "vs lru (%)" in diff_ttft.get_ylabel()
    diffs = data.filter(pl.col("difference_pct").is_not_null())
    assert set(diffs["baseline"]) == {"lru"} and set(diffs["policy"]) == {"perc", "sieve"}
    for policy, want in (("perc", 2.0), ("sieve", -3.0)):
        got = diffs.filter((pl.col("policy") == policy) & (pl.col("metric") == "TTFT s"))
        assert got.height == LEVELS.size
        assert got["difference_pct"].to_numpy() == pytest.approx(want, abs=1e-6)
    lines = {ln.get_label(): ln for ln in diff_ttft.get_lines()}
    assert lines["perc"].get_color() == policy_colour("perc")  # one colour per policy everywhere
    assert "lru (baseline)" in lines


def test_curves_apart_keep_the_cdfs_alone() -> None:
    fig, data = latency_cdfs(_requests({"lru": 1.0, "perc": 1.0 + 2 * OVERLAP_PCT / 100}))
    assert len(fig.axes) == 2 and {ax.get_xscale() for ax in fig.axes} == {"log"}
    assert "difference_pct" not in data.columns


def test_the_baseline_is_lru_where_it_ran_and_the_first_policy_otherwise() -> None:
    assert baseline_policy(["perc", "lru"]) == "lru"
    assert baseline_policy(["perc", "sieve"]) == "perc"


def test_a_quantile_is_the_first_value_whose_ecdf_reaches_the_level() -> None:
    values = np.arange(1.0, 101.0)
    points = pl.DataFrame({"value": values, "ecdf": values / 100})
    got = quantiles(points)
    want = values[np.ceil(LEVELS * 100 - 1e-9).astype(int) - 1]
    assert got == pytest.approx(want)
