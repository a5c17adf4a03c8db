"""SLRU's and ARC's indexes (`policies/set_indexes.py`) and T-LRU's lanes (`policies/lanes.py`)
choose what the full sort chose.

Each structure is driven by a random history of hooks and decisions next to a copy of the policy
that takes the full path (`prepare` over the candidates but the excluded one, then sorted by key),
with many last-use ties (prefix blocks of one request share theirs): same victims in the same
order, same segment in the victims' keys, same policy state after. The session manager's streams
(`test_indexed_eviction.py`) are rerun here with more examples for these policies, and the
operation counts show a decision looks at its victims and a few neighbours, not at n entries.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.kv.forest import HashBlock
from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.reuse import GapEstimator
from tests.conftest import make_kv
from tests.property.test_indexed_eviction import (
    Op,
    assert_same,
    ops_strategy,
    prefix_config,
    prefix_trees,
    run,
    seeded_stream,
    session_config,
)

SET_INDEXED = ["slru", "arc"]
Step = tuple[int, int, int, int]
steps_strategy = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 10**6), st.integers(1, 9)),
    min_size=10,
    max_size=200,
)


def _policy(name: str, **overrides: Any) -> Any:
    return make_policy(policy_config(name, **overrides), GapEstimator(0.3, 1e6, 1e6))


def _state(policy: Any) -> tuple[Any, ...]:
    """What a decision may change in the policy and what later decisions read."""
    if policy.name == "arc":
        return (policy.capacity_bytes, policy.target_bytes, dict(policy.ghost1), policy.ghost_bytes)
    return (sorted(policy.protected),)


def drive(name: str, steps: list[Step], fraction: float) -> int:
    """Replay `steps` (kind, entry, amount, size) on an index and on a full-path twin; returns
    the number of decisions that evicted something."""
    extra = {"slru_protected_fraction": fraction} if name == "slru" else {}
    fast, ref = _policy(name, **extra), _policy(name, **extra)
    index = fast.set_index()
    idle: dict[int, CacheEntry] = {}
    twins: dict[int, CacheEntry] = {}
    num_decisions = 0
    for t, (kind, eid, amount, size) in enumerate(steps):
        if kind <= 1:  # goes idle (a release): last use now, or tied with the previous one
            e = CacheEntry(eid, eid, 0, 0, 0, size, size * 100, 0, t // 8)
            twins[eid] = copy.copy(e)
            for p, x in ((fast, e), (ref, twins[eid])):
                p.on_release(x, t)
            idle[eid] = e
            index.add(e)
        elif kind == 2:  # a return: used again (a hit, or a miss after eviction)
            for p, pool in ((fast, idle), (ref, twins)):
                p.on_access(pool.get(eid) or CacheEntry(eid, eid, 0, 0, 0, 1, 100, 0, 0), t)
            if eid in idle:
                index.add(idle[eid])  # the hook may move it between segments
        elif kind == 3 and eid in idle:  # used: no longer a candidate
            del idle[eid]
            index.discard(eid)
        else:  # a decision, maybe excluding one candidate
            exclude = eid if amount % 2 else -1
            need = amount % 6000
            got = index.select(need, t, exclude)
            cands = [twins[i] for i in idle if i != exclude]
            want = ref.select_victims(cands, need, t) if cands else []
            assert [e.entry_id for e in got] == [e.entry_id for e in want]
            assert [fast.key(e, t)[0] for e in got] == [ref.key(e, t)[0] for e in want]
            for e in got:
                fast.on_evict(e, t)
                ref.on_evict(twins[e.entry_id], t)
                del idle[e.entry_id]
                index.discard(e.entry_id)
            num_decisions += bool(got)
        assert _state(fast) == _state(ref)
        assert len(index) == len(idle)
    return num_decisions


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(SET_INDEXED),
    steps=steps_strategy,
    fraction=st.sampled_from([0.0, 0.3, 0.8, 1.0]),
)
def test_set_index_evicts_what_prepare_and_the_full_sort_evicted(
    name: str, steps: list[Step], fraction: float
) -> None:
    drive(name, steps, fraction)


@pytest.mark.parametrize("name", SET_INDEXED)
def test_seeded_histories_decide_often_and_identically(name: str) -> None:
    """Uniform random histories (hypothesis favours short ones): ties inside the protected
    segment past its cut, and T1's cut, are reached many times."""
    num_decisions = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        num = int(rng.integers(20, 250))
        draws = rng.integers(0, [6, 41, 10**6, 10], (num, 4)).tolist()
        steps = [(k, e, a, 1 + s % 9) for k, e, a, s in draws]
        num_decisions += drive(name, steps, float(rng.choice([0.0, 0.3, 0.8, 1.0])))
    assert num_decisions > 2000


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(["slru", "arc", "tlru", "mru"]),
    pool=st.sampled_from([70, 100, 160]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=ops_strategy,
)
def test_session_manager_set_indexes_evict_what_the_full_path_evicted(
    policy: str, pool: int, cpu: int, offload: bool, watermark: float, ops: list[Op]
) -> None:
    assert_same(session_config(policy, pool, cpu, offload, watermark), ops, None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(SET_INDEXED),
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=ops_strategy,
    chains=prefix_trees(),
    fraction=st.sampled_from([0.0, 0.5, 0.8, 1.0]),
)
def test_prefix_set_tails_cut_what_the_forest_path_cut(
    policy: str,
    pool: int,
    cpu: int,
    offload: bool,
    watermark: float,
    ops: list[Op],
    chains: list[list[int]],
    fraction: float,
) -> None:
    extra = {"slru_protected_fraction": fraction} if policy == "slru" else {}
    assert_same(prefix_config(policy, pool, cpu, offload, watermark, **extra), ops, chains)


@pytest.mark.parametrize("name", SET_INDEXED)
def test_the_prefix_manager_uses_set_tails_over_the_forests_candidates(name: str) -> None:
    """The fast run decides through `SetTails`, and its candidates are the forest's blocks."""
    num_decisions = 0
    for seed in range(6):
        ops, chains = seeded_stream(seed)
        _, log, kv = run(prefix_config(name, 10, 6, seed % 2 == 0, 0.1), None, ops, chains)
        set_tails = kv.tails.set_tails
        assert set_tails is not None
        set_tails.drain()
        forest = kv.tree.forest()
        assert sorted(set_tails.index._lanes.where) == sorted(
            b.entry.entry_id for b in forest.blocks
        )
        assert sorted(set_tails.where) == sorted(kv.tree.evictable)
        num_decisions += len(log) > 0 and set_tails.num_visits > 0
    assert num_decisions >= 4


@pytest.mark.parametrize("name", ["slru", "arc", "tlru"])
def test_the_session_manager_uses_the_index(name: str) -> None:
    """The streams above compare something: the fast run's decisions go through the index."""
    ops = [((i * 5) % 9, (i * 7919) % 10**6, (i * 104729) % 10**6) for i in range(600)]
    _, log, kv = run(session_config(name, 90, 0, False, 0.1), None, ops, None)
    assert len(log) >= 3
    index = kv.candidates
    if name == "tlru":
        assert index._timed and index.num_visits >= len(log) and index.num_full == 0
    else:
        assert index._set is not None and index._set.num_visits >= len(log)


def _fill(name: str, size: int, same_time: int) -> tuple[Any, CandidateIndex]:
    """`size` idle entries, a third of them reused (protected / T2), `same_time` per last use."""
    policy = _policy(name)
    index = CandidateIndex(policy, lambda e, offload: e.restore_us)
    for i in range(size):
        e = CacheEntry(i, i, 0, 0, 0, 16, 100, 0, i // same_time, restore_us=1e5 * (i % 5))
        policy.on_release(e, e.last_used_us)
        if i % 3 == 0:
            policy.on_access(e, e.last_used_us)  # a hit: protected (SLRU), T2 (ARC)
        index.add(e, e.last_used_us)
    return policy, index


@pytest.mark.parametrize("name", ["slru", "arc", "tlru"])
@pytest.mark.parametrize("same_time", [1, 4])
def test_a_decision_visits_a_few_items_whatever_the_cache_size(name: str, same_time: int) -> None:
    """Complexity, counted: 100 one-victim decisions over 10^4 idle entries, each followed by a
    release, look at a few items each (the victim, the other segment's front, a tie group)."""
    size = 10_000
    policy, index = _fill(name, size, same_time)
    for k in range(100):
        t = size + k
        (victim,) = index.select(100, t, lambda e: e, -1, True if name == "tlru" else None)
        policy.on_evict(victim, t)
        index.discard(victim.entry_id)
        e = CacheEntry(size + k, size + k, 0, 0, 0, 16, 100, 0, t, restore_us=1e5)
        policy.on_release(e, t)
        index.add(e, t)
    assert len(index) == size
    visits = index._set.num_visits if index._set is not None else index.num_visits
    assert visits <= 100 * (2 + 2 * same_time)


def test_tlru_index_takes_the_entries_whose_restore_fits_first() -> None:
    index = _policy("tlru", tlru_threshold_ms=1.0).time_index()
    for eid, last_used, restore in ((1, 5, 2000.0), (2, 9, 1000.0), (3, 7, 10.0), (4, 1, 1e6)):
        index.add(CacheEntry(eid, eid, 0, 0, 0, 1, 1, 0, last_used), restore, -1.0)
    index.discard(3)
    assert [index.pop_min(0) for _ in range(4)] == [2, 4, 1, None]


@pytest.mark.parametrize("name", SET_INDEXED)
def test_a_chained_decision_visits_a_few_tails_whatever_the_tree_size(name: str) -> None:
    """Complexity, counted: cutting 200 blocks off 1,000 idle chains of 10 (a third of them
    reused) looks at a few tails per victim, and the segment cut is a binary search."""
    kv = make_kv(prefix_config(name, 10_100, 0, False, 0.0))
    tree, policy = kv.tree, kv.policy
    for c in range(1_000):
        parent = None
        for d in range(10):
            e = CacheEntry(c * 10 + d, c, 0, 0, 0, 512, kv.hash_bytes, 0, c * 10 + d)
            b = HashBlock(c * 10 + d, parent, e)
            kv.pool.allocate(kv.hash_bytes)
            tree.add(b)
            if parent is not None:
                tree.unpin(parent)
            parent = b
            if c % 3 == 0:
                policy.on_access(e, 0)  # a hit: protected (SLRU), T2 (ARC)
                tree.touch(b)
        tree.unpin(parent)
    assert kv._evict_blocks(200, allow_offload=False) == 200
    set_tails = kv.tails.set_tails
    assert set_tails.num_visits <= 200 * 4 + 4
    assert set_tails.index.num_visits <= 2 * 14  # two lanes' binary searches over <= 10^4
    assert kv._evict_blocks(1, allow_offload=False) == 1
    assert set_tails.num_visits <= 201 * 4 + 8


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(SET_INDEXED),
    uses=st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=40),
    fraction=st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0]),
    target_blocks=st.sampled_from([0.0, 1.0, 2.5, 7.0]),
)
def test_chain_cuts_give_every_candidate_the_segment_prepare_gives_it(
    name: str, uses: list[tuple[int, bool]], fraction: float, target_blocks: float
) -> None:
    """Equal sizes (prefix blocks): the binary-searched cut splits each lane where `prepare`
    does, boundary cases included (room or target an exact multiple of the block size)."""
    extra = {"slru_protected_fraction": fraction} if name == "slru" else {}
    policy = _policy(name, **extra)
    index = policy.set_index()
    entries = [CacheEntry(i, i, 0, 0, 0, 1, 64, 0, lu) for i, (lu, _) in enumerate(uses)]
    for e, (_, reused) in zip(entries, uses, strict=True):
        if reused:
            policy.on_access(e, 0)  # a hit: protected (SLRU), T2 (ARC)
        index.add(e)
    if name == "arc":
        policy.target_bytes = 64 * target_blocks
    cuts = index.chain_cuts()
    policy.prepare(entries, 0)
    for e in entries:
        lane, item = index.lane_item(e.entry_id)
        cut, before, after = cuts[lane]
        seg = before if cut is None or item < cut else after
        assert seg == policy.key(e, 0)[0], (e.entry_id, cuts)
