"""Exact inter-token latency: the engine counts every output token after a request's first by its
gap since that request's previous token (`EngineStats.itl_gaps`), and `serving_stats` takes mean
and percentiles over those gaps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from cachepilot_sim.config import EngineConfig, Preemption
from cachepilot_sim.experiment.serving import gap_stats, serving_stats
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload


@pytest.mark.parametrize("seed", range(6))
def test_gap_stats_equal_numpy_on_the_expanded_gaps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.choice(100_000, size=int(rng.integers(1, 40)), replace=False)
    gaps = {int(v): int(c) for v, c in zip(values, rng.integers(1, 50, values.size), strict=True)}
    expanded = np.repeat(list(gaps), list(gaps.values())).astype(np.float64)
    mean, p50, p99 = gap_stats(gaps)
    assert mean == pytest.approx(expanded.mean())
    assert [p50, p99] == pytest.approx(np.percentile(expanded, [50, 99]).tolist())


def run(vram_gb: float, **overrides: object) -> tuple[object, dict[int, int]]:
    workload = make_workload(num_requests=150)
    sim = build(make_sim_config(vram_gb=vram_gb, workload=workload, **overrides))
    return sim.run(), sim.batcher.stats.itl_gaps


@pytest.mark.parametrize("vram_gb", [9.4, 10.0, 16.0])
def test_every_gap_is_counted_once_and_they_add_up_to_each_decode_span(vram_gb: float) -> None:
    # One gap per output token after a request's first, of every request (a request can be
    # rejected after a preemption, tokens generated); a completed request's gaps sum to its
    # finish - first token (telescoping), across preemptions too (the small pools preempt).
    result, gaps = run(vram_gb)
    requests = result.requests  # type: ignore[attr-defined]
    assert sum(gaps.values()) == int((requests["generated"] - 1).clip(lower_bound=0).sum())
    assert min(gaps) > 0
    done = requests.filter(pl.col("outcome") == "completed")
    span = int((done["finish_us"] - done["first_token_us"]).sum())
    cut_short = requests.filter((pl.col("outcome") == "rejected") & (pl.col("generated") > 1))
    assert (cut_short.height == 0) == (vram_gb == 16.0)  # both branches below are taken
    if cut_short.height == 0:
        assert sum(g * c for g, c in gaps.items()) == span
    else:  # their gaps come on top of the completed requests' spans
        assert sum(g * c for g, c in gaps.items()) > span


def test_preemption_gaps_are_in_the_tail_that_per_request_means_miss() -> None:
    result, gaps = run(9.4)
    m, requests = result.metrics, result.requests  # type: ignore[attr-defined]
    assert m["preemptions"] > 0
    exact = serving_stats(requests, m["duration_s"], gaps)
    approx = serving_stats(requests, m["duration_s"])
    assert max(gaps) > 10 * exact["itl_p50_ms"] * 1e3  # a gap across a preemption
    assert exact["itl_p99_ms"] != pytest.approx(approx["itl_p99_ms"], rel=1e-3)
    same = [k for k in exact if not k.startswith("itl")]
    assert {k: exact[k] for k in same} == {k: approx[k] for k in same}


def test_without_cut_short_requests_the_mean_is_the_per_request_one() -> None:
    result, gaps = run(16.0)
    m, requests = result.metrics, result.requests  # type: ignore[attr-defined]
    exact = serving_stats(requests, m["duration_s"], gaps)
    approx = serving_stats(requests, m["duration_s"])
    assert exact["itl_mean_ms"] == pytest.approx(approx["itl_mean_ms"], rel=1e-12)


def test_gaps_add_up_under_the_starved_back_preemption_rule_too() -> None:
    # transformers CB's rule (engine=hf_cb): starved sequences re-queue at the back.
    engine = EngineConfig(preemption=Preemption.STARVED_BACK, async_scheduling=True)
    result, gaps = run(9.4, engine=engine)
    requests = result.requests  # type: ignore[attr-defined]
    assert requests["preemptions"].sum() > 0
    assert sum(gaps.values()) == int((requests["generated"] - 1).clip(lower_bound=0).sum())
