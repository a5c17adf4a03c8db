"""reuse_forecast's exact index (`policies/forecast_index.py`) pops what the policy's own key puts
first, on random streams of idle entries, evictions (which move the learned δ) and time.

The curves are the shipped table's, or small random tables with flat stretches and steep drops
(P then rises with idle time somewhere), or a table that is not non-increasing (the index then
bounds nothing and scans every block). Blocks of 2 items make the streams split and empty
blocks often. The managers' use of the index is checked against the full sort in
test_indexed_eviction.py; the operation counts here say a decision keys few entries.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.forecast_index import ForecastIndex
from cachepilot_sim.policies.forecast_model import SurvivalTable
from cachepilot_sim.policies.reuse import GapEstimator
from cachepilot_sim.policies.reuse_forecast import ReuseForecastPolicy
from tests.property import test_indexed_eviction as streams

FEATURES = ("class", "tokens")


def random_table(seed: int, monotone: bool = True) -> SurvivalTable:
    """Rows (class, tokens) with flat runs, steep drops and a tail share that never returns."""
    rng = np.random.default_rng(seed)
    keys = [()] + [(c,) for c in range(3)] + [(c, t) for c in range(3) for t in range(0, 9, 2)]
    curves = []
    for _ in keys:
        steps = rng.choice([0.0, 0.0, 0.01, 0.2, 0.7], size=41) * rng.random(41)
        curve = np.cumprod(1.0 - steps)
        curve = np.round(curve, int(rng.integers(2, 6)))
        if not monotone:
            curve[int(rng.integers(1, 40))] += 0.1
        curves.append(curve)
    return SurvivalTable(FEATURES, (0.1, 1000.0, 41), keys, np.array(curves))


def make_forecast(table: int | None, monotone: bool, **knobs: object) -> ReuseForecastPolicy:
    policy = make_policy(policy_config("reuse_forecast", **knobs), GapEstimator(0.3, 2e6, 5e6))
    assert isinstance(policy, ReuseForecastPolicy)
    if table is not None:
        policy.table = random_table(table, monotone)
    return policy


ops_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 30), st.integers(0, 10**9), st.integers(0, 99)),
    min_size=1,
    max_size=150,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops_strategy,
    table=st.sampled_from([None, 0, 1, 2]),
    monotone=st.booleans(),
    delta=st.sampled_from(["eviction_age", "fixed"]),
    pricing=st.sampled_from(["restore", "none"]),
    block_items=st.sampled_from([1, 2, None]),
)
def test_pops_follow_the_policy_key(
    ops: list[tuple[int, int, int, int]],
    table: int | None,
    monotone: bool,
    delta: str,
    pricing: str,
    block_items: int | None,
) -> None:
    policy = make_forecast(
        table, monotone or table is None, forecast_delta=delta, forecast_pricing=pricing
    )
    index = ForecastIndex(policy, block_items)
    idle: dict[int, CacheEntry] = {}
    now = 10**9
    for kind, a, b, c in ops:
        if kind <= 3:  # an entry goes idle now, or was idle since earlier (same or new row)
            entry = idle.get(a) or CacheEntry(a, a, 0, c % 3, 0, 1 << (c % 16), 0, 0, 0)
            entry.last_used_us = now - (0 if kind == 0 else b % [10**3, 10**6, 10**9][c % 3])
            entry.num_bytes = [0, 1, 4096, 4096 * (1 + c)][b % 4]
            entry.restore_us = [0.0, 100.0, 250.0, float(b), 1 / 3][(a + c) % 5]
            if kind != 3 or a not in policy.rows:
                policy.on_release(entry, now)
            index.add(entry, entry.restore_us, -1.0)
            idle[a] = entry
        elif kind == 4:
            index.discard(a)
            idle.pop(a, None)
        elif kind <= 6:
            now += [0, 1, b % 10**4, b % 10**7, b][c % 5]
        else:
            want = min(idle.values(), key=lambda e: policy.key(e, now), default=None)
            got = index.pop_min(now)
            assert got == (want.entry_id if want is not None else None)
            if want is not None:
                policy.on_evict(idle.pop(got), now)  # δ moves (eviction_age)
        assert len(index) == len(idle)


def test_online_refits_keep_the_index_exact() -> None:
    """forecast_online=true rewrites curves between decisions; the index reads them at each."""
    policy = make_forecast(None, True, forecast_online=True, forecast_online_every=1)
    index = ForecastIndex(policy, 4)
    rng = np.random.default_rng(3)
    idle: dict[int, CacheEntry] = {}
    now = 10**9
    for step in range(600):
        eid = int(rng.integers(0, 80))
        now += int(rng.integers(0, 3 * 10**6))
        if eid in idle and rng.random() < 0.5:  # a return: a gap observed, a curve refit
            entry = idle.pop(eid)
            index.discard(eid)
            policy.on_access(entry, now)
        entry = CacheEntry(eid, eid, 0, eid % 3, 0, 512 * (1 + eid % 7), 4096 * (1 + eid), 0, now)
        entry.restore_us = 1000.0 + eid
        policy.on_release(entry, now)
        index.add(entry, entry.restore_us, -1.0)
        idle[eid] = entry
        if step % 3 == 0:
            want = min(idle.values(), key=lambda e: policy.key(e, now))
            assert index.pop_min(now) == want.entry_id
            policy.on_evict(idle.pop(want.entry_id), now)
    assert policy.online is not None and policy.online.num_refits > 50


def test_the_policy_offers_its_index_to_the_managers() -> None:
    policy = make_forecast(None, True)
    assert isinstance(policy.time_index(), ForecastIndex)
    candidates = CandidateIndex(policy, lambda e, offload: e.restore_us)
    assert candidates.static_restore is not None and candidates.reads_restore
    unpriced = make_forecast(None, True, forecast_pricing="none")
    assert not CandidateIndex(unpriced, lambda e, offload: 0.0).reads_restore


def test_a_decision_keys_few_of_many_entries() -> None:
    """Complexity, counted: 200 one-victim decisions over 20,000 idle entries in the bench's
    steady state (each decision evicts one entry and one more goes idle; 1 ms apart) key a few
    entries exactly each, and give an approximate key to a small share of the cache."""
    policy = make_forecast(None, True)
    index = ForecastIndex(policy)
    rng = np.random.default_rng(1)
    size, now = 20_000, 2 * 10**9
    tokens = rng.integers(256, 32_768, size + 200)
    entries: dict[int, CacheEntry] = {}
    for i in range(size + 200):
        t = int(tokens[i])
        e = CacheEntry(i, i, 0, i % 3, 0, t, t * 131_072, 0, now - int(rng.integers(0, 5 * 10**8)))
        e.restore_us = 10.0 + 2.0 * t
        entries[i] = e
        if i >= size:  # one decision, then one more entry goes idle
            now += 1000
            e.last_used_us = now
            victim = index.pop_min(now)
            assert victim is not None
            policy.on_evict(entries.pop(victim), now)  # δ moves
        policy.on_release(e, now)
        index.add(e, e.restore_us, -1.0)
    assert len(index) == size
    assert index.num_keyed <= 200 * 5
    assert index.num_approx <= 200 * size // 20


def test_a_flat_stretch_forecasts_zero_exactly_so_its_entries_go_oldest_first() -> None:
    """S = 0.45 from grid point 10 to 30 (1 s to 100 s on this grid): within it P(resume within
    δ) is exactly 0, not ±1e-16 of interpolation noise (0.45 (1 - f) + 0.45 f is not always 0.45),
    and the keys of such entries tie at 0 and go by last use (LRU), as the docstring says."""
    curve = np.array([1.0] * 10 + [0.45] * 21 + [0.2] * 10)
    table = SurvivalTable(("class",), (0.1, 1000.0, 41), [()], curve[None, :])
    grid = table.grid_us()
    rng = np.random.default_rng(0)
    for _ in range(2000):
        t = float(rng.uniform(grid[10], grid[30] / 2))
        assert table.resume_within_at(0, t, grid[30] - 2 * t) == 0.0
    policy = make_forecast(None, True, forecast_delta="fixed")
    policy.table = table
    policy.delta_us = float(grid[12] - grid[11])
    now = int(grid[30]) // 2 + 10**6
    entries = []
    for i in range(40):  # idle from grid[11] to grid[30] / 2: all inside the flat stretch
        idle = float(rng.uniform(grid[11], grid[30] / 2 - policy.delta_us))
        e = CacheEntry(i, i, 0, 0, 0, 16, 4096, 0, now - int(idle))
        e.restore_us = float(rng.uniform(1.0, 1e4))
        policy.on_release(e, now)
        entries.append(e)
    order = sorted(entries, key=lambda e: policy.key(e, now))
    assert [policy.key(e, now)[0] for e in order] == [0.0] * 40
    assert order == sorted(entries, key=lambda e: (e.last_used_us, e.entry_id))


def test_online_and_unpriced_modes_evict_through_both_managers_as_the_full_path() -> None:
    """The managers' streams of test_indexed_eviction.py with the curves refit at every
    observation, and with a fixed δ and no pricing (one index for every restore regime)."""
    modes = (
        {"forecast_online": True, "forecast_online_every": 1},
        {"forecast_delta": "fixed", "forecast_pricing": "none"},
    )
    for knobs in modes:
        for seed in range(2):
            ops, chains = streams.seeded_stream(seed)
            for offload in (False, True):
                for make, tree in ((streams.session_config, None), (streams.prefix_config, chains)):
                    pool = 90 if tree is None else 10
                    cfg = make("reuse_forecast", pool, 40, offload, 0.1)
                    cfg = replace(cfg, policy=policy_config("reuse_forecast", **knobs))
                    streams.assert_same(cfg, ops, tree)
                    _, log, kv = streams.run(cfg, None, ops, tree)
                    index = kv.candidates if tree is None else kv.tails
                    assert log and index._timed
