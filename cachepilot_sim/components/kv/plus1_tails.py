"""perc_plus1's chained decisions without the candidate forest: greedy by PERC's ratio over an
index of the tails, and the +1 suffix found best-first.

On the forest path (`PercPlusOnePolicy.select_victims`) a decision for k blocks (prefix blocks are
one size, so the need is k blocks) runs greedy by ratio over the current tails, ties by position
in `PrefixTree.forest()`, and then prices, for every leaf chain (no chain below it) of at least k
blocks, its k deepest blocks; the cheapest of those suffixes (the first in forest order among
equals) replaces greedy's set when strictly cheaper. With only one-block chains and no branch
chains it runs `greedy_plus_one` instead: the k - 1 first tails by (ratio, position) and the
cheapest (cost, position) tail of the rest.

Positions. `forest()` lists the leaf chains in the order of `PrefixTree.evictable` (the order in
which their tails became tails: `PrefixTree.tail_stamps`), then the branch chains, each in the
order of its last child chain; chains are contiguous, so two tails compare by their chains' order.
A decision's tails therefore compare by chain key: (0, stamp) for a leaf chain, (1, key of its
last child chain) for a branch chain, whose children this decision's own cuts have all cut.

Greedy: the tails of one restore regime sit in the policy's `chain_index()` (`PercIndex` by
ratio, stamps as ids, `policies/plus1_chains.py`), fed by `PrefixTree.changed` (`HeldFallback`)
and re-keyed when their group's gap EMA moves; a parent that this decision's cuts expose waits in
a local heap by (ratio, chain key). The +1 step walks the tails in ratio order from the index
(greedy's own tail victims first): a suffix costs at least its tail's cost, so the walk stops at
the first tail whose ratio exceeds the best candidate's cost over the size (greedy's cost before
any suffix beats it): for c <= t, fl(c / s) <= fl(t / s). A tail walked keys its chain's k - 1
blocks above it (stopping where the chain ends, or the sum passes the bound by more than its
rounding), summed with the same `math.fsum`. Past a budget of pops the walk keys the remaining
tails directly instead (a pop costs tens of keys) and takes those within the bound in (cost,
position) order. Popped tails go back after the decision.

Cost: greedy's k pops, plus the +1 walk over the tails whose own cost is at most greedy's set's,
each keying up to k blocks: few where costs spread over orders of magnitude, every tail where
all cost about the same (O(tails x k) keys then; `tests/property/test_plus1_chains.py` counts
both, `experiments/bench_eviction.md` times both). Where the restore
estimate moves with idle time (a CPU store whose residency is below δ) the decision indexes
every current tail afresh, prepared now (O(t log t) in t tails, not blocks; `num_fresh`). While
a shared tier holds a block on the GPU for its write, a decision takes the forest path
(`HeldFallback`, `num_full`): the idle blocks above a held one are not the forest's, and whether
the forest has only one-block chains (`num_idle_gpu_blocks` against the tails) no longer says
which rule the forest path runs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.kv.set_tails import HeldFallback
from cachepilot_sim.components.kv.suffix_tails import ExposedParent, RestoreRegimes
from cachepilot_sim.policies import CacheEntry, EvictionPolicy
from cachepilot_sim.policies.plus1_chains import PlusOneChainIndex, ratio_of

# A suffix walk stops once its plain running sum exceeds the bound by this factor: far above the
# rounding of a sum of non-negative terms (below 1e-10 relative for a million of them).
_SLACK = 1e-9
# The +1 walk pops at most this many tails plus the tails / `_DIRECT_PER_POP` from the index;
# beyond that it keys the rest directly (a pop costs tens of keys).
_POP_BUDGET = 32
_DIRECT_PER_POP = 16
ChainKey = tuple[Any, ...]  # (0, stamp) for a leaf chain, (1, last child's key) for a branch
Popped = tuple[float, int, HashBlock, float]  # a tail from the index: (ratio, stamp, block, cost)
Restore = Callable[[HashBlock], tuple[float, float]]  # block -> (restore, gap EMA) of the decision


class PlusOneTails(HeldFallback):
    """The idle tails of `tree` for perc_plus1's chained decisions (see the module docstring)."""

    def __init__(
        self,
        tree: PrefixTree,
        make_index: Callable[[], PlusOneChainIndex],
        regimes: RestoreRegimes,
        exposed_parent: ExposedParent,
        policy: EvictionPolicy,
    ) -> None:
        super().__init__(tree, exposed_parent, policy)  # blocks: the tails, by stamp
        self.make_index = make_index
        self.regimes = regimes
        self.indexes: dict[bool, PlusOneChainIndex] = {}  # restore regime -> index, on use
        self.stamp_of: dict[int, int] = {}  # hash id -> stamp it is indexed at
        self.groups: dict[int, dict[int, None]] = {}  # group -> hash ids indexed with its gap
        self.group_of: dict[int, int] = {}  # hash id -> its group when indexed
        self.dirty: dict[int, None] = {}  # groups whose gap EMA moved since
        self.num_visits = 0  # tails popped by decisions (a complexity probe for tests)
        self.num_singles = 0  # decisions over one-block chains (`greedy_plus_one`)
        self.num_suffix = 0  # chained decisions that the +1 suffix won
        self.num_fresh = 0  # decisions whose estimates move with idle time (a fresh index)
        self.num_direct = 0  # tails the +1 step keyed directly past its pops (a complexity probe)
        stamps = tree.tail_stamps = {}  # the tree stamps each block as it becomes a tail
        for b in tree.evictable.values():
            tree.tail_stamp(b)
        for b in tree.evictable.values():
            self._put(b)
        assert len(stamps) == len(tree.evictable)

    # -- the tails, kept current ----------------------------------------------------------
    def update(
        self, hash_id: int, entry_id: int, cur: HashBlock | None, idle: bool, tail: bool
    ) -> None:
        """A tail is (re)indexed at its stamp; a block that is not one is dropped."""
        if tail:
            assert cur is not None
            self._put(cur)
        else:
            self._drop(hash_id)
            stamps = self.tree.tail_stamps
            assert stamps is not None
            stamps.pop(hash_id, None)

    def regroup(self, group: int) -> None:
        """`group`'s gap EMA moved: its indexed tails are re-keyed at the next decision."""
        self.dirty[group] = None

    def drain(self) -> None:
        """`HeldFallback.drain`, then the tails of groups whose gap EMA moved are re-keyed."""
        super().drain()
        for group in self.dirty:
            for h in list(self.groups.get(group, ())):
                self._put(self.blocks[self.stamp_of[h]])
        self.dirty.clear()

    def _put(self, b: HashBlock) -> None:
        stamps = self.tree.tail_stamps
        assert stamps is not None
        h, stamp = b.hash_id, stamps[b.hash_id]
        old = self.stamp_of.get(h)
        if old is not None and old != stamp:
            self._drop(h)
        self.stamp_of[h] = stamp
        self.blocks[stamp] = b
        for offload, index in self.indexes.items():
            index.add(stamp, b.entry, *self.regimes.static_restore(b, offload))
        group, was = b.entry.session_id, self.group_of.get(h)
        if was != group:
            if was is not None:
                self.groups[was].pop(h, None)
            self.groups.setdefault(group, {})[h] = None
            self.group_of[h] = group

    def _drop(self, hash_id: int) -> None:
        stamp = self.stamp_of.pop(hash_id, None)
        if stamp is None:
            return
        for index in self.indexes.values():
            index.discard(stamp)
        del self.blocks[stamp]
        group = self.group_of.pop(hash_id)
        self.groups[group].pop(hash_id, None)

    def _index(self, offload: bool) -> PlusOneChainIndex:
        """The regime's index, built from every tail at its first use."""
        index = self.indexes.get(offload)
        if index is None:
            index = self.indexes[offload] = self.make_index()
            for stamp, b in self.blocks.items():
                index.add(stamp, b.entry, *self.regimes.static_restore(b, offload))
        return index

    # -- decisions --------------------------------------------------------------------------
    def select(
        self,
        num_blocks: int,
        now_us: int,
        prepare: Callable[[HashBlock], CacheEntry],
        allow_offload: bool | None,
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path cuts them; each victim is passed
        through `prepare` before anything is evicted."""
        self.drain()
        tree = self.tree
        if num_blocks <= 0 or not tree.evictable:
            return []
        if self.held:
            return self.forest_path(num_blocks, now_us, prepare)
        mode = None if allow_offload is None else self.regimes.restore_mode(allow_offload)
        if mode is None:  # the decision's estimates: every tail prepared, in a fresh index
            self.num_fresh += 1
            restore: Restore = _prepared(prepare)
            index = self.make_index()
            index.advance(now_us)
            for stamp, b in self.blocks.items():
                index.add(stamp, b.entry, *restore(b))
        else:
            regimes, offload = self.regimes, mode
            restore = lambda b: regimes.static_restore(b, offload)  # noqa: E731
            index = self._index(mode)
        decision = _Decision(self, index, restore, num_blocks, now_us)
        if tree.num_idle_gpu_blocks == len(tree.evictable):  # every chain one tail, no branch
            self.num_singles += 1
            victims = decision.singles()
        else:
            victims = decision.chained()
        for b in victims:  # the index's estimates are the manager's now, or it is not exact
            e = prepare(b)
            assert mode is None or (e.restore_us, e.gap_ema_us) == restore(b)
        return victims


class _Decision:
    """One decision of `PlusOneTails` at a fixed time, `restore` giving each block's (restore,
    gap EMA) as the decision's `prepare` would."""

    def __init__(
        self, owner: PlusOneTails, index: PlusOneChainIndex, restore: Restore, k: int, now_us: int
    ) -> None:
        self.owner, self.index, self.restore_of, self.k, self.now = owner, index, restore, k, now_us
        self.popped: list[int] = []  # stamps taken from the index, in its order

    def cost(self, b: HashBlock) -> float:
        """Block `b`'s expected restore cost at this decision, as the forest path computes it."""
        return self.index.cost(b.entry, *self.restore_of(b), self.now)

    def pop(self) -> Popped | None:
        """The index's next tail: (ratio, stamp, block, cost), kept to go back after the
        decision."""
        stamp = self.index.pop_min(self.now)
        if stamp is None:
            return None
        self.owner.num_visits += 1
        self.popped.append(stamp)
        b = self.owner.blocks[stamp]
        cost = self.cost(b)
        return ratio_of(cost, b.entry), stamp, b, cost

    def restore(self, victims: list[HashBlock]) -> None:
        """Put back every popped tail that is not a victim."""
        gone = {b.hash_id for b in victims}
        blocks = self.owner.blocks
        for stamp in self.popped:
            b = blocks[stamp]
            if b.hash_id not in gone:
                self.index.add(stamp, b.entry, *self.restore_of(b))

    def singles(self) -> list[HashBlock]:
        """`greedy_plus_one` over one-block chains: the k - 1 first by (ratio, position), then the
        cheapest (cost, position) of the rest (it has the smallest ratio of the rest: among the
        tails of that ratio)."""
        blocks = self.owner.blocks
        if len(blocks) < self.k:  # every tail, in position order
            return [blocks[s] for s in sorted(blocks)]
        victims: list[HashBlock] = []
        for _ in range(self.k - 1):
            got = self.pop()
            assert got is not None
            victims.append(got[2])
        first = self.pop()
        assert first is not None
        group = [first]
        while True:  # the rest's tails of the smallest ratio: one holds the smallest cost
            got = self.pop()
            if got is None:
                break
            if got[0] != first[0]:
                break  # a larger ratio: it goes back with the others
            group.append(got)
        cheapest = min(group, key=lambda g: (g[3], g[1]))
        victims.append(cheapest[2])
        self.restore(victims)
        return victims

    def chained(self) -> list[HashBlock]:
        """`_plus_one_on_chains`: greedy by (ratio, chain key), then the +1 suffix."""
        owner = self.owner
        local: list[tuple[float, ChainKey, int, HashBlock, float]] = []  # exposed by our cuts
        below: dict[int, ChainKey] = {}  # branch block -> largest key of its chains cut so far
        cut_children: dict[int, int] = {}
        victims: list[HashBlock] = []
        costs: list[float] = []
        tails: list[Popped] = []  # greedy's victims popped from the index
        head = self.pop()
        while len(victims) < self.k:
            if local and (head is None or (local[0][0], local[0][1]) < (head[0], (0, head[1]))):
                _, key, _, b, cost = heapq.heappop(local)
            elif head is not None:
                tails.append(head)
                b, key, cost = head[2], (0, head[1]), head[3]
                head = self.pop()
            else:
                break
            victims.append(b)
            costs.append(cost)
            p = b.parent
            if p is not None and p.num_children > 1:  # b roots its chain: the chain is whole
                below[p.hash_id] = max(below.get(p.hash_id, key), key)
            p = owner.exposed_parent(b, cut_children)
            if p is not None:
                up = key if p.num_children == 1 else (1, below.pop(p.hash_id))
                cost = self.cost(p)
                heapq.heappush(local, (ratio_of(cost, p.entry), up, len(victims), p, cost))
        if head is not None:  # popped but not cut: it goes back with the others
            tails.append(head)
        if len(victims) == self.k:
            suffix = self.plus_one(math.fsum(costs), tails)
            if suffix is not None:
                victims = suffix
                self.owner.num_suffix += 1
        self.restore(victims)
        return victims

    def plus_one(self, greedy_cost: float, tails: list[Popped]) -> list[HashBlock] | None:
        """The cheapest k-block suffix of a leaf chain (first in position among equals), when it
        costs strictly less than `greedy_cost`; None otherwise. Walks the tails in ratio order:
        greedy's popped ones, then the index's, and past a budget of pops every other tail
        keyed directly (`_scan`)."""
        best = _Best(greedy_cost)
        size = max(tails[0][2].entry.num_bytes, 1) if tails else 1
        pending = list(reversed(tails))
        budget = _POP_BUDGET + len(self.owner.blocks) // _DIRECT_PER_POP
        while True:
            got: Popped | None
            if pending:
                got = pending.pop()
            elif budget > 0:
                budget -= 1
                got = self.pop()
            else:
                self._scan(best)
                break
            if got is None or got[0] > best.bound / size:
                break  # this tail alone, and every later one, costs more than the bound
            self._consider(got[2], got[1], got[3], best)
        return best.blocks

    def _scan(self, best: _Best) -> None:
        """The tails not popped yet, keyed one by one (many tails cost about what greedy's set
        costs: cheaper than popping each), walked in (cost, position) order."""
        taken = set(self.popped)
        rest: list[tuple[float, int]] = []
        blocks = self.owner.blocks
        for stamp, b in blocks.items():
            if stamp not in taken:
                self.owner.num_direct += 1
                cost = self.cost(b)
                if cost <= best.bound:
                    rest.append((cost, stamp))
        rest.sort()
        for cost, stamp in rest:
            if cost > best.bound:
                break
            self._consider(blocks[stamp], stamp, cost, best)

    def _consider(self, tail: HashBlock, stamp: int, tail_cost: float, best: _Best) -> None:
        """Price the k-block suffix of `tail`'s chain against the best so far."""
        chain = self.suffix(tail, tail_cost, best.bound)
        if chain is not None:
            cost = math.fsum(chain[1])
            if cost < best.greedy_cost and (best.blocks is None or (cost, stamp) < best.key):
                best.key, best.bound, best.blocks = (cost, stamp), cost, chain[0]

    def suffix(
        self, tail: HashBlock, tail_cost: float, bound: float
    ) -> tuple[list[HashBlock], list[float]] | None:
        """The k deepest blocks of `tail`'s chain and their costs, tail first; None when the chain
        is shorter or they surely cost more than `bound`."""
        limit = bound * (1.0 + _SLACK)
        blocks, costs = [tail], [tail_cost]
        total = costs[0]
        b = tail
        while len(blocks) < self.k and total <= limit:
            p = b.parent
            if p is None or p.refcount or p.num_children != 1 or p.tier != Tier.GPU:
                return None  # the forest's chain ends below p
            blocks.append(p)
            costs.append(self.cost(p))
            total += costs[-1]
            b = p
        return (blocks, costs) if len(blocks) == self.k and total <= limit else None


class _Best:
    """The +1 step's best suffix so far: a candidate must cost at most `bound` (ties go by
    position) and strictly less than greedy's set."""

    __slots__ = ("greedy_cost", "bound", "key", "blocks")

    def __init__(self, greedy_cost: float) -> None:
        self.greedy_cost = greedy_cost
        self.bound = greedy_cost
        self.key: tuple[float, int] = (math.inf, -1)  # (cost, stamp)
        self.blocks: list[HashBlock] | None = None


def _prepared(prepare: Callable[[HashBlock], CacheEntry]) -> Restore:
    """(restore, gap EMA) of a block as the decision's `prepare` gives them."""

    def restore(b: HashBlock) -> tuple[float, float]:
        e = prepare(b)
        return e.restore_us, e.gap_ema_us

    return restore
