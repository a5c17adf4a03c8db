"""S3-FIFO's lazy index (`policies/s3fifo_index.py`) evicts what its full path evicted.

The full path is `S3FifoPolicy.prepare` (the loop on copies of the queues over every candidate),
the sort by key and `on_evict`'s replay of the loop's moves. The index runs the same loop on the
live queues only as far as the decision's victims reach. Checked three ways: the index alone
against a full-path twin on random hook histories (same victims, same keys, same queues, ghost
and byte sums after every step, in-use and excluded entries included); both KV managers on random
operation streams, once forced onto the full path (with and without a CPU tier); and operation
counts: a decision takes the loop's steps up to its last victim, not one per cached entry.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.kv.forest import HashBlock
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, KeyScope, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.reuse import GapEstimator
from tests.conftest import make_kv
from tests.property.test_indexed_eviction import (
    Logged,
    Op,
    assert_same,
    ops_strategy,
    prefix_config,
    prefix_trees,
    run,
    seeded_stream,
    session_config,
)

# The paper's defaults, a promotion threshold that leaves hit entries in S, a large S.
KNOBS = [
    {},
    {"s3fifo_move_to_main_threshold": 2},
    {"s3fifo_small_fraction": 0.5, "s3fifo_move_to_main_threshold": 3},
]
Step = tuple[int, int, int, int]
steps_strategy = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 30), st.integers(0, 10**6), st.integers(1, 9)),
    min_size=10,
    max_size=200,
)


def _policy(**knobs: Any) -> Any:
    return make_policy(policy_config("s3fifo", **knobs), GapEstimator(0.3, 1e6, 1e6))


def _state(p: Any) -> tuple[Any, ...]:
    """Everything a later decision or hook of S3-FIFO reads."""
    return (
        list(p.small.items()),
        list(p.main.items()),
        list(p.ghost.items()),
        dict(p.size),
        list(p.queue_bytes),
        p.ghost_bytes,
        p.capacity_bytes,
        list(p.evicted_from),
    )


def drive(steps: list[Step], knobs: dict[str, Any]) -> int:
    """Replay `steps` (kind, entry, amount, size) on an index and on a full-path twin; returns
    the number of decisions that evicted something."""
    fast, ref = _policy(**knobs), _policy(**knobs)
    index = fast.set_index()
    known: dict[int, tuple[CacheEntry, CacheEntry]] = {}  # entry id -> (fast's, ref's)
    idle: dict[int, None] = {}
    num_decisions = 0
    for t, (kind, eid, amount, size) in enumerate(steps):
        if kind <= 1:  # a turn ends: the entry (maybe grown) goes idle
            pair = known.setdefault(eid, (CacheEntry(eid, eid, 0, 0, 0, 1, 0, t, t),) * 2)
            if pair[0] is pair[1]:
                pair = known[eid] = (pair[0], copy.copy(pair[0]))
            for e, p in zip(pair, (fast, ref), strict=True):
                e.num_bytes, e.last_used_us = e.num_bytes + size * 100, t
                p.on_release(e, t)
            idle[eid] = None
            index.add(pair[0])
        elif kind == 2 and eid in known:  # returns: a hit, or a miss after eviction, then hits
            for e, p in zip(known[eid], (fast, ref), strict=True):
                for _ in range(1 + amount % 5):  # M's counter is capped on reinsertion
                    p.on_access(e, t)
            if eid in idle:
                index.add(known[eid][0])
        elif kind == 3 and eid in idle:  # in use: no longer a candidate
            del idle[eid]
            index.discard(eid)
        elif kind == 4 and eid in known and eid not in idle:  # reloaded: idle without a hook
            idle[eid] = None  # (in no queue when it was evicted after its return's access)
            index.add(known[eid][0])
        elif kind >= 5:  # a decision, maybe excluding one candidate (the entry being admitted)
            exclude = eid if amount % 2 else -1
            need = amount % 3000
            got = index.select(need, t, exclude)
            cands = [known[i][1] for i in idle if i != exclude]
            want = ref.select_victims(cands, need, t) if cands else []
            assert [e.entry_id for e in got] == [e.entry_id for e in want]
            assert [fast.key(e, t) for e in got] == [ref.key(e, t) for e in want]
            for e in got:
                fast.on_evict(e, t)
                ref.on_evict(known[e.entry_id][1], t)
                del idle[e.entry_id]
                index.discard(e.entry_id)
            num_decisions += bool(got)
        assert _state(fast) == _state(ref)
        assert len(index) == len(idle)
        assert fast.marks.in_main == sum(1 for i in idle if i in fast.main)
    return num_decisions


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps_strategy, knobs=st.sampled_from(KNOBS))
def test_index_evicts_what_prepare_and_the_sort_evicted(
    steps: list[Step], knobs: dict[str, Any]
) -> None:
    drive(steps, knobs)


def test_seeded_histories_decide_often_and_identically() -> None:
    """Uniform random histories (hypothesis favours short ones) reach many decisions that pass
    in-use and excluded entries, promote, reinsert and run out of candidates."""
    import numpy as np

    num_decisions = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, [8, 31, 10**6, 10], (int(rng.integers(50, 300)), 4)).tolist()
        steps = [(k, e, a, 1 + s % 9) for k, e, a, s in draws]
        num_decisions += drive(steps, KNOBS[seed % len(KNOBS)])
    assert num_decisions > 1500


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    knobs=st.sampled_from(KNOBS),
    pool=st.sampled_from([70, 100, 160]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=ops_strategy,
)
def test_session_manager_index_evicts_what_the_full_path_evicted(
    knobs: dict[str, Any], pool: int, cpu: int, offload: bool, watermark: float, ops: list[Op]
) -> None:
    assert_same(session_config("s3fifo", pool, cpu, offload, watermark, **knobs), ops, None)


@SETTINGS
@given(
    knobs=st.sampled_from(KNOBS),
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=ops_strategy,
    chains=prefix_trees(),
)
def test_prefix_manager_index_cuts_what_the_forest_path_cut(
    knobs: dict[str, Any],
    pool: int,
    cpu: int,
    offload: bool,
    watermark: float,
    ops: list[Op],
    chains: list[list[int]],
) -> None:
    assert_same(prefix_config("s3fifo", pool, cpu, offload, watermark, **knobs), ops, chains)


@pytest.mark.parametrize("knobs", KNOBS)
def test_seeded_streams_use_the_index_and_evict_identically(knobs: dict[str, Any]) -> None:
    """Long streams that surely evict, on both managers: the fast run decides through the index
    (its candidates are the manager's), and the full-path run evicts the same."""
    for seed in range(3):
        ops, chains = seeded_stream(seed)
        for offload in (False, True):
            cfg = session_config("s3fifo", 90, 40, offload, 0.1, **knobs)
            _, log, kv = run(cfg, None, ops, None)
            index = kv.candidates._set
            assert len(log) >= 3 and index is not None and index.num_visits >= len(log)
            assert sorted(index.entries) == sorted(kv.idle)
            assert_same(cfg, ops, None)
            cfg = prefix_config("s3fifo", 10, 6, offload, 0.1, **knobs)
            _, log, kv = run(cfg, None, ops, chains)
            tails = kv.tails.set_tails
            assert len(log) >= 3 and tails is not None and tails.num_visits >= 1
            tails.drain()
            forest = kv.tree.forest()
            assert sorted(tails.blocks) == sorted(b.entry.entry_id for b in forest.blocks)
            assert_same(cfg, ops, chains)


def _fill(size: int, reused_every: int) -> tuple[Any, CandidateIndex]:
    """`size` idle entries entered in order; every `reused_every`-th one hit once."""
    policy = _policy()
    index = CandidateIndex(policy)
    for i in range(size):
        e = CacheEntry(i, i, 0, 0, 0, 16, 100, i, i)
        policy.on_release(e, i)
        if i % reused_every == 0:
            policy.on_access(e, i)  # promoted to M when the loop reaches it
        index.add(e, i)
    return policy, index


@pytest.mark.parametrize("size", [1_000, 10_000])
def test_a_decision_takes_the_loops_steps_not_the_cache_size(size: int) -> None:
    """Complexity, counted: 300 one-victim decisions, each followed by a release (steady state),
    take the loop's steps up to their victims (the victim and the promotions on the way: the
    victims are the first 300 entries not hit, 150 hit ones go to M), whatever the cache size."""
    policy, index = _fill(size, 3)
    for k in range(300):
        t = size + k
        (victim,) = index.select(100, t, lambda e: e)
        assert len(policy.plan) <= 1  # the moves: a hit entry in front of the victim
        policy.on_evict(victim, t)
        index.discard(victim.entry_id)
        e = CacheEntry(t, t, 0, 0, 0, 16, 100, t, t)
        policy.on_release(e, t)
        index.add(e, t)
    assert len(index) == size
    assert policy.evicted_from == [300, 0]
    assert index._set.num_visits == 300 + 150  # type: ignore[union-attr]


def test_a_chained_decision_takes_a_chains_blocks_not_the_trees() -> None:
    """Complexity, counted: 1,000 idle chains of 10 blocks, released root first (S holds roots
    before tails): cutting 200 blocks takes 20 tails from the loop, each after one skipped run
    (the blocks above it: ranked, not yielded), and their 180 parents as the cuts expose them."""
    kv = make_kv(prefix_config("s3fifo", 10_100, 0, False, 0.0))
    tree, policy = kv.tree, kv.policy
    for c in range(1_000):
        parent = None
        for d in range(10):
            e = CacheEntry(c * 10 + d, c, 0, 0, 0, 512, kv.hash_bytes, 0, c)
            b = HashBlock(c * 10 + d, parent, e)
            kv.pool.allocate(kv.hash_bytes)
            tree.add(b)
            parent = b
        for d in range(10):
            b = tree.blocks[c * 10 + d]
            tree.unpin(b)
            policy.on_release(b.entry, c)
    assert kv._evict_blocks(200, allow_offload=False) == 200
    tails = kv.tails.set_tails
    assert tails.num_visits == 20
    assert tails.index.num_visits == 20  # one step per chain: the run above its tail, the tail
    assert sorted(tree.blocks) == list(range(200, 10_000))
    assert kv._evict_blocks(1, allow_offload=False) == 1
    assert tails.num_visits == 21 and tails.index.num_visits == 21
    assert sorted(tree.blocks) == list(range(200, 209)) + list(range(210, 10_000))


def _parent_ranked_after_its_child(full: bool) -> list[tuple[int, int]]:
    """Chain 0 -> 1 and a root 2, released in that order; 0 and 2 hit (promoted to M when the
    loop passes them), so the loop ranks 1, then 0, then 2: cutting 1 exposes 0 before its rank."""
    cfg = prefix_config("s3fifo", 100, 0, False, 0.0)
    inner = make_policy(cfg.policy, GapEstimator(0.3, 1e6, 1e6))
    policy = Logged(inner, KeyScope.SET, full=full)
    kv = make_kv(cfg, policy=policy)
    tree = kv.tree
    for h, parent in ((0, None), (1, 0), (2, None)):
        b = HashBlock(
            h,
            None if parent is None else tree.blocks[parent],
            CacheEntry(h, h, *[0] * 3, 512, kv.hash_bytes, 0, 0),
        )
        kv.pool.allocate(kv.hash_bytes)
        tree.add(b)
    for h in (0, 1, 2):
        tree.unpin(tree.blocks[h])
        policy.on_release(tree.blocks[h].entry, 0)
    for h in (0, 2):
        policy.on_access(tree.blocks[h].entry, 1)
        tree.touch(tree.blocks[h])
    assert kv._evict_blocks(3, allow_offload=False) == 3
    return policy.log


def test_a_parent_exposed_before_the_loop_ranks_it_is_cut_at_its_rank() -> None:
    assert _parent_ranked_after_its_child(full=True) == [(0, 1), (0, 0), (0, 2)]
    assert _parent_ranked_after_its_child(full=False) == [(0, 1), (0, 0), (0, 2)]


def test_the_loop_caps_ms_counter_when_it_reinserts() -> None:
    """M = [a with 4 hits, b with 3]: reinsertion caps a counter at 3 before decrementing it, so
    a reaches 0 first (4 -> 2 -> 1 -> 0 against 3 -> 2 -> 1 -> 0) and leaves before b."""
    fast, ref = _policy(), _policy()
    index = fast.set_index()
    a, b, v = (CacheEntry(i, i, 0, 0, 0, 1, 100, 0, 0) for i in range(3))
    for p in (fast, ref):
        for e in (a, b, v):
            p.on_release(e, 0)
        for e in (a, b):
            p.on_access(e, 1)  # one hit: promoted when the loop passes them
    for e in (a, b, v):
        index.add(e)
    assert [e.entry_id for e in index.select(100, 2, -1)] == [2]
    assert [e.entry_id for e in ref.select_victims([a, b, v], 100, 2)] == [2]
    for p in (fast, ref):
        p.on_evict(v, 2)
        for e, hits in ((a, 4), (b, 3)):
            for _ in range(hits):
                p.on_access(e, 3)
    index.discard(2)
    assert list(fast.main.items()) == [(0, 4), (1, 3)]
    assert [e.entry_id for e in ref.select_victims([a, b], 200, 4)] == [0, 1]
    assert [e.entry_id for e in index.select(200, 4, -1)] == [0, 1]


def _child_in_m_cut_before_the_loop_reaches_its_parent(full: bool) -> list[tuple[int, int]]:
    """Chain 0 -> 1, roots 2 (hit) and 3. 1 is cut while 0 is in use and comes back to M (G
    remembers it). The next loop passes 0 (not a tail), promotes 2, which puts M over its share,
    and ranks 1 in M: 1 is cut. The last decision cuts 0 (a tail again) and 3."""
    cfg = prefix_config("s3fifo", 100, 0, False, 0.0, s3fifo_small_fraction=0.6)
    inner = make_policy(cfg.policy, GapEstimator(0.3, 1e6, 1e6))
    policy = Logged(inner, KeyScope.SET, full=full)
    kv = make_kv(cfg, policy=policy)
    tree = kv.tree
    entries = [CacheEntry(h, h, 0, 0, 0, 512, kv.hash_bytes, 0, 0) for h in range(4)]

    def cache(h: int, parent: int | None) -> None:  # a request computes h, holding its prefix
        up = None if parent is None else tree.blocks[parent]
        if up is not None:
            tree.pin(up)
        kv.pool.allocate(kv.hash_bytes)
        tree.add(HashBlock(h, up, entries[h]))
        if up is not None:
            tree.unpin(up)
        tree.unpin(tree.blocks[h])
        policy.on_release(entries[h], 0)

    for h, parent in ((0, None), (1, 0), (2, None), (3, None)):
        cache(h, parent)
    policy.on_access(entries[2], 0)
    tree.pin(tree.blocks[0])  # in use while 1 is cut
    assert kv._evict_blocks(1, allow_offload=False) == 1
    tree.unpin(tree.blocks[0])
    policy.on_access(entries[1], 0)  # G remembers it: to M
    cache(1, 0)
    assert kv._evict_blocks(1, allow_offload=False) == 1
    assert kv._evict_blocks(2, allow_offload=False) == 2
    return policy.log


def test_a_promotion_that_puts_m_over_its_share_turns_the_loop_to_m() -> None:
    want = [(0, 1), (0, 1), (0, 0), (0, 3)]
    assert _child_in_m_cut_before_the_loop_reaches_its_parent(full=True) == want
    assert _child_in_m_cut_before_the_loop_reaches_its_parent(full=False) == want


def test_a_block_exposed_ahead_of_the_loop_in_s_is_ranked_where_prepare_ranks_it() -> None:
    """S = [0], M = [1, 2] over its share: the loop ranks 1, 0, 2. A cut of 1 exposes 0 (not a
    tail before) while the loop has not reached it: `expose` makes the loop stop there."""
    policy = _policy(s3fifo_small_fraction=0.6)
    entries = [CacheEntry(i, i, 0, 0, 0, 1, 100, 0, 0) for i in range(4)]
    for e in entries:
        policy.on_release(e, 0)
    for e in entries[1:3]:
        policy.on_access(e, 0)
    policy.prepare(entries[3:], 0)  # 0 in use: 1 and 2 promoted, 3 evicted
    policy.on_evict(entries[3], 0)
    assert (list(policy.small), list(policy.main)) == ([0], [1, 2])
    index = policy.set_index()
    for e in entries[:3]:
        index.add(e, tail=e.entry_id > 0)
    ranking = index.ranks()
    assert next(ranking) == 1
    ranking.expose(0)
    assert [next(ranking), next(ranking)] == [0, 2]
    ranking.close()
    policy.prepare(entries[:3], 0)
    assert sorted(policy.rank, key=policy.rank.__getitem__) == [1, 0, 2]


def _a_held_block(full: bool) -> tuple[list[tuple[int, int]], int]:
    """Chain 0 -> 1, roots 3, 4, 5; 0, 3, 4 hit. A cut of 5 (1 in use) promotes 0, 3, 4 to M.
    Then 1 is held on the GPU for a shared tier's write (pinned, its parent's GPU child): 0 is
    idle but not in the forest, so the loop moves it round M before ranking 3; once the write
    lands and 1 goes, M is [4, 0] and 4 is cut next. Returns the evictions and forest decisions."""
    cfg = prefix_config("s3fifo", 100, 0, False, 0.0)
    inner = make_policy(cfg.policy, GapEstimator(0.3, 1e6, 1e6))
    policy = Logged(inner, KeyScope.SET, full=full)
    kv = make_kv(cfg, policy=policy)
    tree = kv.tree
    entries = [CacheEntry(h, h, 0, 0, 0, 512, kv.hash_bytes, 0, 0) for h in range(6)]
    for h, parent in ((0, None), (1, 0), (3, None), (4, None), (5, None)):
        kv.pool.allocate(kv.hash_bytes)
        tree.add(HashBlock(h, None if parent is None else tree.blocks[parent], entries[h]))
    for h in (0, 1, 3, 4, 5):
        tree.unpin(tree.blocks[h])
        policy.on_release(entries[h], 0)
    for h in (0, 3, 4):
        policy.on_access(entries[h], 0)
    held = tree.blocks[1]
    tree.pin(held)  # in use
    assert kv._evict_blocks(1, allow_offload=False) == 1  # 5
    tree.unpin(held)
    policy.on_evict(entries[1], 0)  # cut, and held for its write (as `remote.py` does)
    tree.pin(held)
    held.tier = Tier.FLIGHT_OUT
    assert kv._evict_blocks(1, allow_offload=False) == 1  # 3
    held.tier = Tier.GPU  # the write landed: an idle tail for a moment, then dropped
    tree.unpin(held)
    tree.remove_gpu(held)
    kv.pool.release(kv.hash_bytes)
    tree.expose_parent(held)
    assert kv._evict_blocks(1, allow_offload=False) == 1
    tails = kv.tails.set_tails
    return policy.log, 0 if tails is None else tails.num_full


def test_a_block_held_for_a_shared_tiers_write_sends_decisions_to_the_forest() -> None:
    want = [(0, 5), (0, 1), (0, 3), (0, 4)]
    assert _a_held_block(full=True)[0] == want
    assert _a_held_block(full=False) == (want, 1)
