"""perc_plus1 on prefix chains: the tail index (`components/kv/plus1_tails.py`) cuts exactly what
the forest path (`PercPlusOnePolicy.select_victims` over the candidate forest) cut.

The prefix manager runs random operation streams twice, once forced onto the forest path, with and
without a CPU tier (whose residency below δ makes the restore estimate move with idle time: those
decisions index every tail afresh), and with a shared tier that holds cut blocks for its writes
(those decisions take the forest path).
Random trees whose blocks share last uses, restores and gaps (so ratios and suffix costs tie, and
positions in `PrefixTree.forest()` decide) are cut by both paths on the same tree, decision after
decision, with blocks added, reused, re-grouped and cut between; the +1 suffix wins some decisions
and loses others. The operation count shows a decision keys its victims and the few tails that
could beat them, not every idle block.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.property.test_indexed_eviction as driver
from cachepilot_sim.components.kv import plus1_tails
from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.plus1_tails import PlusOneTails
from cachepilot_sim.components.kv.tails import TailIndex
from cachepilot_sim.config import policy_config
from cachepilot_sim.policies import CacheEntry, KeyScope, make_policy
from cachepilot_sim.policies.reuse import GapEstimator
from tests.conftest import make_kv
from tests.property.test_held_blocks import run_held, short_stream, short_trees
from tests.property.test_indexed_eviction import (
    Op,
    long_seeded_stream,
    ops_strategy,
    prefix_config,
    prefix_trees,
)


class Logged(driver.Logged):
    """`test_indexed_eviction.Logged` that also forwards perc_plus1's `chain_index` (not when
    forced onto the full path)."""

    def __init__(self, inner: Any, scope: KeyScope, full: bool = False) -> None:
        super().__init__(inner, scope, full)
        if not full:
            self.chain_index = inner.chain_index


def run(cfg: Any, full: bool, ops: list[Op], chains: list[list[int]], held: bool = False) -> Any:
    """`test_indexed_eviction.run` (or `test_held_blocks.run_held`) with `Logged` above."""
    with mock.patch.object(driver, "Logged", Logged):
        if held:
            return run_held(cfg, full, ops, chains)
        return driver.run(cfg, KeyScope.SET if full else None, ops, chains)


def assert_same(cfg: Any, ops: list[Op], chains: list[list[int]], held: bool = False) -> Any:
    fast_out, fast_log, fast = run(cfg, False, ops, chains, held)
    ref_out, ref_log, ref = run(cfg, True, ops, chains, held)
    assert fast.tails.plus1_tails is not None and ref.tails.plus1_tails is None
    assert fast_log == ref_log
    assert fast_out == ref_out
    assert vars(fast.stats) == vars(ref.stats)
    return fast


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 2, 4, 40]),
    offload=st.booleans(),
    watermark=st.sampled_from([0.0, 0.1]),
    ops=ops_strategy,
    chains=prefix_trees(),
)
def test_prefix_manager_plus1_cuts_what_the_forest_path_cut(
    pool: int,
    cpu: int,
    offload: bool,
    watermark: float,
    ops: list[Op],
    chains: list[list[int]],
) -> None:
    assert_same(prefix_config("perc_plus1", pool, cpu, offload, watermark), ops, chains)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=st.sampled_from([6, 10, 16]),
    cpu=st.sampled_from([0, 4]),
    offload=st.booleans(),
    ops=st.one_of(ops_strategy, st.integers(0, 2**32 - 1).map(lambda s: short_stream(s)[0])),
    seed=st.integers(0, 2**32 - 1),
)
def test_with_held_blocks_plus1_cuts_what_the_forest_path_cut(
    pool: int, cpu: int, offload: bool, ops: list[Op], seed: int
) -> None:
    chains = short_trees(np.random.default_rng(seed))
    assert_same(prefix_config("perc_plus1", pool, cpu, offload, 0.1), ops, chains, held=True)


def test_seeded_streams_decide_through_the_plus1_tails() -> None:
    """The streams compare something: decisions evict, most through the index (chained and
    one-block ones), some through a fresh index (the store's residency is below δ), some while
    a block is held (the forest path); every indexed tail sits at its stamp."""
    totals = dict(decisions=0, visits=0, fresh=0, singles=0, held=0)
    for seed in range(4):
        ops, chains = long_seeded_stream(seed)
        for cpu, offload in ((0, False), (2, True), (40, True)):
            cfg = prefix_config("perc_plus1", 6 + 4 * (seed % 2), cpu, offload, 0.1)
            kv = assert_same(cfg, ops, chains)
            tails = kv.tails.plus1_tails
            totals["decisions"] += len(kv.policy.log)
            totals["visits"] += tails.num_visits
            totals["fresh"] += tails.num_fresh
            assert tails.num_full == 0  # no block held: never the forest path
            totals["singles"] += tails.num_singles
            tails.drain()
            stamps = kv.tree.tail_stamps
            assert sorted(stamps) == sorted(kv.tree.evictable)
            assert [stamps[h] for h in kv.tree.evictable] == sorted(stamps.values())
            for h, b in kv.tree.evictable.items():
                assert tails.blocks[stamps[h]] is b
            for index in tails.indexes.values():
                assert len(index) == len(kv.tree.evictable)
        for seed_held in range(3):
            kv = assert_same(
                prefix_config("perc_plus1", 10, 0, seed_held % 2 == 0, 0.1),
                *short_stream(10 * seed + seed_held),
                held=True,
            )
            totals["held"] += kv.off_gpu.remote.num_held_decisions
            assert kv.tails.plus1_tails.num_full == kv.off_gpu.remote.num_held_decisions
    assert totals["decisions"] >= 300 and totals["visits"] >= 100, totals
    assert totals["singles"] >= 3 and totals["held"] >= 5 and totals["fresh"] >= 10, totals


class _Pricing:
    """A prefix manager's pricing without a CPU tier: a restore is the block's recompute; the
    gap EMAs are the groups' entries."""

    def __init__(self, est: GapEstimator) -> None:
        self.group_entries: dict[int, CacheEntry] = {}
        self.reload_block_us, self.offload_enabled, self.cpu_hash_bytes = 0.0, False, 0
        self.cpu = None
        self.estimator = est


class _Forest:
    """A prefix tree cut by perc_plus1 through the tail index and through the forest path."""

    def __init__(self, delta_us: float, population_gap_us: float) -> None:
        self.est = GapEstimator(0.3, population_gap_us, delta_us)
        self.policy: Any = make_policy(policy_config("perc_plus1"), self.est)
        self.tree = PrefixTree()
        self.pricing = _Pricing(self.est)
        self.tails = TailIndex(self.tree, self.policy, self.pricing)  # type: ignore[arg-type]
        assert self.tails.plus1_tails is not None
        self.entries: dict[int, CacheEntry] = {}
        self.num_suffix = self.num_greedy = 0

    def add(
        self, h: int, parent: HashBlock | None, restore_us: float, group: int, now: int
    ) -> HashBlock:
        """A block computed by a request that holds `parent` (and its prefix); idle after."""
        e = self.entries.get(h) or CacheEntry(h, group, 0, 0, 0, 1, 64, 0, now)
        e.last_used_us, e.recompute_us, e.session_id, self.entries[h] = now, restore_us, group, e
        b = HashBlock(h, parent, e)
        chain = []
        up = parent
        while up is not None:
            chain.append(up)
            up = up.parent
        for x in reversed(chain):
            self.tree.pin(x)
        self.tree.add(b)
        self.tree.unpin(b)
        for x in chain:
            self.tree.unpin(x)
        return b

    def use(self, b: HashBlock, now: int) -> None:
        """A request reuses the chain up to b: pinned, used now, idle again (deepest first)."""
        chain = []
        up: HashBlock | None = b
        while up is not None:
            chain.append(up)
            up = up.parent
        for x in reversed(chain):
            self.tree.pin(x)
        for x in chain:
            x.entry.last_used_us = now
            self.tree.unpin(x)

    def regroup(self, group: int, gap_us: float) -> None:
        """The group's gap EMA moves (a session returned)."""
        g = self.pricing.group_entries.setdefault(
            group, CacheEntry(-1 - group, group, 0, 0, 0, 0, 0, 0, 0)
        )
        g.gap_ema_us = gap_us
        self.tails.regroup(group)

    def prepare(self, b: HashBlock) -> CacheEntry:
        e = b.entry
        g = self.pricing.group_entries.get(e.session_id)
        e.restore_us, e.gap_ema_us = e.recompute_us, (g.gap_ema_us if g is not None else -1.0)
        return e

    def decide(self, num_blocks: int, now: int) -> list[int]:
        """Both paths on the current tree (the index's first); the victims, evicted."""
        plus1 = self.tails.plus1_tails
        assert plus1 is not None
        suffix = plus1.num_suffix
        got = self.tails.select(num_blocks, now, self.prepare, allow_offload=False)
        forest = self.tree.forest()
        entries = [self.prepare(b) for b in forest.blocks]
        picks = self.policy.select_victims(
            entries, num_blocks * 64, now, forest.chains, forest.parents
        )
        want = forest.cut_order(picks, "perc_plus1")
        assert [b.hash_id for b in got] == [b.hash_id for b in want]
        self.num_suffix += plus1.num_suffix - suffix
        self.num_greedy += plus1.num_suffix == suffix
        for b in got:
            self.tree.evictable.pop(b.hash_id, None)
            self.tree.remove_gpu(b)
            self.tree.expose_parent(b)
        return [b.hash_id for b in got]


# Few distinct values: ratios, costs and suffix sums tie often (decimal restores also make float
# sums depend on their order), so positions decide.
RESTORES = [0.1, 0.2, 0.3, 0.7, 5.0, 40.0]
GAPS = [-1.0, 2.0, 30.0, 1e6]
Step = tuple[int, int, int, int]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    delta_us=st.sampled_from([5.0, 1e4]),
    population_gap_us=st.sampled_from([3.0, 1e5]),
    parents=st.lists(st.integers(-1, 30), min_size=5, max_size=40),
    restores=st.lists(st.sampled_from(RESTORES), min_size=40, max_size=40),
    steps=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 60), st.integers(1, 7), st.integers(0, 3)),
        min_size=3,
        max_size=25,
    ),
    scan=st.booleans(),
)
def test_random_trees_are_cut_as_the_forest_path_cuts_them(
    delta_us: float,
    population_gap_us: float,
    parents: list[int],
    restores: list[float],
    steps: list[Step],
    scan: bool,
) -> None:
    """Blocks branch, are reused (re-keyed), re-grouped, cut and added again; last uses tie.
    `scan`: the +1 step pops nothing past greedy's tails and keys the rest directly."""
    with mock.patch.multiple(plus1_tails, _POP_BUDGET=0 if scan else 32, _DIRECT_PER_POP=10**9):
        _cut_random_tree(delta_us, population_gap_us, parents, restores, steps)


def _cut_random_tree(
    delta_us: float,
    population_gap_us: float,
    parents: list[int],
    restores: list[float],
    steps: list[Step],
) -> None:
    tree = _Forest(delta_us, population_gap_us)
    blocks: dict[int, HashBlock] = {}
    for h, up in enumerate(parents):
        parent = blocks.get(up % max(h, 1)) if up >= 0 and h else None
        blocks[h] = tree.add(h, parent, restores[h], h % 3, now=h // 8)
    next_hash = len(parents)
    for t, (kind, pick, num, lag) in enumerate(steps, start=10):
        live = [b for b in blocks.values() if tree.tree.blocks.get(b.hash_id) is b]
        if kind == 0 and live:  # a request reuses a prefix, some time ago
            tree.use(live[pick % len(live)], t - lag)
        elif kind == 1:  # a new block extends a cached one (or starts a chain)
            parent = live[pick % len(live)] if live and pick % 5 else None
            restore = restores[pick % 40]
            blocks[next_hash] = tree.add(next_hash, parent, restore, pick % 3, t - lag)
            next_hash += 1
        elif kind == 2:
            tree.regroup(pick % 3, GAPS[lag])
        else:
            tree.decide(num, t)


def test_random_trees_see_the_suffix_win_and_lose() -> None:
    """The trees above reach both outcomes of the +1 step, and one-block forests."""
    rng = np.random.default_rng(7)
    num_singles = 0
    totals = [0, 0]
    for _ in range(300):
        tree = _Forest(float(rng.choice([5.0, 1e4])), float(rng.choice([3.0, 1e5])))
        blocks: list[HashBlock] = []
        for h in range(int(rng.integers(5, 30))):
            parent = (
                blocks[int(rng.integers(len(blocks)))] if blocks and rng.random() < 0.8 else None
            )
            restore = float(rng.choice(RESTORES))
            blocks.append(tree.add(h, parent, restore, int(rng.integers(3)), int(rng.integers(4))))
        for t in range(10, 16):
            if tree.tree.evictable:
                tree.decide(int(rng.integers(1, 6)), t)
        plus1 = tree.tails.plus1_tails
        assert plus1 is not None
        num_singles += plus1.num_singles
        totals[0] += tree.num_suffix
        totals[1] += tree.num_greedy
    assert totals[0] >= 20 and totals[1] >= 100 and num_singles >= 20, (totals, num_singles)


def test_a_tie_goes_to_the_chain_listed_first() -> None:
    """Tails of equal ratio go in the order they became tails (the forest's order of leaf
    chains); a block exposed by a cut keeps its chain's place."""
    tree = _Forest(1e4, 1e5)
    root = tree.add(1, None, 0.3, 0, now=1)
    tree.add(2, root, 0.3, 0, now=1)  # a tail
    tree.add(3, root, 0.3, 0, now=1)  # a later tail, same ratio
    tree.add(4, None, 0.3, 0, now=1)  # later still
    assert tree.decide(1, 5) == [2]
    assert tree.decide(2, 5) == [3, 1]  # 3 ties 4 and goes first; its parent then ties 4 too


def _load_chains(kv: Any, idle_us: list[int], length: int) -> None:
    """Idle chains of `length` blocks on `kv`'s tree, chain c last used `idle_us[c]` ago."""
    tree, now = kv.tree, int(kv.env.now)
    for c, idle in enumerate(idle_us):
        parent = None
        for d in range(length):
            h = c * length + d
            e = CacheEntry(h, c, 0, 0, 0, 512, kv.hash_bytes, 0, now - idle)
            e.recompute_us = kv._block_recompute_us(d)
            b = HashBlock(h, parent, e)
            kv.pool.allocate(kv.hash_bytes)
            tree.add(b)
            if parent is not None:
                tree.unpin(parent)
            parent = b
        tree.unpin(parent)


def test_a_decision_keys_its_victims_and_the_tails_that_could_beat_them() -> None:
    """Complexity, counted: 400 idle chains of 25 blocks (10^4 idle blocks) whose idle times
    spread over 20 decades, in shuffled order. A decision pops the cheapest tails from the index
    until one costs more than greedy's set, and keys their chains' suffixes: three decisions (5, 5
    and 20 blocks) pop 54 tails and key 373 blocks (the index's own 106 keys included), where the
    forest path keys 3 x 10^4."""
    kv = make_kv(prefix_config("perc_plus1", 10_100, 0, False, 0.0))
    kv.env.run(until=10**27)
    rng = np.random.default_rng(3)
    idle = [int(1e6 * 10 ** (c / 20)) for c in rng.permutation(400)]
    _load_chains(kv, idle, 25)
    assert kv.tree.num_idle_gpu_blocks == 10_000
    plus1 = kv.tails.plus1_tails
    assert isinstance(plus1, PlusOneTails)
    for num in (5, 5, 20):  # each checked against the forest path
        forest = kv.tree.forest()
        entries = [kv._prepare(b, int(kv.env.now), False) for b in forest.blocks]
        picks = kv.policy.select_victims(
            entries, num * kv.hash_bytes, int(kv.env.now), forest.chains, forest.parents
        )
        want = forest.cut_order(picks, "perc_plus1")
        assert kv._evict_blocks(num, allow_offload=False) == num
        assert not any(b.hash_id in kv.tree.blocks for b in want)
    (index,) = plus1.indexes.values()
    keyed = index.num_keyed + index.index.num_keyed
    assert plus1.num_visits <= 80 and keyed <= 1_000, (plus1.num_visits, keyed)
    assert plus1.num_full == 0 and plus1.num_singles == 0


def test_every_tail_costing_about_the_same_is_the_plus1_steps_worst_case() -> None:
    """What the bound cannot prune, counted: 400 chains idle equally long cost the same per
    depth, so every tail is within greedy's cost and the +1 step prices each one's suffix (up to
    k blocks): O(tails x k) keys, not every idle block when chains are longer than k. Past a
    budget of pops it keys the remaining tails directly (a pop costs tens of keys)."""
    kv = make_kv(prefix_config("perc_plus1", 10_100, 0, False, 0.0))
    kv.env.run(until=10**12)
    _load_chains(kv, [10**9] * 400, 25)
    plus1 = kv.tails.plus1_tails
    assert isinstance(plus1, PlusOneTails)
    assert kv._evict_blocks(5, allow_offload=False) == 5
    (index,) = plus1.indexes.values()
    assert plus1.num_visits <= 6 + 32 + 400 // 16  # greedy's, then the +1 step's budget
    assert plus1.num_visits + plus1.num_direct >= 400  # every tail, the rest keyed directly
    assert 400 <= index.num_keyed <= 400 * 5 + 10


def test_equal_suffixes_go_to_the_chain_listed_first() -> None:
    """k = 3: greedy takes X's tail (tied with A's, listed first), then A's tail and the block
    above it (0.75 in all); A's and B's 3-block suffixes both cost 0.625 (restores that are powers
    of two: the products and sums are exact), so the +1 step wins, with B's, listed before A's
    though its tail is dearer (the walk prices A's first)."""
    tree = _Forest(1e4, 1e5)
    x = tree.add(1, None, 64.0, 0, now=1)
    tree.add(2, x, 0.25, 0, now=1)
    b = tree.add(10, None, 0.0625, 0, now=1)
    b = tree.add(11, b, 0.0625, 0, now=1)
    tree.add(12, b, 0.5, 0, now=1)
    a = tree.add(20, None, 0.125, 0, now=1)
    a = tree.add(21, a, 0.25, 0, now=1)
    tree.add(22, a, 0.25, 0, now=1)
    assert tree.decide(3, 5) == [12, 11, 10]
    assert tree.num_suffix == 1
