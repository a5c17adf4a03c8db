"""perc_hazard's exact index (`policies/hazard_index.py`) pops what the policy's own key puts
first, on random streams of releases, returns (which move the Kaplan-Meier curves between
decisions), discards, pops and time; a class without a returned gap is on the EMA model (a
`PercIndex` of its own) while the others stay bounded, and classes move between the two. The
incremental curves (`policies/hazard_curve.py`) equal `SurvivalEstimate`'s bit for bit.

Keys tie often: returned gaps drawn from a few values give curves with flat stretches (P = 0
exactly), and restore / bytes from a few values; ties go to the smallest id, as the policy's key.
The managers' use of the index is checked against the forced full path (the streams of
test_indexed_eviction.py, with perc_hazard throughout); operation counts say a decision keys few
entries and computes each class's curve once.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.hazard_curve import WindowSurvival
from cachepilot_sim.policies.hazard_index import HazardIndex, count_at_most
from cachepilot_sim.policies.perc_variants import PercHazardPolicy, SurvivalEstimate
from cachepilot_sim.policies.reuse import GapEstimator
from tests.property import test_indexed_eviction as streams


def make_hazard(max_gaps: int = 512, delta_us: float = 5e6) -> PercHazardPolicy:
    policy = make_policy(
        policy_config("perc_hazard", hazard_max_gaps=max_gaps), GapEstimator(0.3, 2e6, delta_us)
    )
    assert isinstance(policy, PercHazardPolicy)
    return policy


def brute_min(policy: PercHazardPolicy, idle: dict[int, CacheEntry], now: int) -> int | None:
    """The full path's first victim: `order` over every idle entry."""
    entries = list(idle.values())
    return policy.order(entries, now)[0].entry_id if entries else None


ops_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 40), st.integers(0, 10**9), st.integers(0, 99)),
    min_size=1,
    max_size=200,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops_strategy,
    block_items=st.sampled_from([1, 2, 5, None]),
    max_gaps=st.sampled_from([3, 512]),
    delta=st.sampled_from([1.0, 1e4, 5e6]),
    warm=st.booleans(),
)
def test_pops_follow_the_policy_key(
    ops: list[tuple[int, int, int, int]],
    block_items: int | None,
    max_gaps: int,
    delta: float,
    warm: bool,
) -> None:
    policy = make_hazard(max_gaps, delta)
    index = HazardIndex(policy, block_items)
    idle: dict[int, CacheEntry] = {}
    now = 10**9
    if warm:  # every class has a returned gap: no fallback
        for c in range(3):
            e = CacheEntry(10**6 + c, 0, 0, c, 0, 16, 4096, 0, now)
            policy.on_release(e, now - 10**6)
            policy.on_access(e, now - 10**6 + 1000 * (c + 1))
    for kind, a, b, c in ops:
        if kind <= 3:  # an entry goes idle now, or was idle since earlier
            if a in idle and kind == 3:  # a return first: a gap observed
                index.discard(a)
                policy.on_access(idle.pop(a), now)
            entry = CacheEntry(a, a, 0, c % 3, 0, 16, 0, 0, 0)
            entry.last_used_us = now - (0 if kind == 0 else b % [10**3, 10**6, 10**9][c % 3])
            entry.num_bytes = [0, 1, 4096, 4096 * (1 + c % 4)][b % 4]
            entry.restore_us = [0.0, 100.0, 250.0, float(b % 7), 1 / 3][(a + c) % 5]
            entry.gap_ema_us = [-1.0, 1e3, 1e7][b % 3]
            policy.on_release(entry, entry.last_used_us)
            index.add(entry, entry.restore_us, entry.gap_ema_us)
            idle[a] = entry
        elif kind == 4:
            index.discard(a)
            idle.pop(a, None)
        elif kind <= 6:
            now += [0, 1, b % 10**4, b % 10**7, 1000 * (b % 7)][c % 5]
        else:
            want = brute_min(policy, idle, now)
            assert index.pop_min(now) == want
            if want is not None:
                policy.on_evict(idle.pop(want), now)
            assert index.peek_min(now) == brute_min(policy, idle, now)  # same now, again
        assert len(index) == len(idle)


def test_keys_are_the_policy_keys_exactly() -> None:
    """The index's scan and the policy's `key` agree bit for bit: each pop's key is the
    smallest `key` of the remaining entries, and popping all gives the full sort's order."""
    policy = make_hazard()
    rng = np.random.default_rng(5)
    now = 10**10
    for i in range(300):  # returned gaps from a few values: flat stretches, ties at P = 0
        e = CacheEntry(10**5 + i, 0, 0, i % 2, 0, 16, 4096, 0, 0)
        t = now - int(rng.integers(10**6, 10**9))
        policy.on_release(e, t)
        if rng.random() < 0.6:
            policy.on_access(e, t + int(rng.choice([10**5, 10**6, 3 * 10**6, 10**7])))
    index = HazardIndex(policy, 8)
    entries = []
    for i in range(400):
        e = CacheEntry(i, i, 0, i % 2, 0, 16, int(rng.choice([4096, 8192, 12288])), 0, 0)
        e.last_used_us = now - int(rng.integers(0, 10**9))
        e.restore_us = float(rng.choice([1.0, 3.0, 1 / 3, 1e4]))
        index.add(e, e.restore_us, -1.0)
        entries.append(e)
    assert all(policy.curve(c, now) is not None for c in (0, 1))
    order = [x.entry_id for x in policy.order(entries, now)]
    popped = [index.pop_min(now) for _ in entries]
    assert popped == order
    keys = sorted(policy.key(e, now) for e in entries)
    assert [k[1] for k in keys] == order
    assert sum(k[0] == 0.0 for k in keys) > 10  # ties at 0 were exercised
    assert index.num_fallback == 0


def test_a_class_on_the_ema_model_is_indexed_and_the_others_stay_bounded() -> None:
    """Class 0 has returned gaps, class 1 none: class 1's entries are popped through its
    `PercIndex` (no NumPy key for them), class 0's blocks are bounded, a few entries get the
    exact key; the order is the policy's."""
    policy = make_hazard()
    now = 10**10
    rng = np.random.default_rng(7)
    for i in range(200):
        e = CacheEntry(10**5 + i, 0, 0, 0, 0, 16, 4096, 0, 0)
        t = now - 2 * 10**9 + i * 10**7
        policy.on_release(e, t)
        policy.on_access(e, t + int(rng.integers(10**6, 10**9)))
    index = HazardIndex(policy)
    entries = []
    for i in range(2000):
        c = 1 if i % 20 == 0 else 0
        e = CacheEntry(i, i, 0, c, 0, 16, 4096 * int(rng.integers(1, 9)), 0, 0)
        e.last_used_us = now - int(rng.integers(0, 10**9))
        e.gap_ema_us = [-1.0, 3e7, 3e8][i % 3]
        # A free restore for half of class 1: keys of 0 tie with class 0's flat stretches.
        e.restore_us = 0.0 if i % 40 == 0 else float(rng.uniform(10.0, 1e4))
        index.add(e, e.restore_us, e.gap_ema_us)
        entries.append(e)
    assert policy.curve(0, now) is not None and policy.curve(1, now) is None
    order = [x.entry_id for x in policy.order(entries, now)][:50]
    assert [index.pop_min(now) for _ in range(50)] == order
    assert sum(eid % 20 == 0 for eid in order) >= 3  # both classes' entries were popped
    assert sum(eid % 20 != 0 for eid in order) > 5
    assert index.num_fallback == 50
    assert index.num_keyed <= 50 * 5  # a few exact keys a pop
    # PercIndex keys every entry of the smallest weight, 0 here for 50 of class 1's 100 (the
    # few-keys count is `test_a_decision_over_classes_without_a_curve_keys_few_entries`).
    assert index.num_ema_keyed() <= 50 * 50
    assert index.num_approx < 50 * 1900 // 3  # a share of class 0's, none of class 1's


def test_the_policy_offers_its_index_to_the_managers() -> None:
    policy = make_hazard()
    assert isinstance(policy.time_index(), HazardIndex)
    candidates = CandidateIndex(policy, lambda e, offload: e.restore_us)
    assert candidates.static_restore is not None and candidates.reads_restore


@pytest.mark.parametrize("seed", range(3))
def test_both_managers_evict_as_the_full_path_and_leave_the_fallback(seed: int) -> None:
    """Long seeded streams through the session and prefix managers, indexed against the forced
    full path, with and without a CPU tier; sessions return, so the index runs on curves."""
    ops, chains = streams.seeded_stream(seed)
    for offload in (False, True):
        for make, tree in ((streams.session_config, None), (streams.prefix_config, chains)):
            for cpu in (0, 40):
                pool = 90 if tree is None else 10
                cfg = make("perc_hazard", pool, cpu, offload, 0.1)
                streams.assert_same(cfg, ops, tree)
            _, log, kv = streams.run(make("perc_hazard", pool, 0, offload, 0.1), None, ops, tree)
            owner = kv.candidates if tree is None else kv.tails
            assert log and owner._timed and owner.num_full == 0


def test_the_managers_index_has_curved_pops() -> None:
    """Not all the streams' pops are the fallback's: some decisions run on the bounds."""
    curved = 0
    for seed in range(3):
        ops, _ = streams.seeded_stream(seed)
        _, log, kv = streams.run(
            streams.session_config("perc_hazard", 90, 0, False, 0.1), None, ops, None
        )
        for index in kv.candidates._timed.values():
            assert isinstance(index, HazardIndex)
            curved += index.num_curves > 0 and index.num_fallback < len(log)
    assert curved > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([70, 100, 160]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=streams.ops_strategy,
)
def test_session_manager_random_streams(
    pool: int, cpu: int, offload: bool, watermark: float, ops: list[streams.Op]
) -> None:
    streams.assert_same(
        streams.session_config("perc_hazard", pool, cpu, offload, watermark), ops, None
    )


@pytest.mark.parametrize(("mean_gap_us", "delta_us"), [(3e7, 5e6), (3e8, 5e6), (3e8, 1e8)])
def test_a_decision_keys_few_of_many_entries_and_one_curve_per_class(
    mean_gap_us: float, delta_us: float
) -> None:
    """Complexity, counted: 200 decisions of 3 victims each over 20,000 idle entries (each
    decision then 3 entries go idle, 1 ms apart) key a few entries exactly each, give a NumPy
    key to a small share of the cache (about 50, 480 and 200 entries a pop here, of 20,000;
    most keys tie at P = 0 in the first two), and compute each class's curve once."""
    policy = make_hazard(512, delta_us)
    index = HazardIndex(policy)
    rng = np.random.default_rng(1)
    size, now = 20_000, 2 * 10**9
    for i in range(600):  # returned gaps for three classes
        e = CacheEntry(10**6 + i, 0, 0, i % 3, 0, 16, 4096, 0, 0)
        policy.on_release(e, now - 10**9 + i * 10**6)
        policy.on_access(e, now - 10**9 + i * 10**6 + int(rng.exponential(mean_gap_us)))
    nxt = 0

    def release() -> None:
        nonlocal nxt
        t = int(rng.integers(256, 32_768))
        e = CacheEntry(
            nxt, nxt, 0, nxt % 3, 0, t, t * 131_072, 0, now - int(rng.integers(0, 5 * 10**8))
        )
        e.restore_us = 10.0 + 2.0 * t
        index.add(e, e.restore_us, -1.0)
        nxt += 1

    for _ in range(size):
        release()
    curves_before = index.num_curves
    for _ in range(200):
        now += 1000
        for _ in range(3):
            assert index.pop_min(now) is not None
        for _ in range(3):
            release()
    assert len(index) == size
    assert index.num_fallback == 0
    assert index.num_curves - curves_before == 200 * 3  # once per decision and class
    assert index.num_keyed <= 600 * 5
    assert index.num_approx <= 600 * size // 20


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([6, 10, 16]),
    chains=streams.prefix_trees(),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=streams.ops_strategy,
)
def test_prefix_manager_random_streams(
    pool: int,
    chains: list[list[int]],
    cpu: int,
    offload: bool,
    watermark: float,
    ops: list[streams.Op],
) -> None:
    streams.assert_same(
        streams.prefix_config("perc_hazard", pool, cpu, offload, watermark), ops, chains
    )


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 12), st.integers(0, 10**7)), max_size=120
    ),
    max_gaps=st.integers(1, 8),
)
def test_incremental_curves_equal_survival_estimate_bit_for_bit(
    ops: list[tuple[int, int, int]], max_gaps: int
) -> None:
    """Releases (some before now), returns (some of gaps already out of the window, some
    repeated), time and curves: `WindowSurvival.curve` is `SurvivalEstimate.curve`, float for
    float, at every step."""
    ref, inc = SurvivalEstimate(max_gaps), WindowSurvival(max_gaps)
    now = 10**8
    for kind, a, b in ops:
        if kind <= 1:
            t = now - (b % 1000 if kind else 0)
            ref.release(a, t)
            inc.release(a, t)
        elif kind <= 3:
            ref.returned(a, now)
            inc.returned(a, now)
        elif kind == 4:
            now += [0, 1, b % 1000, b][a % 4]
        want, got = ref.curve(now), inc.curve(now)
        assert (want is None) == (got is None)
        if want is not None and got is not None:
            for x, y in zip(want, got, strict=True):
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@settings(max_examples=150, deadline=None)
@given(
    times=st.lists(st.integers(0, 50), max_size=20),
    x=st.lists(st.integers(-5, 60), max_size=30),
)
def test_count_at_most_is_searchsorted_right(times: list[int], x: list[int]) -> None:
    t = np.sort(np.array(times, dtype=np.float64))
    xs = np.sort(np.array(x, dtype=np.float64))
    got = count_at_most(t, xs)
    assert got.tolist() == np.searchsorted(t, xs, side="right").tolist()


@pytest.mark.parametrize("seed", range(4))
def test_classes_move_between_the_ema_model_and_curves(seed: int) -> None:
    """A window of a few gaps: classes gain a curve at a return and lose it when that gap
    leaves the window; every pop, on either path or both, is the full sort's first entry, and
    the stream saw both moves and both paths."""
    policy = make_hazard(max_gaps=4, delta_us=1e6)
    index = HazardIndex(policy, 4)
    rng = np.random.default_rng(seed)
    idle: dict[int, CacheEntry] = {}
    had: dict[int, bool] = {}
    moves = {True: 0, False: 0}
    now, nxt, pops, curved = 10**9, 0, 0, 0
    for _ in range(400):
        r = rng.random()
        if r < 0.45 or not idle:
            c = int(rng.integers(0, 3))
            e = CacheEntry(nxt, nxt, 0, c, 0, 16, int(rng.choice([4096, 8192])), 0, now)
            e.last_used_us = now - int(rng.choice([0, 10**5, 10**7]))
            e.restore_us = float(rng.choice([0.0, 50.0, 100.0, 1 / 3]))
            e.gap_ema_us = float(rng.choice([-1.0, 1e5, 1e7]))
            policy.on_release(e, e.last_used_us)
            index.add(e, e.restore_us, e.gap_ema_us)
            idle[nxt] = e
            nxt += 1
        elif r < 0.6:  # a session returns: its class may gain a curve, and the curves move
            eid = int(rng.choice(list(idle)))
            index.discard(eid)
            policy.on_access(idle.pop(eid), now)
        elif r < 0.75:
            now += int(rng.choice([1, 10**4, 10**6]))
        else:
            state = {
                c: policy.curve(c, now) is not None for c in {e.class_index for e in idle.values()}
            }
            for c, has in state.items():
                if c in had and had[c] != has:
                    moves[has] += 1
                had[c] = has
            fallback = index.num_fallback
            want = brute_min(policy, idle, now)
            assert index.pop_min(now) == want
            pops += 1
            curved += index.num_fallback == fallback
            policy.on_evict(idle.pop(want), now)  # type: ignore[arg-type]
    assert pops > 50 and moves[True] > 0 and moves[False] > 0
    assert 0 < index.num_fallback < pops and curved > 0


def test_a_decision_over_classes_without_a_curve_keys_few_entries() -> None:
    """Complexity, counted, on the EMA model: 200 decisions of 3 victims each over 10,000 idle
    entries of 3 classes that never saw a return (half with a gap EMA of their own), each
    decision then 3 entries go idle: no entry gets a NumPy key, the classes' `PercIndex` key a
    few entries a pop (the old path keyed all 10,000), and the first pops are the full sort's."""
    policy = make_hazard(512, 3e7)
    index = HazardIndex(policy)
    rng = np.random.default_rng(3)
    now, nxt = 2 * 10**9, 0
    entries: dict[int, CacheEntry] = {}

    def release(idle_us: int) -> None:
        nonlocal nxt
        t = int(rng.integers(256, 32_768))
        e = CacheEntry(nxt, nxt, 0, nxt % 3, 0, t, t * 131_072, 0, now - idle_us)
        e.restore_us = 10.0 + 2.0 * t
        e.gap_ema_us = -1.0 if rng.random() < 0.5 else float(rng.integers(10**6, 10**9))
        policy.on_release(e, e.last_used_us)
        index.add(e, e.restore_us, e.gap_ema_us)
        entries[nxt] = e
        nxt += 1

    for _ in range(10_000):
        release(int(rng.integers(0, 5 * 10**8)))
    assert all(policy.curve(c, now) is None for c in range(3))
    want = [x.entry_id for x in policy.order(list(entries.values()), now)[:3]]
    assert [index.pop_min(now) for _ in range(3)] == want
    for eid in want:
        del entries[eid]
    for _ in range(200):
        now += 1000
        for _ in range(3):
            eid = index.pop_min(now)
            assert eid is not None
            del entries[eid]
        for _ in range(3):
            release(0)
    assert len(index) == len(entries) == 10_000 - 3
    assert index.num_fallback == 603
    assert index.num_approx == 0
    assert index.num_ema_keyed() <= 603 * 30


def test_the_ema_model_reads_the_gap_as_added_not_the_entry_now() -> None:
    """The prefix manager adds a block with its group's gap EMA (`TailIndex.static_restore`)
    and re-adds it when that moves (`regroup`); the block's own entry field is only filled in by
    `_prepare` for a decision. The index keys by the gap it was given, as the full path keys the
    prepared entry (main before this read the entry's field: the Mooncake replay then differed
    from the forced full path)."""
    policy = make_hazard(512, 5e6)
    index = HazardIndex(policy)
    now = 10**9
    slow, fast = (CacheEntry(i, i, 0, 0, 0, 16, 4096, 0, now - 10) for i in (2, 1))
    for e in (slow, fast):
        e.restore_us = 100.0
    index.add(slow, 100.0, 1e12)  # a group that returns after ~11 days: P ~ 5e-6
    index.add(fast, 100.0, 1e3)  # P ~ 1
    slow.gap_ema_us = 1.0  # a stale field (P = 1: a tie, won by the smaller id) not to read
    assert index.pop_min(now) == 2
    slow.gap_ema_us = 1e12  # as `_prepare` would fill it in: the full path agrees
    assert brute_min(policy, {2: slow, 1: fast}, now) == 2
