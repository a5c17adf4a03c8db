"""PERC's exact time index (`policies/perc_index.py`) gives what sorting every key gives.

Three levels: the bare index against a brute-force minimum on random operation streams (adds with
and without an own gap, discards, time and population-gap moves, pops); the index inside the
session manager, whose victims are compared with the full sort's by
`tests/property/test_indexed_eviction.py` (here: that its decisions do go through the index, and
fall back to keying everything when the CPU store's residency is below δ); and a count of the
items a decision keys, which grows like the number of weight records (about ln n), not like n.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy, perc_index
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.perc import PercEntryIndex, PercPolicy
from cachepilot_sim.policies.perc_index import PercIndex
from cachepilot_sim.policies.reuse import GapEstimator
from tests.property.test_indexed_eviction import run, seeded_stream, session_config

Item = tuple[int, float, float]  # last_used_us, own gap (< 0: none), weight


def brute_min(items: dict[int, Item], now: int, population: float, delta: float) -> int | None:
    """The id with the smallest (key, id), keying every item as PercPolicy.score does."""
    best: tuple[float, int] | None = None
    for item_id, (last, own, w) in items.items():
        gap = max(own if own >= 0 else population, float(now - last), 1.0)
        cand = (-math.expm1(-delta / gap) * w, item_id)
        if best is None or cand < best:
            best = cand
    return None if best is None else best[1]


# An op: (kind, a, b, c). Gaps, weights and times are drawn coarse so that ties and boundary
# cases (idle time equal to the gap, zero weights, equal weights) happen often.
ops_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 60), st.integers(0, 2_000), st.integers(0, 12)),
    min_size=1,
    max_size=300,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops_strategy,
    delta=st.sampled_from([1.0, 500.0, 30e6]),
    block=st.sampled_from([1, 2, 3, 256]),
)
def test_pops_equal_the_brute_force_minimum(
    ops: list[tuple[int, int, int, int]], delta: float, block: int
) -> None:
    check_stream(ops, delta, block)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, delta=st.sampled_from([1.0, 500.0, 30e6]))
def test_pops_are_the_same_when_the_expiry_heap_is_rebuilt_at_every_add(
    ops: list[tuple[int, int, int, int]], delta: float
) -> None:
    """The heap of expiry times is rebuilt from the young items when stale entries pile up;
    with the rebuild forced at every add the pops still equal the brute-force minimum."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(perc_index, "_EXPIRY_COMPACT_FACTOR", 0)
        mp.setattr(perc_index, "_EXPIRY_COMPACT_FLOOR", 0)
        check_stream(ops, delta, 2)


def test_the_expiry_heap_stays_bounded_when_no_query_advances_the_clock() -> None:
    """An index no decision reads (a restore regime not in use) still gets every add and
    discard: its heap must not keep one entry per add for good (it did: a 10^7-request run
    grew by about 100 bytes a request)."""
    index = PercIndex(1_000.0)
    for i in range(20_000):
        index.add(i, i, 5_000.0, 1.0)  # young for 5,000 us: no query moves it out
        if i >= 10:
            index.discard(i - 10)
    assert len(index) == 10
    assert len(index._expiry) <= 2 * 10 + 64


def check_stream(ops: list[tuple[int, int, int, int]], delta: float, block: int) -> None:
    """Run `ops` on a fresh index, checking every pop against the brute-force minimum."""
    index, items = PercIndex(delta, block_items=block), {}
    now, population = 0, 700.0
    for kind, a, b, c in ops:
        if kind <= 3:  # an item goes idle (now, or a while ago: a prefix tail's old last use)
            last = now - (b if kind == 3 else 0)
            own = [-1.0, 0.0, 0.5, float(b), b / 3.0, 250.0][c % 6]
            w = [0.0, 1.0, 2.0, b / 7.0, 1 / 3, 2 / 3][(c + a) % 6]
            index.add(a, last, own, w)
            items[a] = (last, own, w)
        elif kind == 4:
            index.discard(a)
            items.pop(a, None)
        elif kind <= 6:
            now += [0, 1, b, 10 * b][c % 4]
        elif kind == 7:
            population = [0.5, float(b), 1e6][c % 3]
        else:
            want = brute_min(items, now, population, delta)
            assert index.peek_min(now, population) == want
            assert index.pop_min(now, population) == want
            if want is not None:
                del items[want]
        assert len(index) == len(items)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="delta_us"):
        PercIndex(0.0)
    index = PercIndex(10.0)
    with pytest.raises(ValueError, match="weight"):
        index.add(1, 0, -1.0, math.inf)
    index.pop_min(100, 5.0)
    with pytest.raises(ValueError, match="time went back"):
        index.pop_min(99, 5.0)


def keyed_per_pop(n: int, seed: int, own_gap: bool, equal: bool) -> float:
    """Items keyed per pop over n dormant items (random or equal weights, distinct idle times),
    one new item going idle per pop."""
    rng = np.random.default_rng(seed)
    index = PercIndex(1_000.0)
    weights = np.full(n + 200, 0.5) if equal else rng.random(n + 200)
    gap = 1.0 if own_gap else -1.0
    for i in range(n):
        index.add(i, i, gap, float(weights[i]))
    now = n + 10
    before = index.num_keyed
    for i in range(n, n + 200):
        assert index.pop_min(now, 1.0) is not None
        index.add(i, now, gap, float(weights[i]))
        now += 2
    return (index.num_keyed - before) / 200


@pytest.mark.parametrize("own_gap", [True, False])
def test_a_decision_keys_about_ln_n_items(own_gap: bool) -> None:
    """Complexity, counted: random weights have about ln n records; 16x more items key a few
    more, not 16x more (and far fewer than n). Equal weights key one item or two."""
    small = np.mean([keyed_per_pop(2_000, s, own_gap, False) for s in range(3)])
    large = np.mean([keyed_per_pop(32_000, s, own_gap, False) for s in range(3)])
    assert small <= 3 * math.log(2_000)
    assert large <= 3 * math.log(32_000)
    assert large < 2 * small
    assert keyed_per_pop(32_000, 0, own_gap, True) <= 2


def test_young_items_are_ranked_by_their_constant_key_and_expire_once() -> None:
    """An item idle for less than its own gap keeps a constant key (it sits in the sorted young
    set); past it, its key decays with idle time and it may overtake others."""
    delta = 100.0
    index = PercIndex(delta)
    index.add(1, 0, 1_000.0, 1.0)  # young until t = 1000, key p(1000)
    index.add(2, 0, 10.0, 0.09)  # dormant from t = 10: p(idle) x 0.09
    # At t = 500 item 2's key is p(500) x 0.09 < p(1000): it goes first.
    assert index.peek_min(500, 1.0) == 2
    index.discard(2)
    index.add(3, 500, 10.0, 0.5)  # dormant from 510: at 4000 its key is p(3500) x 0.5
    # At 4000 item 1 is dormant too: p(4000) vs p(3500) x 0.5: 1's key is larger.
    p = lambda g: -math.expm1(-delta / g)  # noqa: E731
    assert p(4000.0) > p(3500.0) * 0.5
    assert index.pop_min(4000, 1.0) == 3
    assert index.pop_min(4000, 1.0) == 1
    assert index.pop_min(4000, 1.0) is None


def perc_entry(i: int, last: int, gap: float, restore: float, size: int) -> CacheEntry:
    e = CacheEntry(i, i, 0, 0, 0, 16, size, created_us=0, last_used_us=last, gap_ema_us=gap)
    e.restore_us = restore
    return e


def test_the_entry_adapter_orders_as_perc_policy_orders() -> None:
    """Through `PercPolicy.time_index`, pops follow `PercPolicy.order` (its vectorised sort)."""
    est = GapEstimator(0.3, 2e6, 1e6)
    policy = make_policy(policy_config("perc"), est)
    assert isinstance(policy, PercPolicy)
    rng = np.random.default_rng(4)
    entries = [
        perc_entry(
            i,
            int(rng.integers(0, 5_000_000)),
            float(rng.choice([-1.0, rng.uniform(1e3, 4e6)])),
            float(rng.uniform(0, 1e5)),
            int(rng.integers(1, 10**6)),
        )
        for i in range(300)
    ]
    index = policy.time_index()
    for e in entries:
        index.add(e, e.restore_us, e.gap_ema_us)
    now = 6_000_000
    popped = [index.pop_min(now) for _ in entries]
    assert popped == [e.entry_id for e in policy.order(entries, now)]


@pytest.mark.parametrize("offload", [False, True])
def test_session_decisions_go_through_the_index_unless_the_restore_moves(offload: bool) -> None:
    """Without offload every restore is a recompute: every decision uses the index. With a CPU
    store that has dropped KV (residency below δ) the estimate moves with idle time: those
    decisions key every candidate (`num_full`). The victims equal the full sort's either way
    (test_indexed_eviction.py, which runs PERC through this index)."""
    for seed in range(3):
        ops, _ = seeded_stream(seed)
        _, log, kv = run(session_config("perc", 90, 40, offload, 0.1), None, ops, None)
        index = kv.candidates
        assert len(log) >= 3
        assert list(index._timed) == [offload]
        if offload:
            assert index.num_full > 0 and kv.cpu.residency_us < kv.estimator.delta_us
        else:
            assert index.num_full == 0 and index.num_visits >= len(log)


def test_a_session_manager_decision_keys_few_entries_whatever_the_cache_size() -> None:
    """Complexity, counted, through `CandidateIndex`: 100 one-victim PERC decisions over 10^4
    idle entries (random sizes, gap histories, idle times), each followed by a release, key a
    few entries each (records of restore / bytes), not 10^4."""
    est = GapEstimator(0.3, 2e7, 3e7)
    policy = make_policy(policy_config("perc"), est)
    index = CandidateIndex(policy, lambda e, offload: e.recompute_us)
    rng = np.random.default_rng(7)
    now, size = 10**9, 10_000
    for i in range(size + 100):
        tokens = int(rng.integers(256, 32_768))
        e = CacheEntry(
            i, i, 0, 0, 0, tokens, tokens * 131_072, 0, now - int(rng.integers(0, 500_000_000))
        )
        e.gap_ema_us = float(rng.choice([-1.0, rng.uniform(1e6, 1e9)]))
        e.recompute_us = e.restore_us = 20.0 * tokens + 1e-4 * tokens * tokens
        if i < size:
            index.add(e, now)
            continue
        now += 1_000
        (victim,) = index.select(1, now, lambda e: e, -1, False)
        index.discard(victim.entry_id)
        e.last_used_us = now
        index.add(e, now)
    timed = index._timed[False]
    assert isinstance(timed, PercEntryIndex)
    assert index.num_full == 0 and index.num_visits == 100
    assert timed.num_keyed() <= 100 * 3 * math.log(size)


def test_items_loaded_after_advance_that_are_already_dormant_skip_the_young_set() -> None:
    """`advance(now)` before a bulk load: an item whose own gap has already passed goes straight
    to the dormant order (the first query then moves nothing); its rank is unchanged."""
    index = PercIndex(100.0)
    index.advance(10_000)
    index.add(1, 0, 50.0, 1.0)  # idle 10,000 µs, gap 50: dormant
    index.add(2, 9_990, 50.0, 1.0)  # idle 10 µs: young
    assert len(index._young) == 1
    assert index.pop_min(10_000, 1.0) == 1  # longer idle, same weight: smaller P
