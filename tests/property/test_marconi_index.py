"""Marconi's exact index (`policies/marconi_index.py`) chooses what the full sort chose.

The index is driven by random histories next to a copy of the policy that takes the full path
(`prepare` over the candidates but the excluded one, then sorted by key), with many equal last
uses, equal FLOPs per byte, zero spans and last uses large enough that normalised recencies round
together: same victims in the same order, same keys, same ranges on the policy after. Both KV
managers are then run on random streams against the forced full path (`test_indexed_eviction.py`'s
harness), with and without a CPU tier, and the operation counts show a decision opens a few nodes
per victim, not n entries.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.kv.set_tails import KeyedTails
from cachepilot_sim.components.kv.tails import TailIndex
from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, KeyScope, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.marconi_index import MarconiIndex
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

Step = tuple[int, int, int, int, int]
steps_strategy = st.lists(
    st.tuples(
        st.integers(0, 5),  # kind
        st.integers(0, 40),  # entry
        st.integers(0, 6),  # last use step (few values: ties)
        st.integers(0, 4),  # recompute step (few values: ties)
        st.integers(0, 10**6),  # decision amount / size
    ),
    min_size=10,
    max_size=200,
)
WEIGHTS = [0.0, 0.5, 1.0, 3.0, 1e9]
# Last uses: small, or offset by 2^53 - 2^10 and spread by 1 (1/span ~ 2^-3, sums that round).
LAST_USE = [(0, 1000), (2**53 - 2**10, 1)]


def _policy(**overrides: Any) -> Any:
    return make_policy(policy_config("marconi", **overrides), GapEstimator(0.3, 1e6, 1e6))


def _entry(eid: int, lu_step: int, rc_step: int, size: int, scale: tuple[int, int]) -> CacheEntry:
    base, step = scale
    e = CacheEntry(eid, eid, 0, 0, 0, size, size * 100, 0, base + lu_step * step)
    e.recompute_us = [0.0, 1.0, 3.0, 1e3, 7e3][rc_step] * size * (1 + eid % 2)
    return e


def drive(steps: list[Step], weight: float, scale: tuple[int, int]) -> int:
    """Replay `steps` on the index and on a full-path twin; returns the decisions that evicted."""
    fast, ref = _policy(flop_weight=weight), _policy(flop_weight=weight)
    index = fast.set_index()
    idle: dict[int, CacheEntry] = {}
    twins: dict[int, CacheEntry] = {}
    num_decisions = 0
    for kind, eid, lu_step, rc_step, amount in steps:
        if kind <= 1:  # goes idle (or again, with a new last use and size)
            e = _entry(eid, lu_step, rc_step, 1 + amount % 9, scale)
            idle[eid], twins[eid] = e, copy.copy(e)
            index.add(e)
        elif kind == 2 and eid in idle:  # used: no longer a candidate
            del idle[eid], twins[eid]
            index.discard(eid)
        elif kind >= 3:  # a decision, maybe excluding one candidate
            exclude = eid if amount % 2 else -1
            need = amount % 3000 if kind == 3 else amount % 300
            got = index.select(need, 0, exclude)
            cands = [twins[i] for i in idle if i != exclude]
            want = ref.select_victims(cands, need, 0) if cands else []
            assert [e.entry_id for e in got] == [e.entry_id for e in want]
            assert (fast.recency_range, fast.flops_range) == (ref.recency_range, ref.flops_range)
            assert [fast.key(e, 0) for e in got] == [ref.key(e, 0) for e in want]
            for e in got:
                del idle[e.entry_id], twins[e.entry_id]
                index.discard(e.entry_id)
            num_decisions += bool(got)
        assert len(index) == len(idle)
    return num_decisions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps_strategy, weight=st.sampled_from(WEIGHTS), scale=st.sampled_from(LAST_USE))
def test_index_evicts_what_prepare_and_the_full_sort_evicted(
    steps: list[Step], weight: float, scale: tuple[int, int]
) -> None:
    drive(steps, weight, scale)


def test_seeded_histories_decide_often_and_identically() -> None:
    """Uniform random histories (hypothesis favours short ones) reach many multi-victim
    decisions over tied keys."""
    num_decisions = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        num = int(rng.integers(50, 250))
        draws = rng.integers(0, [6, 41, 7, 5, 10**6], (num, 5)).tolist()
        scale = LAST_USE[seed % 2]
        num_decisions += drive([tuple(d) for d in draws], WEIGHTS[seed % 5], scale)
    assert num_decisions > 600


def test_ties_go_to_the_smaller_id_and_zero_spans_score_zero() -> None:
    """Equal (last use, FLOPs) keys fall back on ids; one candidate left has both spans 0."""
    policy = _policy()
    index = policy.set_index()
    for eid in (7, 3, 5):
        index.add(_entry(eid, 2, 2, 1 + eid % 2, (0, 10)))
    index.add(_entry(9, 0, 4, 2, (0, 10)))  # the oldest, but the most work per byte
    assert [e.entry_id for e in index.select(10**6, 0, -1)] == [3, 5, 7, 9]
    for eid in (3, 5, 7, 9):
        index.discard(eid)
    index.add(_entry(4, 6, 0, 1, (0, 10)))
    (only,) = index.select(1, 0, -1)
    assert only.entry_id == 4 and policy.key(only, 0) == (0.0, 4)
    assert policy.recency_range == (60.0, 0.0) and policy.flops_range == (0.0, 0.0)


def drive_chains(steps: list[Step], weight: float) -> int:
    """Replay `steps` on a prefix tree whose tails a `TailIndex` keeps; at each decision the
    forest path (a full-path twin policy over `tree.forest()`) is asked first; the victims are
    then evicted as the manager evicts them. Returns the blocks cut."""
    fast, ref = _policy(flop_weight=weight), _policy(flop_weight=weight)
    tree = PrefixTree()
    tails = TailIndex(tree, fast)
    assert isinstance(tails.set_tails, KeyedTails)
    num_cut = 0
    for t, (kind, pick, lu_step, rc_step, amount) in enumerate(steps):
        gpu = sorted(tree.blocks)
        if kind <= 2 or not gpu:  # a request computes a new block under a cached one (or a root)
            parent = tree.blocks[gpu[pick % len(gpu)]] if gpu and pick % 4 else None
            e = _entry(len(tree.blocks) + 1000 * t, lu_step, rc_step, 1, (0, 10))
            e.num_bytes = 100
            b = HashBlock(e.entry_id, parent, e)
            path = [] if parent is None else [parent]
            while path and path[-1].parent is not None:
                path.append(path[-1].parent)
            for x in path:
                tree.pin(x)
            tree.add(b)
            for x in (b, *path):  # used now: the request ends
                x.entry.last_used_us = max(x.entry.last_used_us, e.last_used_us)
                tree.unpin(x)
        elif kind == 3:  # a decision over the idle forest
            forest = tree.forest()
            want = ref.select_victims(
                [b.entry for b in forest.blocks],
                (1 + amount % 6) * 100,
                t,
                forest.chains,
                forest.parents,
            )
            want_cut = forest.cut_order(want, "marconi")
            got = tails.select(1 + amount % 6, t, lambda b: b.entry)
            assert [b.hash_id for b in got] == [b.hash_id for b in want_cut]
            assert (fast.recency_range, fast.flops_range) == (ref.recency_range, ref.flops_range)
            for b in got:
                tree.remove_gpu(b)
                tree.expose_parent(b)
            num_cut += len(got)
    return num_cut


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps_strategy, weight=st.sampled_from(WEIGHTS))
def test_keyed_tails_cut_what_the_forest_path_cut(steps: list[Step], weight: float) -> None:
    drive_chains(steps, weight)


def test_seeded_chain_histories_cut_often_and_identically() -> None:
    num_cut = 0
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        draws = rng.integers(0, [5, 10**6, 7, 5, 10**6], (int(rng.integers(50, 200)), 5))
        num_cut += drive_chains([tuple(d) for d in draws.tolist()], WEIGHTS[seed % 5])
    assert num_cut > 500


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([70, 100, 160]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    weight=st.sampled_from([0.0, 1.0, 4.0]),
    ops=ops_strategy,
)
def test_session_manager_index_evicts_what_the_full_path_evicted(
    pool: int, cpu: int, offload: bool, watermark: float, weight: float, ops: list[Op]
) -> None:
    cfg = session_config("marconi", pool, cpu, offload, watermark, flop_weight=weight)
    assert_same(cfg, ops, None)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    weight=st.sampled_from([0.0, 1.0, 4.0]),
    ops=ops_strategy,
    chains=prefix_trees(),
)
def test_prefix_keyed_tails_cut_what_the_forest_path_cut(
    pool: int,
    cpu: int,
    offload: bool,
    watermark: float,
    weight: float,
    ops: list[Op],
    chains: list[list[int]],
) -> None:
    cfg = prefix_config("marconi", pool, cpu, offload, watermark, flop_weight=weight)
    assert_same(cfg, ops, chains)


@pytest.mark.parametrize("weight", [0.0, 1.0, 1e300])
def test_a_slope_that_overflows_or_vanishes_keeps_the_full_sorts_order(weight: float) -> None:
    """FLOPs per byte a denormal apart, last uses 10^12 apart: w x spanL / spanF overflows (or
    is 0); the index falls back on the corner bound and still sorts as the full path."""
    fast, ref = _policy(flop_weight=weight), _policy(flop_weight=weight)
    index = fast.set_index()
    specs = [(0, 5e-324, 10**12), (1, 0.0, 0), (2, 5e-324, 3), (3, 0.0, 10**12), (4, 1e-323, 7)]
    entries = []
    for _, rc, lu in specs * 8:
        e = CacheEntry(len(entries), 0, 0, 0, 0, 1, 1, 0, lu, recompute_us=rc)
        entries.append(e)
        index.add(e)
    got = index.select(10**6, 0, 3)
    want = ref.select_victims([e for e in entries if e.entry_id != 3], 10**6, 0)
    assert [e.entry_id for e in got] == [e.entry_id for e in want]
    assert len(got) == len(entries) - 1


def test_both_managers_decide_through_the_index() -> None:
    """The streams above compare something: the fast runs decide through the index, and the
    prefix index's candidates are the forest's blocks, its tails the tree's."""
    ops = [((i * 5) % 9, (i * 7919) % 10**6, (i * 104729) % 10**6) for i in range(600)]
    _, log, kv = run(session_config("marconi", 90, 0, False, 0.1), None, ops, None)
    assert len(log) >= 3 and isinstance(kv.candidates._set, MarconiIndex)
    assert kv.candidates._set.num_visits >= len(log)
    num_decisions = 0
    for seed in range(6):
        ops, chains = seeded_stream(seed)
        cfg = prefix_config("marconi", 10, 6, seed % 2 == 0, 0.1)
        assert_same(cfg, ops, chains)
        _, log, kv = run(cfg, None, ops, chains)
        tails = kv.tails.set_tails
        assert isinstance(tails, KeyedTails)
        tails.drain()
        forest = kv.tree.forest()
        index = tails.index
        assert sorted(index._ranges.values) == sorted(b.entry.entry_id for b in forest.blocks)
        assert sorted(index._tree.where) == sorted(
            b.entry.entry_id for b in kv.tree.evictable.values()
        )
        num_decisions += len(log) > 0 and tails.num_visits > 0
    assert num_decisions >= 4


def _random_entry(rng: np.random.Generator, eid: int, last_used: int) -> CacheEntry:
    tokens = int(rng.integers(256, 32_768))
    e = CacheEntry(eid, eid, 0, 0, 0, tokens, tokens * 131_072, 0, last_used)
    e.recompute_us = 20.0 * tokens + 1e-4 * tokens * tokens
    return e


def test_a_decision_opens_a_few_nodes_whatever_the_cache_size() -> None:
    """Complexity, counted: 500 one-victim decisions over 10^4 idle entries (last uses and FLOPs
    per byte independent, inserted in random order), each followed by a release, pop a few dozen
    heap items each, not 10^4, and no more late than early: the frontier of the keys already
    evicted (whose k-d cells have corners below it) is not reopened at every decision."""
    rng = np.random.default_rng(5)
    size = 10_000
    policy = _policy()
    index = CandidateIndex(policy)
    for i in range(size):
        index.add(_random_entry(rng, i, int(rng.integers(0, 10**9))), 0)
    s = index._set
    assert isinstance(s, MarconiIndex)
    visits = []
    for k in range(500):
        t = 10**9 + k
        before = s.num_visits
        (victim,) = index.select(1, t, lambda e: e)
        visits.append(s.num_visits - before)
        index.discard(victim.entry_id)
        index.add(_random_entry(rng, size + k, t), t)
    assert len(index) == size
    assert sum(visits) <= 500 * 30
    assert sum(visits[-100:]) <= 100 * 30


def test_a_chained_decision_opens_a_few_nodes_whatever_the_tree_size() -> None:
    """Complexity, counted: cutting 200 blocks off 1,000 idle chains of 10 pops a few dozen
    heap items per victim; the forest path would rank all 10^4 blocks."""
    kv = make_kv(prefix_config("marconi", 10_100, 0, False, 0.0))
    tree = kv.tree
    rng = np.random.default_rng(3)
    for c in range(1_000):
        parent = None
        for d in range(10):
            e = CacheEntry(c * 10 + d, c, 0, 0, 0, 512, kv.hash_bytes, 0, int(rng.integers(10**9)))
            e.recompute_us = 1e3 * (1 + d) * float(rng.random())
            b = HashBlock(c * 10 + d, parent, e)
            kv.pool.allocate(kv.hash_bytes)
            tree.add(b)
            if parent is not None:
                tree.unpin(parent)
            parent = b
        tree.unpin(parent)
    assert kv._evict_blocks(200, allow_offload=False) == 200
    tails = kv.tails.set_tails
    assert isinstance(tails, KeyedTails)
    assert 200 <= tails.num_visits <= 200 * 40


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_exposed_parents_join_the_decision_in_key_order(weight: float) -> None:
    """Three blocks in one chain, the root oldest: cutting the tail exposes the middle block,
    which goes next only when its key is the smallest among the tails (the other chain's)."""
    kv = make_kv(prefix_config("marconi", 100, 0, False, 0.0, flop_weight=weight))
    tree = kv.tree
    specs = [(0, None, 1, 9e3), (1, 0, 2, 1e3), (2, 1, 50, 1e3), (3, None, 60, 3e3)]
    blocks: dict[int, HashBlock] = {}
    for h, up, lu, rc in specs:
        e = CacheEntry(h, h, 0, 0, 0, 512, kv.hash_bytes, 0, lu, recompute_us=rc)
        b = blocks[h] = HashBlock(h, blocks.get(up) if up is not None else None, e)
        kv.pool.allocate(kv.hash_bytes)
        tree.add(b)
    for h in (2, 1, 0, 3):
        tree.unpin(blocks[h])
    cut = kv.tails.select(3, 100, lambda b: b.entry, False)
    # Ranges over all four: last use 1..60, recompute 1e3..9e3 per block. Weight 0: recency only,
    # 2 (0.83) before 3 (1), then 1 (0.02) and 0 (0); weight 2: 3 (1 + 2 x 0.25) before 0 (2 x 1).
    assert [b.hash_id for b in cut] == ([2, 1, 0] if weight == 0.0 else [2, 1, 3])


def _a_held_block(full: bool) -> tuple[list[tuple[int, int]], int]:
    """Chain 0 -> 1, roots 3 and 4, all idle; then 1 is held on the GPU for a shared tier's write
    (pinned, still its parent's GPU child): 0 is idle but not in the forest, so the forest path's
    ranges leave it out. With 0 (the oldest, the most FLOPs per byte) block 4 would rank first;
    without it 3 and 4 tie and 3 goes. Returns the evictions and the forest decisions."""
    cfg = prefix_config("marconi", 100, 0, False, 0.0)
    policy = Logged(make_policy(cfg.policy, GapEstimator(0.3, 1e6, 1e6)), KeyScope.SET, full)
    kv = make_kv(cfg, policy=policy)
    tree = kv.tree
    specs = ((0, None, 0, 9e3), (1, 0, 30, 1e3), (3, None, 10, 6e3), (4, None, 20, 1e3))
    for h, parent, lu, rc in specs:
        e = CacheEntry(h, h, 0, 0, 0, 512, kv.hash_bytes, 0, lu, recompute_us=rc)
        kv.pool.allocate(kv.hash_bytes)
        tree.add(HashBlock(h, None if parent is None else tree.blocks[parent], e))
    for h in (1, 0, 3, 4):
        tree.unpin(tree.blocks[h])
    held = tree.blocks[1]
    tree.pin(held)  # cut, and held for its write (as `remote.py` does)
    held.tier = Tier.FLIGHT_OUT
    assert kv._evict_blocks(1, allow_offload=False) == 1
    tails = kv.tails.set_tails
    return policy.log, 0 if tails is None else tails.num_full


def test_a_block_held_for_a_shared_tiers_write_sends_decisions_to_the_forest() -> None:
    assert _a_held_block(full=True)[0] == [(0, 3)]
    assert _a_held_block(full=False) == ([(0, 3)], 1)
