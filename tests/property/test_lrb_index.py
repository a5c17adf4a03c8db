"""LRB's exact index (`policies/lrb_index.py`) pops what the policy's own key puts first, on random
streams of idle entries, observed gaps (which move the predictor), discards and time.

Gaps and idle times are drawn around the boundary (1,000 µs here) so that entries fall on both
sides of it, buckets are sparse (the population predicts them) or full, and some streams leave
no entry beyond the boundary (the ranked path). The managers' use of the index is checked against
the full sort in test_indexed_eviction.py; the operation count here says a decision looks at
O(buckets) entries, not O(entries).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.lrb import LrbPolicy
from cachepilot_sim.policies.lrb_index import LrbIndex
from cachepilot_sim.policies.reuse import GapEstimator


def make_lrb(boundary_s: float, window: int, min_gaps: int) -> LrbPolicy:
    cfg = policy_config(
        "lrb", lrb_boundary_s=boundary_s, lrb_window_gaps=window, lrb_min_gaps=min_gaps
    )
    policy = make_policy(cfg, GapEstimator(0.3, 1e6, 1e6))
    assert isinstance(policy, LrbPolicy)
    return policy


ops_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 30), st.integers(0, 5_000), st.integers(0, 99)),
    min_size=1,
    max_size=200,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops_strategy,
    boundary_s=st.sampled_from([1e-3, 1.5e-3, 2e-6]),
    window=st.sampled_from([8, 12]),
    min_gaps=st.sampled_from([1, 4, 8]),
)
def test_pops_follow_the_policy_key(
    ops: list[tuple[int, int, int, int]], boundary_s: float, window: int, min_gaps: int
) -> None:
    policy = make_lrb(boundary_s, window, min_gaps)
    index = LrbIndex(policy)
    idle: dict[int, CacheEntry] = {}
    known: dict[int, CacheEntry] = {}
    now = 10_000
    for kind, a, b, c in ops:
        entry = known.get(a) or CacheEntry(a, a, 0, c % 2, 0, 16, 100, 0, now)
        known[a] = entry
        if kind <= 3:  # an entry goes idle now or earlier, released through the hook or not
            entry.last_used_us = now - (0 if kind == 0 else b % 3_000)
            entry.num_uses = 1 + c % 3
            entry.gap_ema_us = [-1.0, 1e6, 4e6][c % 3]
            if kind != 3:
                policy.on_release(entry, now)
            index.add(entry, 0.0, -1.0)
            idle[a] = entry
        elif kind == 4:
            index.discard(a)
            idle.pop(a, None)
        elif kind == 5:
            now += [0, 1, b % 700, b][c % 4]
        elif kind == 6:  # a return: one gap observed (the entry is in use, then idle again)
            index.discard(a)
            idle.pop(a, None)
            entry.last_used_us = now - b % 3_000
            policy.on_access(entry, now)
        else:
            want = min(idle.values(), key=lambda e: policy.key(e, now), default=None)
            got = index.pop_min(now)
            assert got == (want.entry_id if want is not None else None)
            if want is not None:
                policy.on_evict(idle.pop(got), now)
        assert len(index) == len(idle)


def test_within_the_boundary_the_furthest_predicted_goes_first_and_beyond_it_the_oldest() -> None:
    """Gaps of 1,000 and 3,000 µs, boundary 5,000 µs. Idle 100 µs: residual 2,900 (the median
    of the gaps longer than 100 is 3,000); idle 1,500: 1,500 left. Both are within the boundary,
    the furthest predicted goes first. Idle 3,500, past every gap: beyond it, first of all."""
    policy = make_lrb(5e-3, 8, 1)
    feeder = CacheEntry(99, 99, 0, 0, 0, 16, 100, 0, 0)
    for gap in (1_000, 3_000):
        policy.on_release(feeder, 0)
        policy.on_access(feeder, gap)
    index = LrbIndex(policy)
    now = 10_000
    entries = [CacheEntry(i, i, 0, 0, 0, 16, 100, 0, now - t) for i, t in enumerate((100, 1_500))]
    for e in entries:
        policy.on_release(e, now)
        index.add(e, 0.0, -1.0)
    assert [policy.key(e, now)[:2] for e in entries] == [(1, -2_900.0), (1, -1_500.0)]
    assert index.pop_min(now) == 0
    old = CacheEntry(7, 7, 0, 0, 0, 16, 100, 0, now - 3_500)
    policy.on_release(old, now)
    index.add(old, 0.0, -1.0)
    assert index.pop_min(now) == 7
    assert index.pop_min(now) == 1


def test_a_decision_looks_at_buckets_not_entries() -> None:
    """Complexity, counted: 200 one-victim decisions over 20,000 idle entries, 30 feature
    buckets, a predictor fed a gap every decision, make a handful of bisections per bucket."""
    policy = make_lrb(30.0, 256, 8)
    index = LrbIndex(policy)
    rng = np.random.default_rng(2)
    size, now = 20_000, 10**10
    entries: dict[int, CacheEntry] = {}
    for i in range(size + 200):
        e = CacheEntry(i, i, 0, i % 3, 0, 16, 100, 0, now - int(rng.integers(0, 10**9)))
        e.num_uses = 1 + i % 5
        e.gap_ema_us = float(rng.choice([-1.0, 2e6, 3e7, 4e8]))
        entries[i] = e
        if i >= size:  # a return feeds the predictor, a decision evicts, the entry goes idle
            now += 1000
            feeder = CacheEntry(-i, -i, 0, i % 3, 0, 16, 100, 0, now - int(rng.integers(0, 10**8)))
            feeder.num_uses, feeder.gap_ema_us = e.num_uses, e.gap_ema_us
            policy.on_release(feeder, feeder.last_used_us)
            policy.on_access(feeder, now)
            e.last_used_us = now
            victim = index.pop_min(now)
            assert victim is not None
            policy.on_evict(entries[victim], now)
        policy.on_release(e, now)
        index.add(e, 0.0, -1.0)
    assert len(index) == size
    assert len(index._buckets) <= 60
    assert index.num_probes <= 200 * 3 * 60
