"""T-LRU on prefix chains: the suffix-tail index (`components/kv/suffix_tails.py`) cuts exactly what
the forest path (`TailLruPolicy.select_victims` over the candidate forest) cut.

The prefix manager runs random operation streams twice, once forced onto the forest path, with and
without a CPU tier (whose residency below δ makes the restore estimate move with idle time: the
fresh-index decisions), at thresholds that split single blocks and multi-block suffixes. Random
trees with decimal restores (whose float sums depend on their order) and thresholds on partial
sums are cut by both paths on the same tree, decision after decision, with blocks added, reused
and cut between. The operation count shows a decision pops its victims, not every idle block.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.kv.tails import TailIndex
from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, make_policy
from cachepilot_sim.policies.reuse import GapEstimator
from tests.conftest import make_kv
from tests.property.test_indexed_eviction import (
    Op,
    assert_same,
    long_seeded_stream,
    ops_strategy,
    prefix_config,
    prefix_trees,
    run,
)

# Block restores here are 10-23 ms recomputed, 169 µs reloaded: thresholds that split one block,
# a few blocks' suffix and a chain's, reloaded and recomputed.
THRESHOLDS_MS = [0.3, 15.0, 30.0, 60.0, 200.0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 2, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    threshold_ms=st.sampled_from(THRESHOLDS_MS),
    ops=ops_strategy,
    chains=prefix_trees(),
)
def test_prefix_manager_tlru_cuts_what_the_forest_path_cut(
    pool: int,
    cpu: int,
    offload: bool,
    watermark: float,
    threshold_ms: float,
    ops: list[Op],
    chains: list[list[int]],
) -> None:
    cfg = prefix_config("tlru", pool, cpu, offload, watermark, tlru_threshold_ms=threshold_ms)
    assert_same(cfg, ops, chains)


@pytest.mark.parametrize("threshold_ms", [15.0, 60.0])
def test_seeded_streams_decide_through_the_suffix_tails(threshold_ms: float) -> None:
    """The streams above compare something: the fast run decides through `SuffixTails`, from its
    persistent lanes without a CPU tier, from fresh ones once the store has dropped KV (residency
    below δ); its persistent lanes hold every tail as it is now."""
    num_fresh = num_decisions = 0
    for seed in range(4):
        ops, chains = long_seeded_stream(seed)
        for cpu, offload in ((0, False), (2, True)):
            cfg = prefix_config(
                "tlru", 6 + 4 * (seed % 2), cpu, offload, 0.1, tlru_threshold_ms=threshold_ms
            )
            _, log, kv = run(cfg, None, ops, chains)
            suffix = kv.tails.suffix_tails
            assert suffix is not None and suffix.num_visits >= len(log)
            assert suffix.num_full == 0 or kv.cpu.residency_us < kv.estimator.delta_us
            num_fresh += suffix.num_full
            num_decisions += len(log)
            suffix.drain()
            for b in kv.tree.evictable.values():  # every tail indexed as it is now
                eid = b.entry.entry_id
                assert suffix.blocks[eid] is b
                for index in suffix.indexes.values():
                    assert index._where[eid][1] == (b.entry.last_used_us, eid)
            assert_same(cfg, ops, chains)
    assert num_fresh >= 10 and num_decisions >= 100


class _Pricing:
    """A prefix manager's pricing without a CPU tier: a restore is the block's recompute."""

    def __init__(self, est: GapEstimator) -> None:
        self.group_entries: dict[int, CacheEntry] = {}
        self.reload_block_us, self.offload_enabled, self.cpu_hash_bytes = 0.0, False, 0
        self.cpu = None
        self.estimator = est


class _Forest:
    """A prefix tree cut by T-LRU through the tail index and through the forest path."""

    def __init__(self, threshold_us: float) -> None:
        est = GapEstimator(0.3, 1e6, 1e6)
        self.policy: Any = make_policy(policy_config("tlru"), est)
        self.policy.threshold_us = threshold_us
        self.tree = PrefixTree()
        self.tails = TailIndex(self.tree, self.policy, _Pricing(est))  # type: ignore[arg-type]
        self.entries: dict[int, CacheEntry] = {}

    def add(self, h: int, parent: HashBlock | None, restore_us: float, now: int) -> HashBlock:
        """A block computed by a request that holds `parent` (and its prefix); idle after."""
        e = self.entries.get(h) or CacheEntry(h, h, 0, 0, 0, 1, 64, 0, now)
        e.last_used_us, e.recompute_us, self.entries[h] = now, restore_us, e
        b = HashBlock(h, parent, e)
        if parent is not None:
            self.tree.pin(parent)
        self.tree.add(b)
        self.tree.unpin(b)
        if parent is not None:
            self.tree.unpin(parent)
        return b

    def use(self, b: HashBlock, now: int) -> None:
        """A request reuses the chain up to b: pinned, used now, idle again."""
        chain = []
        while b is not None:
            chain.append(b)
            b = b.parent  # type: ignore[assignment]
        for x in reversed(chain):
            self.tree.pin(x)
        for x in chain:
            x.entry.last_used_us = now
            self.tree.unpin(x)

    def decide(self, num_blocks: int, now: int) -> list[int]:
        """Both paths on the current tree (the index's first); the victims, evicted."""
        got = self.tails.select(num_blocks, now, _recompute, allow_offload=False)
        forest = self.tree.forest()
        entries = [_recompute(b) for b in forest.blocks]
        picks = self.policy.select_victims(
            entries, num_blocks * 64, now, forest.chains, forest.parents
        )
        want = forest.cut_order(picks, "tlru")
        assert [b.hash_id for b in got] == [b.hash_id for b in want]
        for b in got:
            self.tree.evictable.pop(b.hash_id, None)
            self.tree.remove_gpu(b)
            self.tree.expose_parent(b)
        return [b.hash_id for b in got]


def _recompute(b: HashBlock) -> CacheEntry:
    b.entry.restore_us = b.entry.recompute_us
    return b.entry


# Decimal restores whose float sums depend on the order (0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1) and
# thresholds on their partial sums: the suffix sums must be the forest path's, bit for bit.
RESTORES = [0.1, 0.2, 0.3, 0.6, 0.7, 1.1]
THRESHOLDS_US = [0.0, 0.3, 0.6, 0.9, 1.2, 1.5, 2.1, 3.3]
Step = tuple[int, int, int, int]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    threshold_us=st.sampled_from(THRESHOLDS_US),
    parents=st.lists(st.integers(-1, 30), min_size=5, max_size=40),
    restores=st.lists(st.sampled_from(RESTORES), min_size=40, max_size=40),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(1, 6), st.integers(0, 3)),
        min_size=3,
        max_size=25,
    ),
)
def test_random_trees_are_cut_as_the_forest_path_cuts_them(
    threshold_us: float, parents: list[int], restores: list[float], steps: list[Step]
) -> None:
    """Blocks branch, are reused (re-keyed), cut and added again; last uses tie often."""
    tree = _Forest(threshold_us)
    blocks: dict[int, HashBlock] = {}
    for h, up in enumerate(parents):
        parent = blocks.get(up % max(h, 1)) if up >= 0 and h else None
        blocks[h] = tree.add(h, parent, restores[h], now=h // 4)
    next_hash = len(parents)
    for t, (kind, pick, num, lag) in enumerate(steps, start=100):
        live = [b for b in blocks.values() if tree.tree.blocks.get(b.hash_id) is b]
        if kind == 0 and live:  # a request reuses a prefix, some time ago
            tree.use(live[pick % len(live)], t - lag)
        elif kind == 1:  # a new block extends a cached one (or starts a chain)
            parent = live[pick % len(live)] if live and pick % 5 else None
            blocks[next_hash] = tree.add(next_hash, parent, restores[pick % 40], t - lag)
            next_hash += 1
        else:
            tree.decide(num, t)


def test_a_branch_reads_its_childrens_chains_summed_from_the_root() -> None:
    """p branches into chains [c1, c2, c3] and [d]: the forest sums the first from its root,
    0.1 + 0.2 + 0.3 = 0.6000000000000001 > 0.6, so p matters and the newer tail z goes first;
    summed from the tail (0.3 + 0.2 + 0.1 = 0.6) p would not, and would go before z."""
    tree = _Forest(threshold_us=0.6)
    p = tree.add(1, None, 0.0, now=5)
    c1 = tree.add(2, p, 0.1, now=3)
    c2 = tree.add(3, c1, 0.2, now=2)
    tree.add(4, c2, 0.3, now=1)
    tree.add(5, p, 0.0, now=4)
    tree.add(6, None, 0.0, now=6)  # z
    assert tree.decide(5, 10) == [4, 3, 2, 5, 6]
    assert tree.decide(1, 11) == [1]


def test_a_decision_pops_its_victims_whatever_the_tree_size() -> None:
    """Complexity, counted: 1,000 idle chains of 10 whose deeper suffixes matter; cutting 200
    blocks pops about 200 items, and the lanes hold the tails, not the 10^4 blocks. The next
    decision takes the blocks the first one left exposed (tails now: their restore alone)."""
    kv = make_kv(prefix_config("tlru", 10_100, 0, False, 0.0, tlru_threshold_ms=50.0))
    tree = kv.tree
    for c in range(1_000):
        parent = None
        for d in range(10):
            e = CacheEntry(c * 10 + d, c, 0, 0, 0, 512, kv.hash_bytes, 0, c * 10 + d)
            e.recompute_us = kv._block_recompute_us(d)
            b = HashBlock(c * 10 + d, parent, e)
            kv.pool.allocate(kv.hash_bytes)
            tree.add(b)
            if parent is not None:
                tree.unpin(parent)
            parent = b
        tree.unpin(parent)
    assert kv._evict_blocks(200, allow_offload=False) == 200
    suffix = kv.tails.suffix_tails
    assert suffix is not None and suffix.num_visits <= 200 + 2
    (index,) = suffix.indexes.values()
    assert len(index) <= 1_000 + 200  # tails, and the parents this decision exposed
    left = [b.hash_id for b in kv.tree.evictable.values() if b.hash_id % 10 != 9]
    assert 20 <= len(left) <= 100 and 6 in left  # chain 0 was cut to its 4th block, which matters
    assert kv._evict_blocks(10, allow_offload=False) == 10
    assert 6 not in kv.tree.blocks  # a tail now: its restore alone, the least recent in lane 0
    assert suffix.num_visits <= 200 + 10 + 4


def test_a_block_held_for_a_shared_tiers_write_hides_its_prefix_from_both_paths() -> None:
    """A cut block held on the GPU for a shared tier's write (pinned, still its parent's GPU
    child: `remote.py`) keeps its parent out of the forest and off the tails alike; when the
    write lands and the block goes, the parent is a tail for both."""
    forest = _Forest(threshold_us=0.25)
    tree = forest.tree
    root = forest.add(1, None, 0.1, now=1)
    held = forest.add(2, root, 0.2, now=2)
    forest.add(3, None, 0.3, now=3)
    tree.evictable.pop(2)
    tree.pin(held)
    held.tier = Tier.FLIGHT_OUT
    assert forest.decide(5, 10) == [3]
    held.tier = Tier.GPU  # the write landed: an idle tail for a moment, then dropped
    tree.unpin(held)
    tree.evictable.pop(2)
    tree.remove_gpu(held)
    tree.expose_parent(held)
    assert forest.decide(5, 11) == [1]
