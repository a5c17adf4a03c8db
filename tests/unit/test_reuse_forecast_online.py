"""reuse_forecast with policy.forecast_online: the refit curve converges to the empirical curve of
the observed gaps, censoring cannot drive P(reuse) to 0, the switch off ranks as the offline table,
and a decision reads nothing after its time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from cachepilot_sim.config import ConfigError, policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.forecast_model import OnlineCurves, SurvivalTable

GRID = (0.1, 100_000.0, 41)


def exp_table(mean_s: float, never: float = 0.0) -> SurvivalTable:
    """A population row and one class row: S(t) = never + (1 - never) exp(-t / mean)."""
    t = np.geomspace(*GRID[:2], GRID[2])
    curve = never + (1 - never) * np.exp(-t / mean_s)
    return SurvivalTable(("class",), GRID, [(), (0,)], np.array([curve, curve]))


def feed_gaps(online: OnlineCurves, gaps_us: np.ndarray, row: int = 1) -> int:
    """Release entry i at i seconds, access it after gaps_us[i]; returns the time of the end."""
    events = []
    for i, g in enumerate(gaps_us):
        events += [(i * 1_000_000, 0, i), (i * 1_000_000 + int(g), 1, i)]
    for t, kind, i in sorted(events):
        if kind == 0:
            online.release(i, row, t)
        else:
            online.access(i, t)
    return max(t for t, _, _ in events)


def test_the_online_curve_converges_to_the_empirical_curve_of_the_gaps() -> None:
    """A prior of mean 100 s, gaps drawn with mean 10 s: at the grid points the refit curve is the
    sample's Kaplan-Meier curve up to the prior's weight n0 / (n + n0), and the true curve up to
    the sampling error (4 standard deviations) plus that."""
    n, n0 = 4000, 20.0
    gaps = np.random.default_rng(7).exponential(10e6, n).astype(np.int64) + 1
    table = exp_table(100.0)
    online = OnlineCurves(table, prior_weight=n0, window=n, every=10**9)
    end = feed_gaps(online, gaps)
    online.refit(1, end)
    grid = table.grid_us()
    pts = [i for i, g in enumerate(grid) if 1e6 <= g <= 40e6]
    assert len(pts) >= 4
    empirical = stats.ecdf(gaps.astype(float)).sf.evaluate(grid[pts])
    ours = table.curves[1, pts]
    np.testing.assert_allclose(ours, empirical, atol=n0 / (n + n0) + 1e-9)
    truth = np.exp(-grid[pts] / 10e6)
    tol = 4 * np.sqrt(truth * (1 - truth) / n) + n0 / (n + n0)
    assert np.all(np.abs(ours - truth) <= tol), (ours, truth, tol)
    prior = np.exp(-grid[pts] / 100e6)
    assert np.all(np.abs(prior - truth) > 3 * tol)  # the prior alone would fail: it moved
    np.testing.assert_array_equal(table.curves[0], exp_table(100.0).curves[0])  # row 1 only
    # The decision path (plain floats) reads the refit curve.
    assert table.survival_at(1, grid[pts[0]]) == pytest.approx(ours[0], abs=1e-9)


def test_censored_observations_enter_the_risk_set_only() -> None:
    """Half the entries came back at 10 s, half are still idle at 1 s (censored): every one at
    risk at 10 s came back, so the curve drops to about 0 there, not to the naive 0.5."""
    table = exp_table(100.0)
    online = OnlineCurves(table, prior_weight=1.0, window=10_000, every=10**9)
    for i in range(500):
        online.release(i, 1, 0)
    for i in range(500):
        online.access(i, 10_000_000)
    for i in range(500, 1000):
        online.release(i, 1, 9_000_000)
    online.refit(1, 10_000_000)
    at_20s = table.survival_at(1, 20e6)
    assert at_20s < 0.01
    assert table.survival_at(1, 0.5e6) == pytest.approx(1.0, abs=0.01)


def test_an_all_censored_stream_never_drives_the_reuse_probability_to_zero() -> None:
    """Nobody ever comes back: P falls, but every hazard keeps at least n0 S / (n0 S + window)
    of the prior's, so P(next use within delta) >= that share of the prior's P (at grid points)."""
    n0, window = 50.0, 400
    table = exp_table(30.0, never=0.3)
    prior = SurvivalTable(table.features, GRID, table.keys, table.curves.copy())
    online = OnlineCurves(table, prior_weight=n0, window=window, every=1)
    for i in range(5 * window):  # many more releases than the window, ages up to ~3 days
        online.release(i, 1, i * 500_000_000)
    end = 5 * window * 500_000_000
    online.refit(1, end)
    s_min = float(prior.curves[1].min())
    share = n0 * s_min / (n0 * s_min + window)
    grid = table.grid_us()
    for i, k in [(0, 5), (5, 10), (10, 15), (15, 20), (20, 22)]:
        p_online = table.resume_within_at(1, grid[i], grid[k] - grid[i])
        p_prior = prior.resume_within_at(1, grid[i], grid[k] - grid[i])
        assert p_online > 0 and p_online >= 0.999 * share * p_prior, (i, p_online, p_prior)
    assert table.resume_within_at(1, 10e6, 30e6) < prior.resume_within_at(1, 10e6, 30e6)
    assert np.count_nonzero(online.windows[1].gap_us == -1) == window  # the last releases


def test_bad_online_knobs_are_named() -> None:
    with pytest.raises(ConfigError, match="forecast_online_window"):
        policy_config("reuse_forecast", forecast_online=True, forecast_online_window=0)
    with pytest.raises(ConfigError, match="forecast_online_prior"):
        policy_config("reuse_forecast", forecast_online_prior=-1.0)


# -- the policy on random hook streams -------------------------------------------------------


def make(**knobs: object) -> Any:
    pc = policy_config("reuse_forecast", **knobs)
    return make_policy(pc, GapEstimator(pc.ema_weight, pc.prior_gap_s * 1e6, pc.delta_s * 1e6))


def entries_for(seed: int, n: int) -> list[CacheEntry]:
    rng = np.random.default_rng(seed)
    return [
        CacheEntry(i, i, 0, int(rng.integers(4)), 0, int(rng.integers(100, 30_000)),
                   int(rng.integers(1, 64)) << 20, 0, 0,
                   restore_us=float(rng.uniform(1e3, 1e5)))
        for i in range(n)
    ]  # fmt: skip


def stream(seed: int, n: int, steps: int) -> list[tuple[int, str, int]]:
    """(time µs, 'release' | 'access' | 'decide', entry) in time order: each entry alternates
    release and access; a decision every few events."""
    rng = np.random.default_rng(seed)
    idle = [False] * n
    out, t = [], 0
    for _ in range(steps):
        t += int(rng.exponential(2e6)) + 1
        i = int(rng.integers(n))
        out.append((t, "access" if idle[i] else "release", i))
        idle[i] = not idle[i]
        if rng.random() < 0.3:
            t += 1
            out.append((t, "decide", -1))
    return out


def play(policy: Any, entries: list[CacheEntry], events: list[tuple[int, str, int]]) -> list:
    """Runs the hooks as a KV manager would; returns each decision's victims (entry ids)."""
    idle: set[int] = set()
    decisions = []
    for t, kind, i in events:
        if kind == "release":
            e = entries[i]
            e.last_used_us = t
            policy.on_release(e, t)
            idle.add(i)
        elif kind == "access":
            policy.on_access(entries[i], t)
            idle.discard(i)
        elif idle:
            cands = [entries[j] for j in sorted(idle)]
            victims = policy.select_victims(cands, 3 << 20, t)
            for v in victims:
                policy.on_evict(v, t)
            decisions.append((t, [v.entry_id for v in victims]))
    return decisions


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_online_off_ranks_as_the_offline_table(seed: int) -> None:
    """Off (the default), the table is never written and the victims are those of the offline
    rule computed from a freshly loaded table; on but never refit, the bookkeeping alone changes
    nothing either."""
    events = stream(seed, 40, 400)
    off = make()
    assert off.online is None
    pristine = off.table.curves.copy()
    got = play(off, entries_for(seed, 40), events)
    assert np.array_equal(off.table.curves, pristine)
    unrefit = make(forecast_online=True, forecast_online_every=10**6)
    assert play(unrefit, entries_for(seed, 40), events) == got
    ref = make()
    table = SurvivalTable(ref.table.features, ref.table.grid, ref.table.keys, pristine)
    # Reference: the rule P x restore / bytes from the pristine table, LRU among equals.
    ents = entries_for(seed, 40)
    rows: dict[int, int] = {}
    idle: set[int] = set()
    expect = []
    for t, kind, i in events:
        if kind == "release":
            ents[i].last_used_us = t
            ref.on_release(ents[i], t)
            rows[i] = ref.rows[i]
            idle.add(i)
        elif kind == "access":
            ref.on_access(ents[i], t)
            idle.discard(i)
        elif idle:

            def key(e: CacheEntry, t: int = t) -> tuple[float, int, int]:
                p = table.resume_within_at(rows[e.entry_id], t - e.last_used_us, ref.delta_us)
                return (p * e.restore_us / e.num_bytes, e.last_used_us, e.entry_id)

            order = sorted((ents[j] for j in idle), key=key)
            victims, freed = [], 0
            for e in order:
                victims.append(e)
                freed += e.num_bytes
                if freed >= 3 << 20:
                    break
            for v in victims:
                ref.on_evict(v, t)
            expect.append((t, [v.entry_id for v in victims]))
    assert got == expect


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000), st.floats(0.2, 0.8))
def test_online_decisions_before_t_do_not_depend_on_what_happens_after_t(
    seed: int, other: int, cut: float
) -> None:
    """Two runs share every event before T and differ after it (another random stream, and the
    entries' clairvoyant next_arrival_us set in one run only): decisions before T are equal, and
    the refits did change the curves (the test is not vacuous)."""
    a_events = stream(seed, 30, 600)
    t_cut = a_events[int(cut * len(a_events))][0]
    b_events = [e for e in a_events if e[0] < t_cut] + [
        (t + t_cut, k, i) for t, k, i in stream(other, 30, 300)
    ]
    ents_a, ents_b = entries_for(seed, 30), entries_for(seed, 30)
    for t, kind, i in a_events:  # the true next arrival, visible to a clairvoyant reader only
        if kind == "access":
            e = ents_a[i]
            e.next_arrival_us = t if e.next_arrival_us < 0 else min(e.next_arrival_us, t)
    pa = make(forecast_online=True, forecast_online_every=2, forecast_online_prior=5.0)
    pb = make(forecast_online=True, forecast_online_every=2, forecast_online_prior=5.0)
    da = [d for d in play(pa, ents_a, a_events) if d[0] < t_cut]
    db = [d for d in play(pb, ents_b, b_events) if d[0] < t_cut]
    assert da == db
    assert pa.online.num_refits > 0 and not np.array_equal(pa.table.curves, make().table.curves)


def test_a_run_with_online_updates_is_deterministic_and_adapts(tmp_path: Path) -> None:
    from dataclasses import replace

    from cachepilot_sim.config import to_config
    from cachepilot_sim.sim import build
    from tests.unit.test_hydra_configs import compose_run

    over = ["+experiment=mixed_spike", "workload.num_requests=200", "vram_gb=10",
            "policy=reuse_forecast", "policy.forecast_online=true",
            "policy.forecast_online_every=1", "trace.enabled=false"]  # fmt: skip
    cfg = to_config(compose_run(over)).sim_for("reuse_forecast", 2)
    sim = build(cfg)
    a = sim.run().metrics
    assert a == build(replace(cfg)).run().metrics
    assert a["forecast_online_gaps"] > 20 and a["forecast_online_refits"] > 0
    policy: Any = sim.policy
    assert not np.array_equal(policy.table.curves, make().table.curves)
    assert math.isfinite(a["realized_restore_s"])


def test_an_observation_leaves_with_its_window_or_a_release_without_access() -> None:
    """A gap is counted only for an observation still in the window, and an entry released again
    without an access in between (its use was not seen) closes nothing: no gap, no censoring."""
    table = exp_table(100.0)
    online = OnlineCurves(table, prior_weight=1.0, window=3, every=10**9)
    online.release(0, 1, 0)
    for i in range(1, 4):  # three later releases push entry 0 out of the window
        online.release(i, 1, i)
    online.access(0, 5_000_000)
    assert online.num_gaps == 0
    again = OnlineCurves(table, prior_weight=1.0, window=10, every=10**9)
    again.release(7, 1, 0)
    again.release(7, 1, 10)  # again, its use unseen: the first observation is dropped
    again.access(7, 20_000_000)
    gaps = again.windows[1].gap_us
    assert again.num_gaps == 1 and gaps[0] == -2 and gaps[1] == 19_999_990
    assert np.count_nonzero(gaps == -1) == 0
